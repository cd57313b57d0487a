"""Aborting a run kills the shell's whole process group, and the log stays clean."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from kiso.kernel import ExecutionFinished, RunEnded
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.tools import builtin_tools

from .helpers import assert_runs_end_once, store


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] != "Z":
                    out.append(pid)
        except FileNotFoundError:
            pass
    return out


def test_abort_mid_shell_kills_the_group_and_ends_the_run(tmp_path: Path) -> None:
    command = "sleep 60 & echo $! > bg.pid; sleep 60"
    agent = Agent(
        adapter=FauxAdapter(
            [{"tool_calls": [{"name": "shell", "input": {"command": command}}]}, {"text": "no"}]
        ),
        tools=builtin_tools(),
        store=store(tmp_path),
        workspace=tmp_path,
        mode="bypass",
    )
    with agent.session("s") as session:
        for ev in session.run_sync("run it"):
            if ev.type == "tool_start":
                threading.Timer(0.5, session.abort).start()
        # The receipt says the command was cancelled: it did not run its 60 s to the end.
        ended = session.events[-1]
        assert isinstance(ended, RunEnded) and ended.outcome.kind == "aborted"
        finished = next(e for e in session.events if isinstance(e, ExecutionFinished))
        assert finished.is_error and finished.error_kind == "aborted"
        assert "cancelled" in finished.content
        assert_runs_end_once(session.events)
    background = int((tmp_path / "bg.pid").read_text())
    deadline = time.monotonic() + 5
    while alive([background]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive([background]), "the background child of the aborted shell survived"
    assert os.path.exists(tmp_path / "bg.pid")
