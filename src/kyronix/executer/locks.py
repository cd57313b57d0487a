"""Per-file edit locks: two calls that change the same file never interleave.

A line edit reads the file, changes some lines and writes the whole file back (atomically, but
from what it read). Two of them at once on one file, from threads of one executer or from two
executer processes, would each write back its own copy and one edit would be lost without a
word. So every call of a tool that is not read-only holds the lock of each file path it names
(``path``, both ends of a move or copy) for the whole call, and calls on the same file take
turns; calls on different files do not wait for each other.

The lock of a file is ``flock(LOCK_EX)`` on ``<directory>/<sha256 of its real path>.lock``
(directory 0700, files 0600), in the executer's state directory (beside the receipt store), so
every executer process sharing that directory takes turns with every other. A lock is keyed by
the path, not the inode, because an atomic write replaces the inode on every edit. The holder
removes its lock file before it lets go; a waiter that locked a file which was removed meanwhile
sees that (its descriptor is no longer the file at that path) and starts again, so a lock never
splits in two and no lock file is left behind.

``flock`` belongs to an open file description: another ``open`` of the same file, in this
process too, conflicts with it, which is what makes threads take turns as well. It is advisory
(a process that does not ask is not stopped: an editor, ``git``, the ``terminal`` tool) and
local (keep the directory off NFS). A call that cannot get a lock within ``timeout_s`` fails
loudly (``errorType: "Busy"``, naming the holder's pid) instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from kyronix.errors import ToolFailure

__all__ = ["DEFAULT_TIMEOUT_S", "FileLocks", "HeldLocks"]

DEFAULT_TIMEOUT_S = 120.0
"""How long a call waits for the lock of a file another call is editing."""

_FIRST_WAIT_S = 0.001
_MAX_WAIT_S = 0.05


class FileLocks:
    """The edit locks of one state directory (made on first use)."""

    def __init__(self, directory: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.directory = directory
        self.timeout_s = timeout_s

    def lock_path(self, path: Path | str) -> Path:
        """The lock file of ``path`` (a real absolute path: the sandbox resolved it)."""
        key = os.fsencode(os.fspath(path))
        return self.directory / f"{hashlib.sha256(key).hexdigest()[:40]}.lock"

    def try_acquire(self, paths: Iterable[Path | str]) -> HeldLocks | str:
        """Lock every path now, or none: the held locks, or (when one is taken) the text that
        names its holder. Never waits."""
        self._ensure_directory()
        held = HeldLocks()
        try:
            for lock_file, shown in self._wanted(paths):
                got = _try_one(lock_file)
                if isinstance(got, str):
                    held.release()
                    return f"{shown} is being changed by another call{got}"
                held.add(got)
        except BaseException:
            held.release()
            raise
        return held

    def acquire(self, paths: Iterable[Path | str]) -> HeldLocks:
        """Wait (in this thread) until every path is locked; see :meth:`acquire_async`."""
        wanted = list(paths)
        deadline = time.monotonic() + self.timeout_s
        wait = _FIRST_WAIT_S
        while True:
            got = self.try_acquire(wanted)
            if isinstance(got, HeldLocks):
                return got
            if time.monotonic() >= deadline:
                raise _busy(got)
            time.sleep(wait)
            wait = min(wait * 2, _MAX_WAIT_S)

    async def acquire_async(self, paths: Iterable[Path | str]) -> HeldLocks:
        """Wait until every path is locked, all at once or not at all (so two calls on the same
        pair of files cannot deadlock), without holding a thread while waiting (the handler
        that holds a lock may need one to finish). Raises
        :class:`~kyronix.errors.ToolFailure` (``Busy``) after ``timeout_s``; cancelled while
        waiting, it holds nothing."""
        wanted = list(paths)
        deadline = time.monotonic() + self.timeout_s
        wait = _FIRST_WAIT_S
        while True:
            got = self.try_acquire(wanted)
            if isinstance(got, HeldLocks):
                return got
            if time.monotonic() >= deadline:
                raise _busy(got)
            await asyncio.sleep(wait)
            wait = min(wait * 2, _MAX_WAIT_S)

    def _wanted(self, paths: Iterable[Path | str]) -> list[tuple[Path, str]]:
        unique = {str(self.lock_path(p)): os.fspath(p) for p in paths}
        return [(Path(lock_file), shown) for lock_file, shown in sorted(unique.items())]

    def _ensure_directory(self) -> None:
        try:
            if not self.directory.is_dir():
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ToolFailure(
                f"cannot make the edit-lock directory {self.directory}: "
                f"{exc.strerror or exc}; nothing was changed. Make the executer's state "
                f"directory writable (KYRONIX_HOME, or the directory of --receipts)",
                error_type="ToolError",
            ) from None


class HeldLocks:
    """Locks taken by :meth:`FileLocks.acquire`; :meth:`release` lets them all go (once)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[tuple[Path, int]] = []

    def add(self, item: tuple[Path, int]) -> None:
        self._held.append(item)

    def __len__(self) -> int:
        return len(self._held)

    def release(self) -> None:
        held, self._held = self._held, []
        for lock_file, fd in reversed(held):
            # Remove the file while it is still ours: a waiter that locks the old file after us
            # sees it is gone and starts again on a new one.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_file)
            os.close(fd)

    def __enter__(self) -> HeldLocks:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _busy(what: str) -> ToolFailure:
    return ToolFailure(
        f"{what} and stayed locked past the edit-lock timeout; nothing was changed. Run this "
        f"call again when that one has finished",
        error_type="Busy",
    )


def _try_one(lock_file: Path) -> tuple[Path, int] | str:
    """The locked file and its descriptor, or the holder (`` (pid N)`` or ``""``)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    while True:
        fd = os.open(lock_file, flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            return holder
        except BaseException:
            os.close(fd)
            raise
        if _is_file_at(fd, lock_file):
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()}\n".encode())
            return lock_file, fd
        os.close(fd)  # removed by its holder between our open and our lock: start again


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").split()
    except OSError:
        return ""
    return f" (pid {text[1]})" if len(text) >= 2 and text[0] == "pid" else ""


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not removed or replaced meanwhile)."""
    try:
        at_path = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (at_path.st_dev, at_path.st_ino) == (opened.st_dev, opened.st_ino)
