"""An uncertain execution whose processes may still be alive says so, and a ruling waits.

A real agent process runs a tool that starts a process the shell's supervisor does not manage
(its own session, holding the execution's liveness guard, as an escaped daemon would) and is
killed with SIGKILL. A fresh session then sees the execution uncertain *and* possibly running;
a ruling refuses while that process lives, and goes through once it is gone. Only processes
this test started are killed, by the pids it recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kiso.kernel import JsonlSessionStore, RefusedError
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.tools.base import define_tool
from tests.processes import alive

DRIVER = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from kiso.kernel import JsonlSessionStore
    from kiso.providers import FauxAdapter
    from kiso.runtime import Agent
    from kiso.tools.base import define_tool

    home, ws = Path(sys.argv[1]), Path(sys.argv[2])

    def spawn(args, ctx):
        child = subprocess.Popen(
            ["sleep", "60"], pass_fds=ctx.inherit_fds, start_new_session=True
        )
        (ws / "child.pid").write_text(str(child.pid))
        time.sleep(60)  # killed here, mid-effect
        return "never"

    turns = [{"tool_calls": [{"name": "spawn", "input": {}}]}, {"text": "done"}]
    agent = Agent(
        adapter=FauxAdapter(turns),
        tools=[define_tool("spawn", "Start a daemon", {"type": "object"}, spawn)],
        store=JsonlSessionStore(home),
        workspace=ws,
        mode="bypass",
    )
    with agent.session("d") as session:
        for _ in session.run_sync("go"):
            pass
    """
)


def test_a_ruling_waits_while_processes_of_the_execution_still_run(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("KISO_FAILPOINT", "KISO_FAUX_SCRIPT")}
    agent_proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(home), str(ws)], env=env, start_new_session=True
    )
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (ws / "child.pid").exists() or not (ws / "child.pid").read_text():
            if time.monotonic() > deadline or agent_proc.poll() is not None:
                pytest.fail("the tool never started its process")
            time.sleep(0.05)
        child = int((ws / "child.pid").read_text())
        os.killpg(agent_proc.pid, signal.SIGKILL)  # the agent's own group; the daemon escaped it
        agent_proc.wait(10)

        async def nothing(args: dict[str, object]) -> str:
            return "unused"

        agent = Agent(
            adapter=FauxAdapter([{"text": "(on disk)"}, {"text": "done"}]),
            tools=[define_tool("spawn", "Start a daemon", {"type": "object"}, nothing)],
            store=JsonlSessionStore(home),
            workspace=ws,
            mode="bypass",
        )
        with agent.session("d") as session:
            events = list(session.resume_sync())
            uncertain = next(e for e in events if e.type == "uncertain")
            (execution,) = uncertain.executions  # type: ignore[union-attr]
            eid = execution.execution_id
            assert eid in uncertain.running  # type: ignore[union-attr]
            streamed = uncertain.to_json()["executions"][0]
            assert streamed["may_be_running"] is True
            assert events[-1].type == "paused"
            with pytest.raises(RefusedError, match="may still be running"):
                session.resolve(eid, "rerun", wait=0.3)
            assert session.uncertain_executions()  # nothing was ruled
            os.kill(child, signal.SIGKILL)  # the process this test's agent started
            session.resolve(eid, "skipped")  # waits until the guard is free, then rules
            assert not session.may_be_running(eid)
            after = list(session.resume_sync())
        assert after[-1].type == "terminal"
        log = JsonlSessionStore(home).load("d").events
        rulings = [e for e in log if e.type == "execution_resolved"]
        assert [json.loads(json.dumps(r.to_json()))["resolution"] for r in rulings] == ["skipped"]
    finally:
        if agent_proc.poll() is None:
            os.killpg(agent_proc.pid, signal.SIGKILL)
            agent_proc.wait()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)
