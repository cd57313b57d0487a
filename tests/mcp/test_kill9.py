"""kill -9 in the middle of an MCP call, then resume in a new process.

A non-read-only MCP tool is uncertain after the crash (not re-run: a human rules); a read-only
one is re-run. The server appends a line to a file each time a tool runs, which counts runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mcp.helpers import receipts

DRIVER = [sys.executable, "-m", "tests.mcp.driver"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """Processes this test started (by pid): killed in teardown if still there."""
    started: list[int] = []
    yield started
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _kill_mid_call(
    home: Path, workspace: Path, tmp_path: Path, tool: str, pids: list[int]
) -> dict[str, str]:
    env = {
        **os.environ,
        "KISO_HOME": str(home),
        "MCP_TEST_RUNS": str(tmp_path / "runs"),
        "MCP_TEST_PIDFILE": str(tmp_path / "mcp.pid"),
        "MCP_TEST_HOLD": str(tmp_path / "hold"),
    }
    (tmp_path / "hold").write_text("")
    driver = subprocess.Popen(
        [*DRIVER, str(home), str(workspace), tool, "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    pids.append(driver.pid)
    pidfile = tmp_path / "mcp.pid"
    for _ in range(1200):
        if (pidfile.exists() and pidfile.read_text()) or driver.poll() is not None:
            break
        time.sleep(0.05)
    assert driver.poll() is None, "the driver ended before its MCP call ran"
    child = int(pidfile.read_text())
    pids.append(child)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(30)
    pids.remove(driver.pid)  # reaped: its pid is no longer ours to kill
    os.kill(child, signal.SIGKILL)  # the killed driver's MCP server, by its recorded pid
    pids.remove(child)
    pidfile.unlink()
    (tmp_path / "hold").unlink()  # a re-run finishes at once
    assert (tmp_path / "runs").read_text().splitlines() == [tool.split("_")[1]]
    return env


def _resume(home: Path, workspace: Path, tool: str, env: dict[str, str]) -> list[dict[str, object]]:
    out = subprocess.run(
        [*DRIVER, str(home), str(workspace), tool, "resume"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_a_non_read_only_call_is_uncertain_after_kill9(
    home: Path, workspace: Path, tmp_path: Path, pids: list[int]
) -> None:
    env = _kill_mid_call(home, workspace, tmp_path, "slow_write", pids)
    events = _resume(home, workspace, "slow_write", env)
    uncertain = [e for e in events if e["type"] == "uncertain"]
    assert uncertain, events
    [execution] = uncertain[0]["executions"]  # type: ignore[misc]
    assert execution["name"] == "mcp__t__slow_write" and execution["auto_rerun"] is False
    assert events[-1]["type"] == "paused"
    assert (tmp_path / "runs").read_text().splitlines() == ["write"]  # not run again
    assert receipts(home, "k9") == []


def test_a_read_only_call_is_rerun_after_kill9(
    home: Path, workspace: Path, tmp_path: Path, pids: list[int]
) -> None:
    env = _kill_mid_call(home, workspace, tmp_path, "slow_read", pids)
    events = _resume(home, workspace, "slow_read", env)
    assert events[-1]["type"] == "terminal", events
    assert (tmp_path / "runs").read_text().splitlines() == ["read", "read"]  # re-run once
    [receipt] = receipts(home, "k9")
    assert receipt.content == "read done"
