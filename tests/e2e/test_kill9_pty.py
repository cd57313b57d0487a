"""THE STORY, as a person lives it: the interactive session in a real PTY approves an edit and a
slow shell command, and is killed with SIGKILL mid-command: ``kill -9 -PGID`` of the agent's own
process group, nothing else, as a machine crash would. The shell's supervisor sees kiso die and
kills the command, so its marker never appears, even after the sleep before it would have ended. A
new session in a new PTY asks the one question the crash made unknowable; "skip it" continues the
original trajectory without repeating anything."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

from kiso.kernel import ExecutionResolved, JsonlSessionStore, RunEnded, plan
from kiso.kernel.recovery import ResolveUncertain
from tests.cli.test_repl import ENTER, Term, chat
from tests.processes import alive

EDIT = {"edits": [{"oldText": "OLD", "newText": "NEW"}]}
SLEEP_S = 3
SLOW = f"echo $$ > shell.pid; sleep {SLEEP_S} && touch marker.txt"
SCRIPT = {
    "turns": [
        {"tool_calls": [{"name": "edit_file", "input": {"path": "f1.txt", **EDIT}}]},
        {"tool_calls": [{"name": "shell", "input": {"command": SLOW}}]},
        {"tool_calls": [{"name": "edit_file", "input": {"path": "f3.txt", **EDIT}}]},
        {"text": "All done."},
    ]
}


def shell_pid(ws: Path) -> int | None:
    """The pid the slow command wrote when it started, once it is there."""
    path = ws / "shell.pid"
    text = path.read_text() if path.exists() else ""
    return int(text) if text.endswith("\n") else None


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
    try:
        first.wait_for("▸ default")
        first.send("edit, run the suite, edit" + ENTER)
        first.wait_for("Apply this edit to f1.txt?")
        first.send(ENTER)
        first.wait_for("Run this command?")
        assert SLOW in first.text  # the whole command in the panel
        first.send(ENTER)

        def started() -> bool:
            executions = log_text(home).count('"type":"execution_started"')
            return executions == 2 and shell_pid(ws) is not None

        first.wait(started, 15, "the shell to start")
        shell_started = time.monotonic()
        shell = shell_pid(ws)
        assert shell is not None and alive(shell)
        first.wait_for(f"● shell echo $$ > shell.pid; sleep {SLEEP_S}")  # the live card
        os.killpg(first.child.pid, signal.SIGKILL)  # kill -9 -PGID: the agent's group, only
        first.wait(lambda: first.eof, 10, "the PTY to close")
    finally:
        first.close()
    # Wait until the command would have touched the marker, and then some.
    time.sleep(max(0.0, shell_started + SLEEP_S + 1.5 - time.monotonic()))
    assert not (ws / "marker.txt").exists(), "the command went on after kiso died"
    assert not alive(shell)

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
