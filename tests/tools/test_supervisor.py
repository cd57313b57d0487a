"""The shell supervisor, proven with real processes: a killed kiso leaves nothing running.

A helper process stands in for kiso: it calls run_command and is killed with SIGKILL, its whole
process group or the process alone. The command would create a marker after a short sleep; the
test waits until well past that sleep and checks that the marker never appeared and that the shell
is gone. Every test kills only processes it started, by the pid or process group it recorded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kiso.tools.shell import CommandResult, SupervisorError, _Supervised, run_command

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
linux = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and Path("/proc/self/stat").exists()),
    reason="needs Linux /proc and prctl",
)

SLEEP_S = 2
COMMAND = f"echo $$ > shell.pid; sleep {SLEEP_S} && touch marker"
ESCAPING = (
    f"( setsid sh -c 'echo $$ > gc.pid; sleep {SLEEP_S} && touch gc.marker' & ); "
    "echo $$ > shell.pid; sleep 30"
)

# Stands in for kiso: runs COMMANDS (one per thread, or in the main thread) with run_command.
KISO = r"""
import os, subprocess, sys, threading
from pathlib import Path
from kiso.tools.shell import run_command

ws, how, commands = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}

def go(command):
    run_command(command, cwd=ws, env=env, timeout_ms=60_000)

if how == "main":
    go(commands[0])
else:
    threads = [threading.Thread(target=go, args=(c,)) for c in commands]
    for t in threads:
        t.start()
    if how == "sibling":
        # Another child of kiso, started while the command runs and inheriting every inheritable
        # descriptor: it must not keep the supervisor from seeing kiso's death.
        while not (ws / "shell.pid").exists():
            pass
        sibling = subprocess.Popen(["sleep", "30"], close_fds=False)
        (ws / "sibling.pid").write_text(f"{sibling.pid}\n")
    for t in threads:
        t.join()
