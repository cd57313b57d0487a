"""The single-writer lock of a session: ``fcntl.flock`` on ``<id>.lock`` beside the log.

The operating system releases a flock when the process holding it dies, so ``kill -9`` never leaves
a stale lock and no liveness probe is needed. The lock file also records who holds it (pid, host,
since when), but only to name the holder in the error a second writer gets; that record is never
trusted for anything else. flock is per open file description, so a second open of the same
session in the same process is refused too. Local file systems only: flock on NFS is unreliable.

docs/adr/0004-session-lock.md says why this replaced the original kiso's link lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from kiso.kernel.errors import SessionLockedError, StoreError

__all__ = ["SessionLock"]


class SessionLock:
    """An acquired writer lock. Release it with :meth:`release` (or by exiting the process)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path, session_id: str) -> SessionLock:
        """Take the lock at ``path`` without waiting, or raise :class:`SessionLockedError`."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _describe_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise SessionLockedError(session_id, holder) from None
            raise StoreError(f"cannot lock {path}: {exc.strerror}") from exc
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": int(time.time() * 1000),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock. The file stays: deleting a lock file races with the next taker."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _describe_holder(fd: int) -> str:
    """Name the holder from the record it wrote, or say that it is not known."""
    try:
        raw = os.pread(fd, 4096, 0)
        record = json.loads(raw) if raw else None
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        return "another process (it has not recorded its pid yet)"
    pid, host, since = record.get("pid"), record.get("host"), record.get("since")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since / 1000))
        if isinstance(since, int)
        else "an unknown time"
    )
    return f"pid {pid} on {host} since {when}"
