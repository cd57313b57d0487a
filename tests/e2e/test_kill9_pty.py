"""THE STORY, as a person lives it: the interactive session in a real PTY approves an edit and a
slow shell command, and is killed with SIGKILL mid-command (the agent's process group and the
shell's own, as a machine crash would). A new session in a new PTY asks the one question the crash
made unknowable; "skip it" continues the original trajectory without repeating anything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from kiso.kernel import ExecutionResolved, JsonlSessionStore, RunEnded, plan
from kiso.kernel.recovery import ResolveUncertain
from tests.cli.test_repl import ENTER, Term, chat

EDIT = {"edits": [{"oldText": "OLD", "newText": "NEW"}]}
SLOW = "sleep 30 && touch marker.txt"
SCRIPT = {
    "turns": [
        {"tool_calls": [{"name": "edit_file", "input": {"path": "f1.txt", **EDIT}}]},
        {"tool_calls": [{"name": "shell", "input": {"command": SLOW}}]},
        {"tool_calls": [{"name": "edit_file", "input": {"path": "f3.txt", **EDIT}}]},
        {"text": "All done."},
    ]
}


def shell_groups(ws: Path) -> set[int]:
    """Process groups of running commands in ``ws`` that would create the marker."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,pgid=,args="], capture_output=True, text=True, check=True
    ).stdout
    groups = set()
    for line in out.splitlines():
        pid, pgid, args = line.split(None, 2)
        if "marker.txt" in args and "sleep" in args and "ps -eo" not in args:
            try:
                where = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if where == os.path.realpath(ws):
                groups.add(int(pgid))
    return groups


def log_text(home: Path) -> str:
    files = list(home.glob("projects/*/k9.jsonl"))
    return files[0].read_text() if files else ""


def test_kill9_in_the_pty_then_resume_asks_once_and_continues(tmp_path: Path) -> None:
    home, ws, script = tmp_path / "home", tmp_path / "ws", tmp_path / "script.json"
    ws.mkdir()
    for name in ("f1.txt", "f3.txt"):
        (ws / name).write_text("OLD\n")
    script.write_text(json.dumps(SCRIPT))
    argv = chat("k9", "default")

    first = Term(argv, cwd=ws, home=home, script=script)
    groups: set[int] = set()
    try:
        first.wait_for("▸ default")
        first.send("edit, run the suite, edit" + ENTER)
        first.wait_for("Apply this edit to f1.txt?")
        first.send(ENTER)
        first.wait_for("Run this command?")
        assert SLOW in first.text  # the whole command in the panel
        first.send(ENTER)

        def started() -> bool:
            nonlocal groups
            groups = shell_groups(ws)
            return log_text(home).count('"type":"execution_started"') == 2 and bool(groups)

        first.wait(started, 15, "the shell to start")
        first.wait_for("● shell sleep 30")  # the live card of the running call
        os.killpg(first.child.pid, signal.SIGKILL)  # the agent's whole process group
        for group in groups:  # and the shell's own group
            os.killpg(group, signal.SIGKILL)
        first.wait(lambda: first.eof, 10, "the PTY to close")
    finally:
        first.close()
        for group in shell_groups(ws):
            os.killpg(group, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while shell_groups(ws) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not shell_groups(ws)

    log = JsonlSessionStore(home).load("k9")
    action = plan(log.events, rerunnable={"read_file", "list_dir", "search_text"})
    assert isinstance(action, ResolveUncertain)
    assert [u.name for u in action.executions] == ["shell"]  # exactly one uncertain execution
    uncertain_id = action.executions[0].execution_id
    assert (ws / "f1.txt").read_text() == "NEW\n"
    assert (ws / "f3.txt").read_text() == "OLD\n"
    assert not (ws / "marker.txt").exists()

    second = Term(argv, cwd=ws, home=home, script=script)
    try:
        screen = second.wait_for("did it apply?")
        assert f"interrupted execution: shell ({uncertain_id})" in screen
        assert "1. rerun it" in screen and "2. skip it" in screen and "3. it was applied" in screen
        assert SLOW in screen
        second.send("2")  # skip it
        second.wait_for("✓ skip it")
        second.wait_for("Apply this edit to f3.txt?")  # the ORIGINAL trajectory continues
        second.send(ENTER)
        second.wait_for("All done.")
        second.send("/exit" + ENTER)
        assert second.exit_status() == 0
    finally:
        second.close()

    final = JsonlSessionStore(home).load("k9")
    assert (ws / "f3.txt").read_text() == "NEW\n"
    assert (ws / "f1.txt").read_text() == "NEW\n"  # edited once: a second edit would fail
    assert not (ws / "marker.txt").exists()  # the skipped command was not run again
    resolved = [e for e in final.events if isinstance(e, ExecutionResolved)]
    assert len(resolved) == 1 and resolved[0].resolution == "skipped"
    starts = Counter(e.call_id for e in final.events if e.type == "execution_started")  # type: ignore[union-attr]
    assert starts == {"call_0_0": 1, "call_1_0": 1, "call_2_0": 1}  # nothing before it repeated
    ends = [e for e in final.events if isinstance(e, RunEnded)]
    assert len(ends) == 1 and ends[0].outcome.kind == "completed"
    assert final.events[: len(log.events)] == log.events  # the prefix is untouched
