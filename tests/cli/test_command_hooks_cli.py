"""Command hooks through the real ``kiso``: from the user config they run and are named in the
header; from a project config only once the trust gate applied it, and the trust question lists
what they would run; a broken ``hooks`` is one clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiso.kernel import ApprovalDecided, JsonlSessionStore

from .test_trust import faux, kiso


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    return folder


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def test_a_user_before_tool_hook_denies_in_print_mode(tmp_path: Path, ws: Path, home: Path) -> None:
    hooks = {
        "before_tool": [{"matcher": "shell", "command": "echo 'shell is off today' >&2; exit 2"}],
        "run_end": [{"command": "cat > end.json"}],
    }
    (home / "config.json").write_text(json.dumps({"hooks": hooks}))
    turns = [{"tool_calls": [{"name": "shell", "input": {"command": "touch x"}}]}, {"text": "ok"}]
    got = kiso(
        ws, home, "--mode", "bypass", "-p", "go", "s1", KISO_FAUX_SCRIPT=faux(tmp_path, *turns)
    )
    assert got.returncode == 0, got.stderr
    assert f"hooks: before_tool 1, run_end 1 (from {home / 'config.json'})" in got.stderr
    assert "shell is off today" in got.stderr  # the refusal is said, as every refusal is
    assert not (ws / "x").exists()
    events = JsonlSessionStore(home).load("s1").events
    (decided,) = [e for e in events if isinstance(e, ApprovalDecided)]
    assert decided.decided_by.startswith("hook:before_tool[0]:echo")
    assert decided.reason == "shell is off today"
    assert json.loads((ws / "end.json").read_text())["outcome"] == {"kind": "completed"}


def test_a_timed_out_hook_is_loud_and_denied_headless(tmp_path: Path, ws: Path, home: Path) -> None:
    hooks = {"before_tool": [{"command": "exec sleep 60", "timeout": 0.5}]}
    (home / "config.json").write_text(json.dumps({"hooks": hooks}))
    turns = [{"tool_calls": [{"name": "shell", "input": {"command": "touch x"}}]}, {"text": "ok"}]
    got = kiso(
        ws, home, "--mode", "bypass", "-p", "go", "s1", KISO_FAUX_SCRIPT=faux(tmp_path, *turns)
    )
    assert got.returncode == 0, got.stderr
    assert "kiso: hook:before_tool[0]:exec sleep 60 timed out after 0.5s" in got.stderr
    (decided,) = [
        e for e in JsonlSessionStore(home).load("s1").events if isinstance(e, ApprovalDecided)
    ]
    assert decided.decided_by == "headless" and "timed out" in (decided.reason or "")
    assert not (ws / "x").exists()


def test_project_hooks_run_only_once_trusted_and_the_trust_listing_names_them(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    (ws / ".kiso").mkdir()
    hooks = {"run_end": [{"command": "echo ran > hook-ran.txt"}]}
    (ws / ".kiso" / "config.json").write_text(json.dumps({"hooks": hooks}))
    env = {"KISO_FAUX_SCRIPT": faux(tmp_path, {"text": "done"})}
    untrusted = kiso(ws, home, "-p", "hi", **env)
    assert untrusted.returncode == 1 and "did not start" in untrusted.stderr
    refused = kiso(ws, home, "trust", "--revoke")
    assert refused.returncode == 0, refused.stderr
    assert "runs the hook run_end: echo ran > hook-ran.txt" in refused.stdout
    ran = kiso(ws, home, "-p", "hi", "r1", **env)
    assert ran.returncode == 0, ran.stderr
    assert "hooks:" not in ran.stderr and not (ws / "hook-ran.txt").exists()
    trusted = kiso(ws, home, "trust")
    assert trusted.returncode == 0, trusted.stderr
    ran = kiso(ws, home, "-p", "hi", "t1", **env)
    assert ran.returncode == 0, ran.stderr
    assert "hooks: run_end 1" in ran.stderr
    assert (ws / "hook-ran.txt").read_text() == "ran\n"


def test_a_changed_project_hook_needs_trust_again(tmp_path: Path, ws: Path, home: Path) -> None:
    (ws / ".kiso").mkdir()
    config = ws / ".kiso" / "config.json"
    config.write_text(json.dumps({"hooks": {"run_end": [{"command": "true"}]}}))
    assert kiso(ws, home, "trust").returncode == 0
    config.write_text(json.dumps({"hooks": {"run_end": [{"command": "echo x > evil.txt"}]}}))
    got = kiso(ws, home, "-p", "hi", KISO_FAUX_SCRIPT=faux(tmp_path, {"text": "done"}))
    assert got.returncode == 1 and "changed config.json" in got.stderr
    assert not (ws / "evil.txt").exists()


def test_a_bad_hooks_key_is_one_clear_error(tmp_path: Path, ws: Path, home: Path) -> None:
    (home / "config.json").write_text(json.dumps({"hooks": {"before_tool": [{"cmd": "ls"}]}}))
    got = kiso(ws, home, "-p", "hi", KISO_FAUX_SCRIPT=faux(tmp_path, {"text": "done"}))
    assert got.returncode == 1
    assert f"{home / 'config.json'}: hooks.before_tool[0].cmd: unknown key" in got.stderr
    assert "Traceback" not in got.stderr


def test_the_interactive_session_shows_a_hooks_failure_above_its_prompt(
    tmp_path: Path, ws: Path, home: Path
) -> None:
    hooks = {"after_tool": [{"command": "exit 5"}], "run_end": [{"command": "exit 7"}]}
    (home / "config.json").write_text(json.dumps({"hooks": hooks}))
    turns = [{"tool_calls": [{"name": "list_dir", "input": {}}]}, {"text": "Listed."}]
    entry = (
        "import sys; from kiso.cli.repl import run_interactive; "
        "sys.exit(run_interactive(session_id='i1', model=None, mode=None, prompt=None))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("KISO_MODEL", "KISO_MODE")}
    env.update(KISO_HOME=str(home), KISO_FAUX_SCRIPT=faux(tmp_path, *turns), TERM="dumb")
    done = subprocess.run(
        [sys.executable, "-c", entry],
        input="list it\n/exit\n",
        capture_output=True,
        text=True,
        cwd=ws,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "hook:after_tool[0]:exit 5 failed (exit 5) (noted in the tool result)" in done.stdout
    assert "hook:run_end[0]:exit 7 failed (exit 7) (the run's outcome stands)" in done.stdout
    assert "hook:" not in done.stderr  # said on the session's screen, not under it
