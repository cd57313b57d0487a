"""The kill -9 story: a real agent process is SIGKILLed mid-command (its whole process group, or
the process alone), as a machine crash would. Nothing else is killed by hand: the shell's
supervisor sees kiso die and kills the command, so its marker never appears, even long after the
sleep before it would have ended. A fresh process resumes the same trajectory without repeating
anything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from kiso.kernel import ExecutionResolved, JsonlSessionStore, RunEnded, plan
from kiso.kernel.recovery import ResolveUncertain
from tests.processes import alive

DRIVER = Path(__file__).with_name("driver.py")
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


@pytest.mark.parametrize("target", ["group", "process"])
def test_kill9_mid_shell_then_resume_continues_the_same_trajectory(
    tmp_path: Path, target: str
) -> None:
    home, ws, script = tmp_path / "home", tmp_path / "ws", tmp_path / "script.json"
    ws.mkdir()
    for name in ("f1.txt", "f3.txt"):
        (ws / name).write_text("OLD\n")
    script.write_text(json.dumps(SCRIPT))
    env = {**os.environ, "KISO_FAUX_SCRIPT": str(script)}
    env.pop("KISO_FAILPOINT", None)
    argv = [sys.executable, str(DRIVER), str(home), str(ws), "k9"]
    agent = subprocess.Popen(
        [*argv, "run", "edit, run the suite, edit"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its pgid is its pid, which we record
    )
    pid_file = ws / "shell.pid"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            log_files = list(home.glob("projects/*/k9.jsonl"))
            text = log_files[0].read_text() if log_files else ""
            started = text.count('"type":"execution_started"') == 2
            if started and pid_file.exists() and pid_file.read_text().endswith("\n"):
                break
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
            time.sleep(0.05)
        else:
            raise AssertionError("the shell never started")
        shell_started = time.monotonic()
        shell = int(pid_file.read_text())
        assert alive(shell)
        if target == "group":
            os.killpg(agent.pid, signal.SIGKILL)  # kiso's whole process group, and nothing else
        else:
            os.kill(agent.pid, signal.SIGKILL)  # the kiso process alone
        assert agent.wait(10) == -signal.SIGKILL
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if agent.stderr:
            agent.stderr.close()
    # Wait until the command would have touched the marker, and then some.
    time.sleep(max(0.0, shell_started + SLEEP_S + 1.5 - time.monotonic()))
    assert not (ws / "marker.txt").exists(), "the command went on after kiso died"
    assert not alive(shell)

    log = JsonlSessionStore(home).load("k9")  # the log loads
    action = plan(log.events, rerunnable={"read_file", "list_dir", "search_text"})
    assert isinstance(action, ResolveUncertain)
    assert [u.name for u in action.executions] == ["shell"]  # exactly one uncertain execution
    assert not (ws / "marker.txt").exists()
    assert (ws / "f1.txt").read_text() == "NEW\n"  # the first edit is on disk
    assert (ws / "f3.txt").read_text() == "OLD\n"
    assert not any(isinstance(e, RunEnded) for e in log.events)

    resumed = subprocess.run(
        [*argv, "resume", "skipped"], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    seen = [json.loads(line)["type"] for line in resumed.stdout.splitlines()]
    assert seen[0] == "uncertain"
    final = JsonlSessionStore(home).load("k9")
    assert (ws / "f3.txt").read_text() == "NEW\n"  # the trajectory continued
    assert not (ws / "marker.txt").exists()  # the skipped command was not run again
    assert sum(isinstance(e, ExecutionResolved) for e in final.events) == 1
    starts = Counter(e.call_id for e in final.events if e.type == "execution_started")  # type: ignore[union-attr]
    assert starts == {"call_0_0": 1, "call_1_0": 1, "call_2_0": 1}  # nothing before it repeated
    ends = [e for e in final.events if isinstance(e, RunEnded)]
    assert len(ends) == 1 and ends[0].outcome.kind == "completed"
    assert final.events[: len(log.events)] == log.events  # the prefix is untouched
