"""``shell.passEnv``: credentials a user chooses to give the shell tool (``SSH_AUTH_SOCK`` for
``git push`` over ssh-agent, ``GH_TOKEN`` for ``gh``). The user config alone may name them; the
shell sees them, `/status` names them (never their values), and without the setting they stay
stripped. Real ``kiso -p`` processes running a real shell command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiso.kernel import ExecutionFinished, JsonlSessionStore
from kiso.runtime.config import ConfigError, load_config
from tests.cli.test_repl import ENTER, Term, chat

BIN = Path(sys.executable).parent / "kiso"
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_FAUX_SCRIPT", "KISO_MODEL")
SECRET = "ghp_passEnvTestValue42"
SOCK = "/tmp/ssh-agent-test.sock"
COMMAND = 'echo "token=[$GH_TOKEN] sock=[$SSH_AUTH_SOCK] other=[$OTHER_TOKEN]"'


def write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def shell_output(tmp_path: Path, config: dict[str, object] | None, sid: str) -> str:
    """What the shell tool printed, run by a real ``kiso -p`` with the credentials in its env."""
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    if config is not None:
        write(home / "config.json", config)
    script = write(
        tmp_path / f"{sid}.json",
        {
            "turns": [
                {"tool_calls": [{"name": "shell", "input": {"command": COMMAND}}]},
                {"text": "done"},
            ]
        },
    )
    base = {k: v for k, v in os.environ.items() if k not in KEYS}
    out = subprocess.run(
        [str(BIN), "-p", "show", sid, "--mode", "bypass"],
        cwd=ws,
        env={
            **base,
            "KISO_HOME": str(home),
            "KISO_FAUX_SCRIPT": str(script),
            "GH_TOKEN": SECRET,
            "SSH_AUTH_SOCK": SOCK,
            "OTHER_TOKEN": "not-passed",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    events = JsonlSessionStore(home).load(sid).events
    (finished,) = [e for e in events if isinstance(e, ExecutionFinished)]
    return finished.content


def test_pass_env_gives_the_named_credentials_to_the_shell_and_no_others(tmp_path: Path) -> None:
    config = {"shell": {"passEnv": ["SSH_AUTH_SOCK", "GH_TOKEN"]}}
    said = shell_output(tmp_path, config, "with")
    assert f"token=[{SECRET}]" in said and f"sock=[{SOCK}]" in said
    assert "other=[]" in said  # a credential not named stays stripped


def test_without_pass_env_the_credentials_are_stripped(tmp_path: Path) -> None:
    said = shell_output(tmp_path, None, "without")
    assert "token=[]" in said and "sock=[]" in said and "other=[]" in said
    assert SECRET not in said


def test_a_project_config_may_not_pass_credentials(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    project = write(ws / ".kiso" / "config.json", {"shell": {"passEnv": ["GH_TOKEN"]}})
    with pytest.raises(ConfigError) as info:
        load_config(home, ws)
    said = str(info.value)
    assert str(project) in said and "'shell'" in said and "only your user config" in said


def test_pass_env_is_read_from_the_user_config(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(home / "config.json", {"shell": {"passEnv": ["GH_TOKEN", "SSH_AUTH_SOCK", "GH_TOKEN"]}})
    assert load_config(home).pass_env == ("GH_TOKEN", "SSH_AUTH_SOCK")
    write(home / "config.json", {})
    assert load_config(home).pass_env == ()


@pytest.mark.parametrize(
    ("shell", "expected"),
    [
        ({"passEnv": ["GH-TOKEN"]}, 'shell.passEnv: "GH-TOKEN" is not an environment variable'),
        ({"passEnv": ["1TOKEN"]}, 'shell.passEnv: "1TOKEN" is not an environment variable'),
        ({"passEnv": ["GH_TOKEN=abc"]}, "is not an environment variable name"),
        ({"passEnv": [""]}, 'shell.passEnv: "" is not an environment variable'),
        ({"passEnv": [7]}, "shell.passEnv: 7 is not an environment variable"),
        ({"passEnv": "GH_TOKEN"}, "shell.passEnv: must be a list of environment variable names"),
        ({"passenv": ["GH_TOKEN"]}, "shell.passenv: unknown key; known keys: passEnv"),
        (["GH_TOKEN"], "shell: must be an object"),
    ],
)
def test_a_bad_pass_env_is_one_clear_error(tmp_path: Path, shell: object, expected: str) -> None:
    home = tmp_path / "home"
    user = write(home / "config.json", {"shell": shell})
    with pytest.raises(ConfigError) as info:
        load_config(home)
    assert str(info.value).startswith(f"{user}: ") and expected in str(info.value)


def test_status_names_the_passed_variables_never_their_values(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    write(home / "config.json", {"shell": {"passEnv": ["GH_TOKEN", "SSH_AUTH_SOCK"]}})
    script = write(tmp_path / "script.json", {"turns": [{"text": "hi"}]})
    term = Term(
        chat("st", "default"), cwd=ws, home=home, script=script, GH_TOKEN=SECRET, SSH_AUTH_SOCK=SOCK
    )
    try:
        term.wait_for("▸ default")
        term.send("/status" + ENTER)
        term.wait_for("shell env  passes GH_TOKEN, SSH_AUTH_SOCK (shell.passEnv; values not shown)")
        assert SECRET not in term.text and SOCK not in term.text
        term.send("/exit" + ENTER)
        assert term.exit_status() == 0
    finally:
        term.close()