"""


def run(command: str, cwd: Path, **kwargs: Any) -> CommandResult:
    kwargs.setdefault("timeout_ms", 30_000)
    return run_command(command, cwd=cwd, env=kwargs.pop("env", ENV), **kwargs)


def stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


def read_pid(path: Path, kiso: subprocess.Popen[bytes] | None = None, timeout: float = 30) -> int:
    """The pid a command wrote to ``path``, once it is there."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return int(text)
        if kiso is not None:
            assert kiso.poll() is None, f"kiso exited with {kiso.returncode} before {path.name}"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def start_kiso(ws: Path, how: str, *commands: str) -> subprocess.Popen[bytes]:
    """The helper kiso process, in a session of its own (so its pgid is its pid)."""
    return subprocess.Popen(
        [sys.executable, "-c", KISO, str(ws), how, *commands],
        cwd=ws,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def sigkill(kiso: subprocess.Popen[bytes], target: str) -> None:
    if target == "group":
        os.killpg(kiso.pid, signal.SIGKILL)  # the pgid is the pid we recorded: start_new_session
    else:
        os.kill(kiso.pid, signal.SIGKILL)
    assert kiso.wait(30) == -signal.SIGKILL


def wait_past_the_sleep(started: float) -> None:
    """Until the command's sleep would have ended twice over."""
    time.sleep(max(0.0, started + 2 * SLEEP_S - time.monotonic()))


# --- a killed kiso --------------------------------------------------------------------------


@linux
@pytest.mark.parametrize("target", ["group", "process"])
def test_a_killed_kiso_leaves_no_command_running(tmp_path: Path, target: str) -> None:
    kiso = start_kiso(tmp_path, "main", COMMAND)
    try:
        shell = read_pid(tmp_path / "shell.pid", kiso)
        started = time.monotonic()
        assert alive(shell)
        sigkill(kiso, target)
    finally:
        if kiso.poll() is None:
            kiso.kill()
            kiso.wait()
    wait_past_the_sleep(started)
    assert not (tmp_path / "marker").exists(), "the command went on after kiso died"
    assert not alive(shell)


@linux
def test_commands_run_from_worker_threads_all_die_with_kiso(tmp_path: Path) -> None:
    commands = [f"echo $$ > shell{n}.pid; sleep {SLEEP_S} && touch marker{n}" for n in range(3)]
    kiso = start_kiso(tmp_path, "threads", *commands)
    try:
        shells = [read_pid(tmp_path / f"shell{n}.pid", kiso) for n in range(3)]
        started = time.monotonic()
        assert all(alive(pid) for pid in shells)
        sigkill(kiso, "process")
    finally:
        if kiso.poll() is None:
            kiso.kill()
            kiso.wait()
    wait_past_the_sleep(started)
    assert sorted(p.name for p in tmp_path.glob("marker*")) == []
    assert [pid for pid in shells if alive(pid)] == []


@linux
def test_a_sibling_holding_kisos_inheritable_fds_does_not_keep_the_command_alive(
    tmp_path: Path,
) -> None:
    kiso = start_kiso(tmp_path, "sibling", COMMAND)
    sibling = None
    try:
        shell = read_pid(tmp_path / "shell.pid", kiso)
        started = time.monotonic()
        sibling = read_pid(tmp_path / "sibling.pid", kiso)
        sigkill(kiso, "process")
        assert alive(sibling)  # it outlives kiso, with everything kiso let it inherit
        wait_past_the_sleep(started)
        assert not (tmp_path / "marker").exists()
        assert not alive(shell)
    finally:
        if kiso.poll() is None:
            kiso.kill()
            kiso.wait()
        if sibling is not None and alive(sibling):
            os.kill(sibling, signal.SIGKILL)


@linux
@pytest.mark.parametrize("target", ["group", "process"])
def test_a_setsid_double_forked_grandchild_dies_with_kiso_too(tmp_path: Path, target: str) -> None:
    kiso = start_kiso(tmp_path, "main", ESCAPING)
    try:
        shell = read_pid(tmp_path / "shell.pid", kiso)
        grandchild = read_pid(tmp_path / "gc.pid", kiso)
        started = time.monotonic()
        shell_stat, gc_stat = stat_fields(shell), stat_fields(grandchild)
        assert shell_stat is not None and gc_stat is not None
        assert int(gc_stat[3]) == grandchild != int(shell_stat[3])  # a session of its own
        supervisor = int(shell_stat[1])
        # Its parent exited, and it was re-parented to the supervisor (the subreaper), not init.
        deadline = time.monotonic() + 10
        while (fields := stat_fields(grandchild)) is not None and int(fields[1]) != supervisor:
            assert time.monotonic() < deadline, "the grandchild was not adopted by the supervisor"
            time.sleep(0.01)
        sigkill(kiso, target)
    finally:
        if kiso.poll() is None:
            kiso.kill()
            kiso.wait()
    wait_past_the_sleep(started)
    assert not (tmp_path / "gc.marker").exists(), "the escaped grandchild went on after kiso died"
    assert not alive(grandchild)
    assert not alive(shell)


# --- what escapes the group is still reached --------------------------------------------------


@linux
def test_an_escaped_grandchild_left_behind_is_a_stray_and_is_killed(tmp_path: Path) -> None:
    result = run(
        "( setsid sh -c 'echo $$ > gc.pid; exec sleep 300' & ); "
        "until [ -s gc.pid ]; do sleep 0.01; done; echo done",
        tmp_path,
    )
    assert result.exit_code == 0
    assert result.output == "done\n"
    assert result.strays_killed
    assert not alive(read_pid(tmp_path / "gc.pid"))


@linux
def test_a_timeout_reaches_an_escaped_grandchild(tmp_path: Path) -> None:
    result = run(
        "( setsid sh -c 'echo $$ > gc.pid; exec sleep 300' & ); sleep 300", tmp_path, timeout_ms=500
    )
    assert result.timed_out
    assert result.exit_code is None
    assert not alive(read_pid(tmp_path / "gc.pid"))


@linux
def test_a_cancellation_reaches_a_grandchild_that_double_forked_twice(tmp_path: Path) -> None:
    flip = threading.Event()
    command = (
        "( ( setsid sh -c 'echo $$ > gc.pid; sleep 300' & ) & ); "
        "until [ -s gc.pid ]; do sleep 0.01; done; touch ready; sleep 300"
    )
    threading.Thread(
        target=lambda: (read_pid(tmp_path / "gc.pid"), flip.set()), daemon=True
    ).start()
    result = run(command, tmp_path, cancelled=flip.is_set)
    assert result.cancelled
    assert not alive(read_pid(tmp_path / "gc.pid"))


# --- the command's place and what it inherits ----------------------------------------------------


@linux
def test_the_command_leads_its_own_session_under_a_supervisor_in_another(tmp_path: Path) -> None:
    result = run("cat /proc/$$/stat", tmp_path)
    fields = result.output[result.output.rfind(")") + 2 :].split()
    pid = int(result.output.split()[0])
    ppid, pgrp, session = (int(f) for f in fields[1:4])
    assert pgrp == session == pid  # its own process group and session
    assert ppid != os.getpid()  # started by the supervisor, not by us
    assert os.getsid(0) != session


@pytest.mark.parametrize(
    "env",
    [{}, {"LC_ALL": "C"}, {"ONLY": "this", "BIG": "x" * 100_000, "ODD": "\udcff é"}],
    ids=["empty", "c-locale", "odd"],
)
def test_the_command_gets_exactly_the_environment_given(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The supervisor is a Python, which adds LC_CTYPE to its own environment in a C locale (PEP
    538): the command must not see that, nor anything else bash itself would not add."""
    direct = subprocess.run(
        ["/bin/bash", "-c", "env -0"], cwd=tmp_path, env=env, capture_output=True, check=True
    ).stdout
    result = run("env -0", tmp_path, env=env, output_limit=1_000_000)
    assert result.exit_code == 0
    assert result.output == direct.decode("utf-8", "replace")


def test_exit_statuses_come_through_exactly(tmp_path: Path) -> None:
    assert run("exit 300", tmp_path).exit_code == 300 % 256
    assert run("kill -TERM $$", tmp_path).exit_code == -signal.SIGTERM
    assert run("kill -KILL $$", tmp_path).exit_code == -signal.SIGKILL
    assert run("trap 'exit 4' TERM; kill -TERM $$; sleep 1", tmp_path).exit_code == 4


def test_a_shell_that_does_not_exist_is_an_oserror_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as raised:
        run("true", tmp_path, shell=str(tmp_path / "no-such-shell"))
    assert raised.value.filename == str(tmp_path / "no-such-shell")


def test_another_shell_can_be_named(tmp_path: Path) -> None:
    assert run("echo $0", tmp_path, shell="/bin/sh").output == "/bin/sh\n"


def test_pass_fds_reach_the_command(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "through.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        result = run(f"echo passed >&{fd}", tmp_path, pass_fds=[fd])
        unpassed = run(f"echo leaked >&{fd}", tmp_path)
    finally:
        os.close(fd)
    assert result.exit_code == 0
    assert unpassed.exit_code != 0  # without pass_fds the descriptor is not there
    assert (tmp_path / "through.txt").read_text() == "passed\n"


@pytest.mark.parametrize("bad", [[0], [2], [-1]])
def test_pass_fds_below_3_are_refused(tmp_path: Path, bad: list[int]) -> None:
    with pytest.raises(ValueError, match="pass_fds"):
        run("true", tmp_path, pass_fds=bad)


def open_fds() -> dict[int, bool]:
    """Our open descriptors and whether each is inheritable (not the listing's own, closed)."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.get_inheritable(int(name))
        except OSError:
            continue
    return fds


@linux
def test_no_descriptor_the_call_opens_is_inheritable(tmp_path: Path) -> None:
    before = open_fds()
    results: list[CommandResult] = []
    worker = threading.Thread(
        target=lambda: results.append(
            run("touch started; until [ -e go ]; do sleep 0.01; done", tmp_path)
        )
    )
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        opened = {fd: inheritable for fd, inheritable in open_fds().items() if fd not in before}
        assert len(opened) >= 3  # the output, the status and the control pipe at least
        assert [fd for fd, inheritable in opened.items() if inheritable] == []
    finally:
        (tmp_path / "go").touch()
        worker.join()
    assert results[0].exit_code == 0


# --- the supervisor's own signals -----------------------------------------------------------------


@linux
def test_end_of_file_on_the_control_pipe_kills_the_command(tmp_path: Path) -> None:
    """What the supervisor sees when kiso dies, whatever the kernel says about it."""
    sup = _Supervised(COMMAND, "/bin/bash", tmp_path, ENV, ())
    try:
        shell = read_pid(tmp_path / "shell.pid")
        started = time.monotonic()
        assert sup.control is not None
        os.close(sup.control)
        sup.control = None
        while not sup.eof:
            sup.read_status(1.0)
        assert sup.exit_code is None  # nothing to report to a kiso that is gone
    finally:
        sup.close()
    wait_past_the_sleep(started)
    assert not (tmp_path / "marker").exists()
    assert not alive(shell)


@linux
def test_sigterm_to_the_supervisor_kills_the_command_and_the_call_fails(tmp_path: Path) -> None:
    def stop_the_supervisor() -> None:
        fields = stat_fields(read_pid(tmp_path / "shell.pid"))
        assert fields is not None
        os.kill(int(fields[1]), signal.SIGTERM)  # the parent of the shell we recorded

    threading.Thread(target=stop_the_supervisor, daemon=True).start()
    with pytest.raises(SupervisorError, match="supervisor ended before the command"):
        run(COMMAND, tmp_path)
    started = time.monotonic()
    assert not alive(read_pid(tmp_path / "shell.pid"))
    wait_past_the_sleep(started)
    assert not (tmp_path / "marker").exists()
