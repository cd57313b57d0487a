"""A real ``kyronix exec`` process killed by SIGKILL mid-tool, then the same KML run again.

What must hold after the kill: the tool that finished is not run again (its stored result comes
back), the tool that was running is reported uncertain and is not re-run, the tools after it do
not run, and only an explicit ``--resolve ID=rerun`` lets it run again. And for a custom tool
killed mid-call: one registered read-only or idempotent is simply run again (nothing was fsynced
before it ran); one with effects is uncertain.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.processes import alive

from .kmlkit import kml

COMMAND = (
    "if [ -f go ]; then echo finished > done.txt; "
    "else echo $$ > marker; sleep 60; echo late > late.txt; fi"
)


def _kyronix(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kyronix.executer", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, Any, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, json.loads(out) if out.strip() else None, err


def test_sigkill_mid_tool_then_the_same_kml_again(tmp_path: Path) -> None:
    base = tmp_path / "project"
    base.mkdir()
    receipts = tmp_path / "receipts.sqlite3"
    plan = tmp_path / "plan.kml"
    plan.write_text(
        kml(
            ("write_file", {"path": "first.txt", "content": "written once\n"}, "w-1"),
            ("terminal", {"command": COMMAND}, "t-1"),
            ("write_file", {"path": "third.txt", "content": "never\n"}, "w-3"),
        )
    )
    env = {**os.environ, "KYRONIX_HOME": str(tmp_path / "home")}
    common = ["--base", str(base), "--root", "--receipts", str(receipts)]

    proc = _kyronix(str(plan), *common, env=env)
    marker = base / "marker"
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the terminal tool never started"
        time.sleep(0.02)
    shell_pid = int(marker.read_text())
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)  # reap it and close its pipes
    # The shell's supervisor ends the command's group when the executer dies: nothing is
    # killed by hand, and nothing of the command outlives the crash.
    deadline = time.monotonic() + 10
    while alive(shell_pid):
        if time.monotonic() > deadline:
            pytest.fail(f"the command (pid {shell_pid}) outlived the killed executer")
        time.sleep(0.05)

    (base / "first.txt").write_text("edited by a person after the crash\n")
    marker.unlink()

    code, results, _ = _finish(_kyronix(str(plan), *common, env=env))
    assert code == 1
    first, second, third = (r["result"] for r in results)
    assert first["success"] is True and first["executionId"] == "w-1"
    assert (base / "first.txt").read_text() == "edited by a person after the crash\n"
    assert second["uncertain"] is True and second["success"] is False
    assert second["errorType"] == "Uncertain"
    assert third["skipped"] is True
    assert not marker.exists(), "the uncertain command ran again"
    assert not (base / "third.txt").exists()
    assert not (base / "late.txt").exists()

    # Listed as uncertain, and still uncertain on a third attempt.
    code, listed, _ = _finish(_kyronix("--uncertain", *common, env=env))
    assert code == 0 and [u["executionId"] for u in listed] == ["t-1"]
    _, again, _ = _finish(_kyronix(str(plan), *common, env=env))
    assert again[1]["result"]["uncertain"] is True
    assert not marker.exists()

    # A person checks, decides to run it again, and lets the plan finish.
    (base / "go").write_text("")
    code, _, err = _finish(_kyronix("--resolve", "t-1=rerun", *common, env=env))
    assert code == 0, err
    code, results, err = _finish(_kyronix(str(plan), *common, env=env))
    assert code == 0, (results, err)
    assert [r["result"]["success"] for r in results] == [True, True, True]
    assert (base / "done.txt").read_text() == "finished\n"
    assert (base / "third.txt").read_text() == "never\n"
    assert (base / "first.txt").read_text() == "edited by a person after the crash\n"


# -- a custom tool killed mid-call: what it declares decides what happens next -----------------

_AGENT = """
import json, os, sys, time
from pathlib import Path
from kyronix.executer import KyronixExecuter

mode, base, receipts, plan = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]


def probe(args):
    with open(base / "runs.txt", "a") as f:
        f.write("run\\n")
    if not (base / "go").exists():
        (base / "marker").write_text(str(os.getpid()))
        time.sleep(60)
    return "probed"


flags = {"read_only": {"read_only": True}, "idempotent": {"idempotent": True}, "effects": {}}
executer = KyronixExecuter(receipts=receipts)
executer.register("probe", probe, **flags[mode])
with executer:
    print(json.dumps(executer.execute_sync(Path(plan).read_text(), base)))
"""


@pytest.mark.parametrize("mode", ["read_only", "idempotent", "effects"])
def test_sigkill_mid_custom_tool(tmp_path: Path, mode: str) -> None:
    base = tmp_path / "project"
    base.mkdir()
    agent = tmp_path / "agent.py"
    agent.write_text(_AGENT)
    plan = tmp_path / "plan.kml"
    plan.write_text(kml(("probe", {}, "p-1"), ("write_file", {"path": "after", "content": "x"})))
    env = {**os.environ, "KYRONIX_HOME": str(tmp_path / "home")}
    argv = [sys.executable, str(agent), mode, str(base), str(tmp_path / "r.sqlite3"), str(plan)]

    def agent_run() -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )

    proc = agent_run()
    marker = base / "marker"
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the custom tool never started"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    (base / "go").write_text("")

    code, results, err = _finish(agent_run())
    assert code == 0, err
    probe, after = (r["result"] for r in results)
    runs = (base / "runs.txt").read_text().count("run")
    if mode == "effects":  # it may have acted: uncertain, not run again, the envelope stops
        assert probe["uncertain"] is True and probe["errorType"] == "Uncertain"
        assert after["skipped"] is True and not (base / "after").exists()
        assert runs == 1
    else:  # read-only or idempotent: nothing was fsynced before it ran, so it simply runs again
        assert probe["success"] is True and probe["output"] == "probed"
        assert after["success"] is True and (base / "after").read_text() == "x"
        assert runs == 2
        # and now it is finished: a third send replays it
        code, again, _ = _finish(agent_run())
        assert again == results and (base / "runs.txt").read_text().count("run") == 2
