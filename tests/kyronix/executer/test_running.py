"""A running execution is *running*, not uncertain: it is reported with its pid, it cannot be
ruled on and it is not run a second time until it ends. Proven with real processes (each pid
the test starts is recorded; nothing is matched by name).

Issue 12: an execution that a live ``kyronix exec`` was still running was reported
"uncertain", ``--resolve ID=rerun`` was accepted while it ran, and the same id then executed
twice. The executer now holds kiso's liveness guard for every execution with effects and hands
it to the terminal's command; ``kill -9`` of the executer ends the command too (kiso's shell
supervisor), after which, and only after which, the execution is uncertain.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kyronix.errors import ExecutionRunningError
from kyronix.executer import ROOT_POLICIES, KyronixExecuter, PermissionManager
from tests.processes import alive

from .kmlkit import kml

# Appends to runs.txt each time it really runs; waits for "release" (or 60 s) before ending.
COMMAND = (
    "echo run >> runs.txt; echo $$ > marker; "
    "i=0; while [ ! -f release ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; "
    "echo finished > done.txt"
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
    out, err = proc.communicate(timeout=90)
    return proc.returncode, json.loads(out) if out.strip() else None, err


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 30
    while not (path.exists() and path.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the terminal tool never started"
        time.sleep(0.02)
    return int(path.read_text())


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, list[str], dict[str, str], Path]:
    base = tmp_path / "project"
    base.mkdir()
    plan = tmp_path / "plan.kml"
    plan.write_text(
        kml(
            ("terminal", {"command": COMMAND}, "t-1"),
            ("write_file", {"path": "after.txt", "content": "after\n"}, "w-2"),
        )
    )
    common = ["--base", str(base), "--root", "--receipts", str(tmp_path / "receipts.sqlite3")]
    env = {**os.environ, "KYRONIX_HOME": str(tmp_path / "home")}
    return base, common, env, plan


def test_a_running_execution_is_reported_running_and_cannot_be_ruled_on(
    project: tuple[Path, list[str], dict[str, str], Path],
) -> None:
    base, common, env, plan = project
    first = _kyronix(str(plan), *common, env=env)
    try:
        _wait_for(base / "marker", first)

        # Listed as running, with the pid of the executer that runs it.
        code, listed, err = _finish(_kyronix("--uncertain", *common, env=env))
        assert code == 0, err
        assert [(u["executionId"], u["state"], u["pid"]) for u in listed] == [
            ("t-1", "running", first.pid)
        ]

        # A ruling is refused while it runs: nobody can know yet whether it applied.
        code, _, err = _finish(_kyronix("--resolve", "t-1=rerun", *common, env=env))
        assert code == 1
        assert "still running" in err and f"pid {first.pid}" in err

        # The same plan from another process: t-1 is running (not run again), the rest stops.
        code, results, err = _finish(_kyronix(str(plan), *common, env=env))
        assert code == 1, err
        running, after = (r["result"] for r in results)
        assert running["running"] is True and running["errorType"] == "Running"
        assert running["pid"] == first.pid and "uncertain" not in running
        assert after["skipped"] is True and not (base / "after.txt").exists()
        assert (base / "runs.txt").read_text() == "run\n"
    finally:
        (base / "release").write_text("")
    code, results, err = _finish(first)
    assert code == 0, err
    assert [r["result"]["success"] for r in results] == [True, True]

    # Now it has finished: a replay, never a second run.
    code, again, err = _finish(_kyronix(str(plan), *common, env=env))
    assert code == 0, err
    assert again == results
    assert (base / "runs.txt").read_text() == "run\n"
    code, listed, _ = _finish(_kyronix("--uncertain", *common, env=env))
    assert listed == []


def test_after_kill_9_the_command_ends_and_only_then_is_it_uncertain(
    project: tuple[Path, list[str], dict[str, str], Path],
) -> None:
    base, common, env, plan = project
    first = _kyronix(str(plan), *common, env=env)
    shell_pid = _wait_for(base / "marker", first)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=10)
    # The shell supervisor kills the command when its executer dies: nothing is killed here.
    deadline = time.monotonic() + 15
    while alive(shell_pid):
        assert time.monotonic() < deadline, f"the command (pid {shell_pid}) outlived kill -9"
        time.sleep(0.05)
    # Once the last holder of the guard is gone the execution is uncertain (not running).
    while True:
        code, listed, err = _finish(_kyronix("--uncertain", *common, env=env))
        assert code == 0, err
        if listed and listed[0]["state"] == "uncertain":
            break
        assert time.monotonic() < deadline, listed
        time.sleep(0.1)
    assert [u["executionId"] for u in listed] == ["t-1"]
    assert not (base / "done.txt").exists()
    code, _, err = _finish(_kyronix("--resolve", "t-1=skipped", *common, env=env))
    assert code == 0, err
    assert (base / "runs.txt").read_text() == "run\n"


def test_two_executers_on_one_store_in_one_process(tmp_path: Path, base: Path) -> None:
    """The API says the same as the command line: running_executions() lists it,
    resolve() raises ExecutionRunningError (after waiting ``wait`` seconds), a second request
    is answered running, and the tool ran once."""
    store = tmp_path / "r.sqlite3"
    gate = threading.Event()
    entered = threading.Event()
    runs: list[int] = []

    def slow(args: dict[str, Any]) -> str:
        runs.append(1)
        entered.set()
        gate.wait(30)
        return "done"

    one = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=store)
    two = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=store)
    for ex in (one, two):
        ex.register("slow", slow)
    text = kml(("slow", {}, "s-1"))
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(one.execute_sync(text, base)))
    worker.start()
    try:
        assert entered.wait(30)
        assert [r.execution_id for r in two.running_executions(base)] == ["s-1"]
        assert two.uncertain_executions(base) == []
        with pytest.raises(ExecutionRunningError, match="still running") as info:
            two.resolve("s-1", "rerun", base, wait=0.1)
        assert info.value.details == {"executionId": "s-1", "pid": os.getpid()}
        [entry] = two.execute_sync(text, base)
        assert entry["result"]["running"] is True and entry["result"]["pid"] == os.getpid()
    finally:
        gate.set()
        worker.join(30)
    assert out[0][0]["result"]["output"] == "done"
    assert runs == [1]
    [entry] = two.execute_sync(text, base)
    assert entry == out[0][0] and runs == [1]
    assert two.running_executions(base) == []
    one.close()
    two.close()


def test_resolve_waits_for_a_running_execution_to_end(tmp_path: Path, base: Path) -> None:
    """``wait``: a ruling asked while it runs goes through once it has ended (here it ends
    finished, so the ruling is refused as not uncertain: nothing is ruled on by accident)."""
    from kyronix.errors import NotUncertainError

    store = tmp_path / "r.sqlite3"
    gate = threading.Event()
    entered = threading.Event()

    def slow(args: dict[str, Any]) -> str:
        entered.set()
        gate.wait(30)
        return "done"

    one = KyronixExecuter(receipts=store)
    two = KyronixExecuter(receipts=store)
    one.register("slow", slow)
    worker = threading.Thread(target=lambda: one.execute_sync(kml(("slow", {}, "s-2")), base))
    worker.start()
    assert entered.wait(30)
    threading.Timer(0.2, gate.set).start()
    with pytest.raises(NotUncertainError, match="already finished"):
        two.resolve("s-2", "skipped", base, wait=30)
    worker.join(30)
    one.close()
    two.close()
