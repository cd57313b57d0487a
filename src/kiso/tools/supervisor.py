"""The shell supervisor: the small process that stands between kiso and every command it runs.

:func:`kiso.tools.shell.run_command` starts it as ``python -I -S supervisor.py KISO_PID SHELL
COMMAND [WRAPPER...]`` in a session of its own, so a signal to kiso's process group never reaches
it, with

* fd 0: the read end of the *control pipe*. kiso holds the only write end (the pipe is created
  close-on-exec and the supervisor is started with ``close_fds``, so no other child of kiso
  inherits it). kiso first sends the command's environment (:func:`encode_environment`); after
  that, one ``k`` byte asks for the command to be stopped (timeout, cancellation), and
  end-of-file means kiso is gone, however it died, ``kill -9`` included;
* fd 1: the *status pipe* back to kiso, one line per fact: ``pid N`` (the command started),
  ``error ERRNO`` (it could not be started), ``exit CODE`` (the shell ended: its status, or
  ``-signal``), ``strays 0|1`` (whether processes it left behind had to be killed);
* fd 2: the write end of the output pipe, which the command gets as its stdout and stderr;
* the descriptors kiso was asked to pass on (``pass_fds``), inherited as they are.

The command runs as ``SHELL -c COMMAND`` in a new session (so its own process group), with stdin
from ``/dev/null``; with a WRAPPER (the OS sandbox's ``bwrap ... --``, :mod:`kiso.tools.sandbox`) as
``WRAPPER... SHELL -c COMMAND``. The supervisor then waits for whichever comes first:

* the shell exits: its status is reported; any descendant still alive 0.2 s later is a stray and is
  stopped like a timed-out command;
* ``k``: every process of the command is sent SIGTERM, given up to 1 s, then sent SIGKILL;
* kiso dies (end-of-file on the control pipe; on Linux also ``PR_SET_PDEATHSIG``), or the
  supervisor itself receives SIGTERM, SIGHUP or SIGINT: every process of the command is sent SIGKILL
  at once, as the crash of the machine would, so nothing it would have done later happens.

"Every process of the command" is, on Linux, every live process whose parent chain leads to the
supervisor, read from ``/proc``, plus the live members of the command's process group. The
supervisor makes itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so a descendant that
double-forks or calls ``setsid`` to leave the group is re-parented to the supervisor rather than to
init, and is found and killed too. Each kill is aimed through a pidfd after checking the process's
start time, so a recycled pid is never signalled. Where ``prctl`` or ``/proc`` are missing
(macOS), parent death is still noticed through the control pipe, but only the command's process
group can be found and killed: a process that calls ``setsid`` escapes there.

Stdlib only, and as little of it as possible: this runs once per command, so its start-up time is
part of every shell call (measured in docs/shell.md). It must never import kiso.
"""

from __future__ import annotations

import os
import select
import sys
import time

# Not typing.TYPE_CHECKING: importing typing would cost more than the rest of the start-up.
TYPE_CHECKING = False

if TYPE_CHECKING:
    import signal
else:  # signal.py imports enum, which costs more than the rest of this script together
    try:
        import _signal as signal
    except ImportError:  # pragma: no cover - not CPython
        import signal

__all__ = ["SCRIPT", "main"]

SCRIPT = os.path.abspath(__file__)
"""The file to run with ``python -I -S``."""

CTL, STATUS, OUT = 0, 1, 2
KILL_REQUEST = b"k"

TERM_GRACE_S = 1.0
"""How long processes sent SIGTERM get before SIGKILL."""
KILL_WAIT_S = 2.0
"""How long to keep sending SIGKILL until every process is gone."""
STRAY_GRACE_S = 0.2
"""How long processes still alive when the shell exits get to end by themselves."""
TICK_S = 0.02

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def main(argv: list[str]) -> int:
    """Run one command under supervision; see the module docstring. The exit status is 0."""
    parent, shell, command, wrapper = int(argv[1]), argv[2], argv[3], argv[4:]
    sup = _Supervisor(parent)
    env = read_environment(CTL)
    if env is None or sup.should_not_start():
        return 0
    try:
        leader = _spawn(shell, command, env, wrapper)
    except OSError as exc:
        sup.report(f"error {exc.errno or 0}")
        return 0
    sup.leader = leader
    sup.report(f"pid {leader}")
    sup.run()
    sup.reap_all(TERM_GRACE_S)
    return 0


