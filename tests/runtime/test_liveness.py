"""The liveness guard, proven across real processes: a lock that outlives kiso for exactly as long
as a process that inherited it lives. Every test kills only processes it started, by the pid it
recorded."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiso.kernel.errors import UsageError
from kiso.runtime.liveness import LivenessGuard, guard_path, may_be_running, wait_until_gone
from tests.processes import alive

linux = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
EXECUTION = "s-1:7"

# Stands in for kiso: holds the guard of EXECUTION, then starts a process that inherits it, either
# a plain `sleep 60` (printing its pid) or a command through run_command; then waits to be killed.
KISO = r"""
import os, subprocess, sys, time
from pathlib import Path
from kiso.runtime.liveness import LivenessGuard

live, ws, how = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
guard = LivenessGuard.hold(live, sys.argv[4])
if how == "sleep":
    child = subprocess.Popen(["sleep", "60"], pass_fds=[guard.fd])
    print(child.pid, flush=True)
    time.sleep(60)
else:
    from kiso.tools.shell import run_command
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    run_command(sys.argv[5], cwd=ws, env=env, timeout_ms=60_000, pass_fds=[guard.fd])
"""


def start_kiso(live: Path, ws: Path, how: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", KISO, str(live), str(ws), how, EXECUTION, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


# --- in one process -----------------------------------------------------------------------------


def test_holding_creates_a_private_locked_file_and_release_removes_it(tmp_path: Path) -> None:
    live = tmp_path / "live"
    guard = LivenessGuard.hold(live, EXECUTION)
    assert stat.S_IMODE(live.stat().st_mode) == 0o700
    assert stat.S_IMODE(guard.path.stat().st_mode) == 0o600
    assert guard.path.parent == live
    assert not os.get_inheritable(guard.fd)  # only what it is passed to inherits it
    assert may_be_running(live, EXECUTION)  # another open file description: the lock conflicts
    assert guard.release() is True
    assert not guard.path.exists()
    assert not may_be_running(live, EXECUTION)
    assert guard.release() is True  # twice is harmless
    with pytest.raises(UsageError, match="released"):
        _ = guard.fd


def test_the_guard_is_a_context_manager(tmp_path: Path) -> None:
    with LivenessGuard.hold(tmp_path, EXECUTION) as guard:
        assert guard.held
        assert may_be_running(tmp_path, EXECUTION)
    assert not guard.held
    assert not may_be_running(tmp_path, EXECUTION)
    assert list(tmp_path.iterdir()) == []


def test_no_file_means_nothing_is_running(tmp_path: Path) -> None:
    assert not may_be_running(tmp_path / "never-made", EXECUTION)
    assert wait_until_gone(tmp_path / "never-made", EXECUTION, 0)


def test_a_stale_file_nobody_locks_is_not_running_and_is_removed(tmp_path: Path) -> None:
    path = guard_path(tmp_path, EXECUTION)
    path.write_text("pid 1 execution s-1:7\n")  # left by a holder that died with its processes
    assert not may_be_running(tmp_path, EXECUTION)
    assert not path.exists()


def test_a_stale_file_can_be_held_again(tmp_path: Path) -> None:
    guard_path(tmp_path, EXECUTION).write_text("stale\n")
    with LivenessGuard.hold(tmp_path, EXECUTION) as guard:
        assert guard.path.read_text() == f"pid {os.getpid()} execution {EXECUTION}\n"
        assert may_be_running(tmp_path, EXECUTION)


def test_a_held_guard_cannot_be_held_twice(tmp_path: Path) -> None:
    with LivenessGuard.hold(tmp_path, EXECUTION), pytest.raises(UsageError, match="held already"):
        LivenessGuard.hold(tmp_path, EXECUTION)
    with LivenessGuard.hold(tmp_path, EXECUTION):  # once released it can
        pass


def test_release_keeps_the_file_while_an_inheritor_holds_the_lock(tmp_path: Path) -> None:
    guard = LivenessGuard.hold(tmp_path, EXECUTION)
    inheritor = subprocess.Popen(["sleep", "60"], pass_fds=[guard.fd])
    try:
        assert guard.release() is False
        assert guard.path.exists()
        assert may_be_running(tmp_path, EXECUTION)
        assert not wait_until_gone(tmp_path, EXECUTION, 0.2)
    finally:
        inheritor.kill()
        inheritor.wait()
    assert wait_until_gone(tmp_path, EXECUTION, 30)
    assert not guard.path.exists()


def test_wait_until_gone_returns_once_the_last_holder_goes(tmp_path: Path) -> None:
    guard = LivenessGuard.hold(tmp_path, EXECUTION)
    inheritor = subprocess.Popen(["sleep", "0.5"], pass_fds=[guard.fd])
    guard.release()
    assert wait_until_gone(tmp_path, EXECUTION, 30)
    assert inheritor.wait() == 0  # it ended by itself, and only then was the lock free


@pytest.mark.parametrize(
    ("execution_id", "name"),
    [
        ("s-1:7", "s-1%3A7.live"),
        ("abc.DEF_9-x:12", "abc.DEF_9-x%3A12.live"),
        ("..", "%2E..live"),
        ("a/b", "a%2Fb.live"),
        ("100%", "100%25.live"),
        ("é", "%C3%A9.live"),
    ],
)
def test_execution_ids_become_plain_file_names(
    tmp_path: Path, execution_id: str, name: str
) -> None:
    assert guard_path(tmp_path, execution_id) == tmp_path / name


def test_a_long_id_is_named_by_its_hash(tmp_path: Path) -> None:
    path = guard_path(tmp_path, "x" * 300)
    assert path.parent == tmp_path
    assert path.name.startswith("%%sha256-") and len(path.name) < 100
    assert guard_path(tmp_path, "x" * 301) != path


def test_an_empty_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="non-empty"):
        guard_path(tmp_path, "")


@given(st.text(min_size=1, max_size=260), st.text(min_size=1, max_size=260))
def test_names_are_plain_and_distinct_ids_never_share_one(first: str, second: str) -> None:
    directory = Path("/guards")
    a, b = guard_path(directory, first), guard_path(directory, second)
    for path in (a, b):
        assert path.parent == directory
        assert "/" not in path.name and "\x00" not in path.name
        assert not path.name.startswith(".")
        assert len(path.name.encode()) <= 255
    assert (a == b) == (first == second)


# --- across processes ---------------------------------------------------------------------------


@linux
def test_the_lock_outlives_a_killed_holder_for_as_long_as_its_child_lives(tmp_path: Path) -> None:
    live = tmp_path / "live"
    kiso = start_kiso(live, tmp_path, "sleep")
    sleeper = None
    try:
        assert kiso.stdout is not None
        sleeper = int(kiso.stdout.readline())
        assert may_be_running(live, EXECUTION)
        os.kill(kiso.pid, signal.SIGKILL)
        assert kiso.wait(30) == -signal.SIGKILL
        assert alive(sleeper)  # it inherited the guard and outlived kiso
        assert may_be_running(live, EXECUTION)
        assert not wait_until_gone(live, EXECUTION, 0.3)
        os.kill(sleeper, signal.SIGKILL)  # the pid we recorded; it is alive, so it is still ours
        assert wait_until_gone(live, EXECUTION, 30)
        assert not may_be_running(live, EXECUTION)
        assert not guard_path(live, EXECUTION).exists()  # the stale file was removed
    finally:
        if kiso.poll() is None:
            kiso.kill()
            kiso.wait()
        if kiso.stdout is not None:
            kiso.stdout.close()
        if sleeper is not None and alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)


@linux
@pytest.mark.parametrize("target", ["group", "process"])
def test_a_command_run_with_the_guard_is_gone_soon_after_kiso_dies(
    tmp_path: Path, target: str
) -> None:
    live, ws = tmp_path / "live", tmp_path / "ws"
    ws.mkdir()
    kiso = start_kiso(live, ws, "shell", "echo $$ > shell.pid; sleep 2 && touch marker")
    try:
        deadline = time.monotonic() + 30
        pid_file = ws / "shell.pid"
        while not (pid_file.exists() and pid_file.read_text().endswith("\n")):
            assert kiso.poll() is None and time.monotonic() < deadline, "the command never ran"
            time.sleep(0.01)
        started = time.monotonic()
        shell = int(pid_file.read_text())
        assert may_be_running(live, EXECUTION)  # kiso, the supervisor and the shell hold it
        if target == "group":
            os.killpg(kiso.pid, signal.SIGKILL)  # its pgid is its pid: start_new_session
        else:
            os.kill(kiso.pid, signal.SIGKILL)
        assert kiso.wait(30) == -signal.SIGKILL
        # The supervisor kills the command and goes; the last holder gone, the guard says so.
        assert wait_until_gone(live, EXECUTION, 30)
        assert not alive(shell)
    finally:
        if kiso.poll() is None:
            kiso.kill()
            kiso.wait()
        if kiso.stdout is not None:
            kiso.stdout.close()
    time.sleep(max(0.0, started + 4 - time.monotonic()))  # twice the command's sleep
    assert not (ws / "marker").exists()
