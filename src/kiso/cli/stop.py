"""A polite stop: SIGTERM (what CI sends on cancel) and SIGHUP (a closed terminal) stop the run as
esc does, then kiso exits.

The first signal asks the run to stop: the running command's process group is ended, its
execution is recorded ``aborted`` (not uncertain), the run ends ``aborted`` by the signal's name
(``SIGTERM``, ``SIGHUP``), and the session resumes with no ruling. kiso then exits with 128 plus
the signal's number: 143 after SIGTERM, 129 after SIGHUP.

A second stop signal while stopping, or a stop that has not finished within :data:`STOP_GRACE_S`
seconds, ends the process hard, by the signal's default action: then what was running is
recovered as after a crash (docs/durability.md).

A SIGHUP because the terminal went away leaves stdout and stderr pointing at nothing: they are
moved to ``/dev/null`` first, so the stop is recorded although nothing can be shown.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["STOP_GRACE_S", "STOP_SIGNALS", "Stop", "detach_hung_up", "exit_code", "hard"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 20.0
"""How long a polite stop may take before kiso ends itself hard (a shell command's process group
gets a few seconds between SIGTERM and SIGKILL; the rest is writing the records)."""
_LAST_WORD_S = 5.0
"""After the grace, how long the main thread has to act on the signal before kiso exits anyway."""


def exit_code(signum: int) -> int:
    """The conventional exit status of a process stopped by ``signum``: 128 + its number."""
    return 128 + signum


class Stop:
    """The stop signals of one kiso process: the first calls ``on_stop`` with the signal's number
    (and starts the watchdog), a second ends the process hard. ``install`` sets the handlers with
    :func:`signal.signal`, so they run on the main thread as soon as the signal arrives (in an
    asyncio program too, before the loop handles what else woke it: a hung-up terminal's end of
    input); ``on_stop`` must do only what is safe there. :meth:`done` once the stop finished."""

    def __init__(self, on_stop: Callable[[int], None], *, grace: float = STOP_GRACE_S) -> None:
        self.on_stop = on_stop
        self.grace = grace
        self.signum: int | None = None
        """The first stop signal received, or None."""
        self._finished = threading.Event()
        self._previous: dict[int, object] = {}

    @property
    def by(self) -> str:
        """Who stopped the run, as the log records it: ``SIGTERM`` or ``SIGHUP``."""
        return signal.Signals(self.signum).name if self.signum is not None else "user"

    @property
    def code(self) -> int | None:
        return exit_code(self.signum) if self.signum is not None else None

    def install(self) -> Stop:
        """Handle the stop signals (the main thread only: elsewhere, as Python allows no handler
        there, they keep their default action). A delegated child keeps the default action: its
        parent stops it and, when resumed, carries its open run on (docs/subagents.md)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        if os.environ.get("KISO_SUBAGENT_DEPTH", "").strip() not in ("", "0"):
            return self
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            detach_hung_up()  # before anything tries to show the stop on a terminal that is gone
        self.handle(signum)

    def handle(self, signum: int) -> None:
        if self.signum is not None:
            hard(signum)  # asked twice: stop waiting
            return
        self.signum = signum
        threading.Thread(target=self._watch, args=(signum,), name="kiso-stop", daemon=True).start()
        self.on_stop(signum)

    def _watch(self, signum: int) -> None:
        if self._finished.wait(self.grace):
            return
        os.kill(os.getpid(), signum)  # as if asked twice: the handler, on the main thread, ends it
        if not self._finished.wait(_LAST_WORD_S):
            os._exit(exit_code(signum))  # the main thread never came back to run the handler

    def done(self) -> None:
        """The stop finished (or there was none): the watchdog stands down."""
        self._finished.set()


def detach_hung_up() -> None:
    """Point stdout and stderr at /dev/null where they are a terminal that hung up (a closed
    window, a dropped ssh connection): the run's end is still recorded, and writes that nobody
    can read no longer fail with EIO on the way."""
    for fd in (1, 2):
        if _hung_up(fd):
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)
            except OSError:
                pass
            finally:
                os.close(null)


def _hung_up(fd: int) -> bool:
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):  # a hung-up terminal is no tty any more
            return False
        watch = select.poll()
        watch.register(fd, select.POLLOUT)
        return any(mask & select.POLLHUP for _, mask in watch.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def hard(signum: int) -> None:
    """End this process by ``signum``'s default action (what it would have done without kiso's
    handler): recovery then applies, as after any crash."""
    try:
        signal.signal(signum, signal.SIG_DFL)
    except ValueError:  # not the main thread: no handler can be reset here
        os._exit(exit_code(signum))
    os.kill(os.getpid(), signum)