class _Supervisor:
    def __init__(self, parent: int) -> None:
        self.me = os.getpid()
        self.parent = parent
        self.leader = 0
        self.leader_status: int | None = None
        self.stopping = False
        """SIGTERM, SIGHUP or SIGINT (kiso's death on Linux) arrived."""
        self.gone = False
        """kiso closed the control pipe: it is dead, or wants everything killed now."""
        self.kill_requested = False
        self.has_proc = os.path.isdir("/proc/self")
        self.pidfds = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
        linux = sys.platform.startswith("linux")
        self.subreaper = linux and _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        self.wake_r, wake_w = os.pipe()
        for fd in (self.wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _ignore)
        for sig in _STOP_SIGNALS:
            signal.signal(sig, self._on_stop)
        if linux:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        self.poller = select.poll()
        self.poller.register(CTL, select.POLLIN)
        self.poller.register(self.wake_r, select.POLLIN)

    def _on_stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def should_not_start(self) -> bool:
        """kiso died (too early for the death signal to tell) or stopped the command already."""
        self.check_control(0)
        return self.must_kill_now or self.kill_requested or os.getppid() != self.parent

    def report(self, line: str) -> None:
        try:  # noqa: SIM105 - contextlib costs start-up time
            os.write(STATUS, line.encode() + b"\n")
        except OSError:  # kiso is gone: nobody is listening
            pass

    # -- waiting ----------------------------------------------------------------------------

    def check_control(self, timeout_s: float | None) -> None:
        """Wait up to ``timeout_s`` (None: forever) for a signal or a message from kiso."""
        ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        for fd, _ in self.poller.poll(ms):
            if fd == CTL:
                try:
                    data = os.read(CTL, 64)
                except OSError:
                    data = b""
                if not data:
                    self.gone = True
                    self.poller.unregister(CTL)
                elif KILL_REQUEST in data:
                    self.kill_requested = True
            else:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
        self.reap()

    def reap(self) -> bool:
        """Reap every child that has ended: the shell, and orphans adopted as subreaper. True when
        no child is left at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            if pid == self.leader:
                self.leader_status = status

    def reap_all(self, timeout_s: float) -> None:
        """Reap the last children (killed just now, they may not be zombies yet), so that none is
        left for init to reap later: the command's group is gone when the call returns."""
        deadline = time.monotonic() + timeout_s
        while not self.reap() and time.monotonic() < deadline:
            time.sleep(TICK_S / 4)

    @property
    def must_kill_now(self) -> bool:
        return self.gone or self.stopping

    # -- the life of one command ------------------------------------------------------------

    def run(self) -> None:
        while self.leader_status is None and not (self.must_kill_now or self.kill_requested):
            self.check_control(None)
        if self.leader_status is not None and not (self.must_kill_now or self.kill_requested):
            self.report(f"exit {os.waitstatus_to_exitcode(self.leader_status)}")
            strays = self.wait_gone(STRAY_GRACE_S, interruptible=True) is False
            if strays:
                self.terminate()
            self.report(f"strays {int(strays)}")
            return
        if self.must_kill_now:
            self.kill_all()
            return
        self.terminate()
        self.report(f"exit {self.exit_code()}")
        self.report("strays 0")

    def exit_code(self) -> int:
        if self.leader_status is None:  # it could not be killed (uninterruptible sleep)
            return -int(signal.SIGKILL)
        return os.waitstatus_to_exitcode(self.leader_status)

    def terminate(self) -> None:
        """SIGTERM everything, up to 1 s for it to go, then SIGKILL (at once if kiso dies)."""
        self.signal_all(signal.SIGTERM)
        if self.wait_gone(TERM_GRACE_S, interruptible=True) is False:
            self.kill_all()

    def kill_all(self) -> None:
        """SIGKILL everything, again and again (a fork may race a kill), until nothing is left."""
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            self.reap()
            if not self.signal_all(signal.SIGKILL) or time.monotonic() >= deadline:
                break
            time.sleep(TICK_S)
        self.wait_gone(max(0.0, deadline - time.monotonic()), interruptible=False)

    def wait_gone(self, timeout_s: float, *, interruptible: bool) -> bool | None:
        """True once no process is left; False after ``timeout_s``; None when interrupted by a
        reason to kill everything now (``interruptible``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.reap()
            if not self.alive():
                return True
            if interruptible and self.must_kill_now:
                self.kill_all()
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.check_control(min(TICK_S, remaining))

    # -- finding and signalling the command's processes -------------------------------------

    def alive(self) -> bool:
        if self.has_proc:
            return bool(self.targets())
        return self.leader_status is None or _group_exists(self.leader)

    def targets(self) -> dict[int, bytes]:
        """The live descendants of the supervisor and live members of the command's group, each
        with its start time (from ``/proc``; empty where there is none)."""
        if not self.has_proc:
            return {}
        if self.subreaper and self.reap():
            # No child at all, so no descendant: an orphan would have been re-parented to us.
            # This spares a scan of /proc (about 60 us a process) when a command ends cleanly.
            return {}
        children: dict[int, list[int]] = {}
        found: dict[int, bytes] = {}
        live: dict[int, bytes] = {}
        for pid, ppid, pgrp, state, start in _processes():
            children.setdefault(ppid, []).append(pid)
            if state not in (b"Z", b"X"):
                live[pid] = start
                if pgrp == self.leader and not self.subreaper:  # else they are descendants
                    found[pid] = start
        stack = list(children.get(self.me, ()))
        while stack:
            pid = stack.pop()
            if pid in live:
                found[pid] = live[pid]
            stack.extend(children.get(pid, ()))
        return found

    def signal_all(self, sig: int) -> bool:
        """Send ``sig`` to every process of the command; whether there was any."""
        sent = False
        if self.leader_status is None or not self.has_proc:
            # The group id cannot have been recycled while its leader is unreaped; after that it
            # is used only where /proc cannot list the processes one by one.
            try:
                os.killpg(self.leader, sig)
                sent = self.leader_status is None or not self.has_proc
            except (ProcessLookupError, PermissionError):
                pass
        for pid, start in self.targets().items():
            self.kill_checked(pid, start, sig)
            sent = True
        return sent

    def kill_checked(self, pid: int, start: bytes, sig: int) -> None:
        """Signal ``pid`` only if it is still the process that started at ``start``."""
        if self.pidfds:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                return
            except OSError:  # an old kernel: no pidfds
                self.pidfds = False
            else:
                try:
                    if _start_time(pid) == start:
                        signal.pidfd_send_signal(fd, sig)
                except OSError:
                    pass
                finally:
                    os.close(fd)
                return
        if _start_time(pid) == start:
            try:  # noqa: SIM105
                os.kill(pid, sig)
            except OSError:
                pass


def _ignore(signum: int, frame: object) -> None:
    return None


def encode_environment(env: dict[str, str]) -> bytes:
    """The command's environment as kiso sends it on the control pipe: an 8-byte length, then
    ``NAME=value`` entries separated by NUL bytes."""
    blob = b"\0".join(os.fsencode(name) + b"=" + os.fsencode(value) for name, value in env.items())
    return len(blob).to_bytes(8, "big") + blob


def read_environment(fd: int) -> dict[str, str] | None:
    """Read what :func:`encode_environment` wrote; None when kiso went away first.

    The environment comes this way rather than as the supervisor's own: Python adds
    ``LC_CTYPE=C.UTF-8`` to its environment at start-up when the locale is C (PEP 538), and the
    command must get exactly the environment it was given. (Not argv: that is world-readable.)
    """
    data = b""
    size: int | None = None
    while size is None or len(data) < size + 8:
        try:
            chunk = os.read(fd, 65_536 if size is None else size + 8 - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
        if size is None and len(data) >= 8:
            size = int.from_bytes(data[:8], "big")
    env = {}
    for entry in data[8:].split(b"\0") if size else ():
        name, _, value = entry.partition(b"=")
        env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def _spawn(shell: str, command: str, env: dict[str, str], wrapper: list[str]) -> int:
    """Start ``shell -c command`` in a new session, stdin from /dev/null, stdout on our fd 2;
    with a ``wrapper`` (the sandbox's ``bwrap ... --``), ``wrapper shell -c command``."""
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, OUT, 1),
    ]
    # Python ignores SIGPIPE and SIGXFSZ; the command gets the defaults, as subprocess gives them.
    defaults = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, *_STOP_SIGNALS)
    argv = [*wrapper, shell, "-c", command]
    path = wrapper[0] if wrapper else shell
    try:
        return os.posix_spawn(
            path, argv, env, file_actions=actions, setsigdef=defaults, setsigmask=(),
            setsid=True,
        )  # fmt: skip
    except NotImplementedError:  # no POSIX_SPAWN_SETSID: a process group of its own will do
        return os.posix_spawn(
            path, argv, env, file_actions=actions, setsigdef=defaults, setsigmask=(),
            setpgroup=0,
        )  # fmt: skip


def _prctl(option: int, arg: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (ImportError, OSError, AttributeError):
        return False
    prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
    prctl.restype = ctypes.c_int
    return int(prctl(option, arg, 0, 0, 0)) == 0


def _processes() -> list[tuple[int, int, int, bytes, bytes]]:
    """(pid, ppid, pgrp, state, start time) of every process in /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        if fields is not None and len(fields) > 19:
            out.append((int(entry), int(fields[1]), int(fields[2]), fields[0], fields[19]))
    return out


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after ``(comm)``, which may hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _start_time(pid: int) -> bytes | None:
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv))
