"""The liveness guard: may the processes of an interrupted execution still be running?

Before a handler with side effects runs, the runtime holds a guard for its execution:
``<directory>/<execution id>.live`` (directory 0700, file 0600), opened close-on-exec and locked
with ``flock(LOCK_EX)``. Its descriptor goes to the tool (``ToolContext.inherit_fds``), and from
there to every process the tool starts (``run_command(pass_fds=...)``): the shell supervisor, the
command and whatever it starts without closing the descriptor. They all share one open file
description, so the lock is held for as long as any of them lives, whether kiso is still running
or was killed with ``kill -9``.

A later process (``kiso resume``) asks :func:`may_be_running` before it rules on an execution the
crash left uncertain: False means no process that inherited the guard is alive (and the stale file
is removed); True means one may still be at work, so "skip it" or "rerun it" could race it.
:func:`wait_until_gone` waits for that to change.

What the guard cannot see: a process that closed the descriptor, or one started through another
service (``systemd-run``, ``at``, a daemon, ``ssh``) that never had it. docs/shell.md says more.

The lock is ``flock``, per open file description: it is not inherited across ``fork`` as a new
lock but shared, it is released only when the last descriptor is closed, and another open of the
same file (in this process too) conflicts with it. ``flock`` is advisory and local: on NFS it may
be emulated with ``fcntl`` locks, which do not behave this way; keep the directory local.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from pathlib import Path
from types import TracebackType

from kiso.kernel.errors import UsageError

__all__ = ["SUFFIX", "LivenessGuard", "guard_path", "may_be_running", "wait_until_gone"]

SUFFIX = ".live"
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_MAX_NAME = 200
_POLL_S = 0.05


def guard_path(directory: Path, execution_id: str) -> Path:
    """The guard file of ``execution_id`` in ``directory``; the name is always a plain file name.

    Letters, digits, ``.``, ``_`` and ``-`` are kept; every other character (``:`` in
    ``<session id>:<seq>``) becomes ``%XX`` per UTF-8 byte, and so does a leading ``.``, so
    distinct ids give distinct names and none is hidden, ``.`` or ``..``. An id whose name would
    be longer than 200 characters is named by its SHA-256 instead.
    """
    if not isinstance(execution_id, str) or not execution_id:
        raise UsageError(f"an execution id is a non-empty string, got {execution_id!r}")
    name = "".join(
        char if char in _SAFE and not (i == 0 and char == ".") else _escape(char)
        for i, char in enumerate(execution_id)
    )
    if len(name) > _MAX_NAME:  # "%%" never comes out of the escaping: no clash with a short name
        digest = hashlib.sha256(execution_id.encode("utf-8", "surrogatepass")).hexdigest()
        name = f"%%sha256-{digest}"
    return directory / f"{name}{SUFFIX}"


def _escape(char: str) -> str:
    return "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))


class LivenessGuard:
    """A held guard: the locked file of one execution and its descriptor (see the module doc)."""

    __slots__ = ("_fd", "execution_id", "path")

    def __init__(self, path: Path, fd: int, execution_id: str) -> None:
        self.path = path
        self.execution_id = execution_id
        self._fd: int | None = fd

    @classmethod
    def hold(cls, directory: Path, execution_id: str) -> LivenessGuard:
        """Create (or take over a stale) guard file for ``execution_id`` and lock it.

        Raises UsageError when the guard is held already: by this process, or by processes an
        earlier holder of the same id started (an execution id names one attempt; a rerun has a
        new one). An OSError (a full disk) leaves nothing behind: no guard file, and no
        directory this call created.
        """
        path = guard_path(directory, execution_id)
        for attempt in range(3):
            made = not directory.is_dir()
            try:
                if made:
                    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                    os.chmod(directory, 0o700)
                return cls._hold(path, execution_id)
            except FileNotFoundError:  # the directory was removed meanwhile (empty): again
                if attempt == 2:
                    raise
            except OSError:
                if made:
                    with contextlib.suppress(OSError):  # not empty: another guard is in it
                        directory.rmdir()
                raise
        raise AssertionError("unreachable")

    @classmethod
    def _hold(cls, path: Path, execution_id: str) -> LivenessGuard:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        while True:
            fd = os.open(path, flags, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise UsageError(
                    f"the liveness guard of execution {execution_id!r} ({path}) is held already: "
                    f"processes of that execution may still be running"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            if _is_file_at(fd, path):
                break
            os.close(fd)  # removed as stale between our open and our lock: start again
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} execution {execution_id}\n".encode())
        except BaseException:
            with contextlib.suppress(OSError):  # locked by us: nobody else is using it
                os.unlink(path)
            os.close(fd)
            raise
        return cls(path, fd, execution_id)

    @property
    def fd(self) -> int:
        """The locked descriptor, to pass on to the processes the execution starts."""
        if self._fd is None:
            raise UsageError(f"the liveness guard of {self.execution_id!r} was released")
        return self._fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> bool:
        """Close our descriptor and remove the file, unless a process that inherited the
        descriptor still holds the lock (then the file stays, for :func:`may_be_running`).
        Returns whether the lock is free. Calling it again does nothing and returns True."""
        if self._fd is None:
            return True
        fd, self._fd = self._fd, None
        os.close(fd)
        return not may_be_running(self.path.parent, self.execution_id)

    def __enter__(self) -> LivenessGuard:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self._fd is not None else "released"
        return f"LivenessGuard({self.execution_id!r}, {state})"


def may_be_running(directory: Path, execution_id: str) -> bool:
    """Whether a process holding the guard of ``execution_id`` may still be alive.

    False when there is no guard file, or when its lock can be taken: then nobody holds it any
    more, and the stale file is removed. True while the lock is held. An error opening the file
    other than its absence (permissions) is raised, since it cannot be answered.
    """
    path = guard_path(directory, execution_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        if _is_file_at(fd, path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return False
    finally:
        os.close(fd)


def wait_until_gone(directory: Path, execution_id: str, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for :func:`may_be_running` to be False; whether it is."""
    deadline = time.monotonic() + timeout
    while may_be_running(directory, execution_id):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(_POLL_S, remaining))
    return True


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not unlinked or replaced meanwhile)."""
    try:
        at_path = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (at_path.st_dev, at_path.st_ino) == (opened.st_dev, opened.st_ino)
