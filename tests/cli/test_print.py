"""`kiso -p`: model selection end to end, keyless mode, approvals nobody can answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.providers.sse import SSEServer
from tests.providers.test_openai_compat import text_reply

BIN = Path(sys.executable).parent / "kiso"
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_FAUX_SCRIPT", "KISO_MODEL")


def kiso(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in KEYS}
    return subprocess.run(
        [str(BIN), *args],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,  # a prompt with a piped stdin would read it
    )


def test_keyless_mode_runs_its_script_then_says_to_set_a_key(tmp_path: Path) -> None:
    first = kiso(tmp_path, "-p", "hello", "k")
    assert first.returncode == 1  # the demo, then a non-zero exit: that exit is the design
    # stdout is the last thing the model said; what it said before its tool calls is stderr
    assert first.stdout.startswith("That is the whole script") and "keyless mode" in first.stderr
    assert "keyless mode" not in first.stdout
    assert "faux (keyless script)" in first.stderr
    assert "Set an API key" in first.stderr
    assert "denied shell" in first.stderr  # nobody to ask in print mode


def test_environment_keys_alone_select_a_model(tmp_path: Path) -> None:
    with SSEServer([text_reply("Paris", ".")]) as server:
        out = kiso(
            tmp_path,
            "-p",
            "capital of France?",
            OPENAI_API_KEY="sk-env",
            ANTHROPIC_API_KEY="sk-ant",
            OPENAI_BASE_URL=server.url + "/v1",
            OPENAI_MODEL="gpt-test",
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Paris."
    assert server.requests[0].credential == "sk-env"  # both set: OpenAI wins
    assert server.requests[0].json["model"] == "gpt-test"


def test_model_flag_picks_a_profile_over_config_and_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with SSEServer([text_reply("from the flag")]) as server:
        home.mkdir()
        profiles = {
            "a": {"kind": "openai-compat", "model": "model-a", "baseUrl": "http://127.0.0.1:9/v1"},
            "b": {"kind": "openai-compat", "model": "model-b", "baseUrl": server.url + "/v1",
                  "apiKeyEnv": "B_TOKEN"},
        }  # fmt: skip
        (home / "config.json").write_text(json.dumps({"model": "a", "models": profiles}))
        out = kiso(tmp_path, "-p", "hi", "--model", "b", KISO_HOME=str(home), KISO_MODEL="a",
                   B_TOKEN="tok-b")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "from the flag"
    assert server.requests[0].json["model"] == "model-b"
    assert server.requests[0].credential == "tok-b"


def test_print_mode_denies_what_would_ask_and_the_model_sees_why(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [
        {"tool_calls": [{"name": "write_file", "input": {"path": "x.txt", "content": "x"}}]},
        {"text": "I could not write it."},
    ]}))  # fmt: skip
    out = kiso(tmp_path, "-p", "write x", KISO_FAUX_SCRIPT=str(script))
    assert out.returncode == 0, out.stderr
    assert "denied write_file" in out.stderr
    assert not (tmp_path / "x.txt").exists()
    allowed = kiso(
        tmp_path, "-p", "write x", "--mode", "accept-edits", KISO_FAUX_SCRIPT=str(script)
    )
    assert allowed.returncode == 0, allowed.stderr
    assert (tmp_path / "x.txt").read_text() == "x"


def test_a_broken_config_fails_loudly_naming_the_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text('{"model": "x" // comment\n}')
    out = kiso(tmp_path, "-p", "hi", KISO_HOME=str(home))
    assert out.returncode == 1
    assert str(home / "config.json") in out.stderr and "remove the //" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_refused_or_failed_call_is_said_on_stderr_in_text_mode(tmp_path: Path) -> None:
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    s = tmp_path / "s.json"
    s.write_text(
        json.dumps(
            {
                "turns": [
                    {"tool_calls": [{"name": "read_file", "input": {"nope": 1}}]},
                    {"tool_calls": [{"name": "read_file", "input": {"path": "missing.txt"}}]},
                    {"text": "done"},
                ]
            }
        )
    )
    out = kiso(ws, "-p", "look", "--mode", "bypass", KISO_HOME=str(home), KISO_FAUX_SCRIPT=str(s))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"
    assert "denied read_file (schema): invalid input for read_file" in out.stderr
    assert "[read_file] failed: " in out.stderr and "missing.txt" in out.stderr
