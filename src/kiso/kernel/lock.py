"""The single-writer lock of a session: ``fcntl.flock`` on the log file itself.

The lock is taken on the inode of ``<id>.jsonl``, through a file descriptor opened on the log (or,
for a log being created, on its temporary file before it is linked into place). After locking,
the inode at the path is checked to still be the one locked: a log replaced in between (renamed
away, a copy put in its place, a repair renamed over it) is opened again, so whoever holds the
lock holds the file the path names. No operation on any *other* file can admit a second writer:
deleting or replacing ``<id>.lock`` changes nothing, because ``<id>.lock`` is not the lock. It is
only where the holder records who it is (pid, host, since when, and the inode it locked), so that
a second writer's error can name the holder; when that record is missing or does not match, the
holder is found in ``/proc/locks`` instead.

What a path-based lock cannot stop is the log itself being renamed away while it is held: the
holder keeps writing to the inode it locked, and a new file at the path is a different inode that
someone else may lock. :meth:`SessionLock.still_at_path` (two ``stat`` calls) lets the holder find
out before each batch, and refuse to append to a file that is no longer the session's log.

The operating system releases a flock when the process holding it dies, so ``kill -9`` never
leaves a stale lock and no liveness probe is needed. flock is per open file description, so a
second open of the same session in the same process is refused too. Every descriptor is
close-on-exec, so a tool's child process cannot keep a session locked. Local file systems only:
flock on NFS is unreliable.

docs/adr/0004-the-session-lock.md says why an OS lock replaced the original kiso's link lock;
docs/adr/0011-the-lock-is-the-log.md why the lock moved from ``<id>.lock`` onto the log.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from kiso.kernel.errors import (
    AppendError,
    SessionLockedError,
    SessionNotFoundError,
    StoreError,
    describe_os_error,
)

__all__ = ["LOCK_ATTEMPTS", "SessionLock", "flock_holders", "record_path_of"]

LOCK_ATTEMPTS = 5
"""How many times :meth:`SessionLock.acquire` opens the log again when the file it locked is no
longer the one at the path (replaced between the ``open`` and the ``flock``)."""

_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
_LOG_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC


def record_path_of(log_path: Path) -> Path:
    """Where the holder of the log at ``log_path`` records itself: ``<id>.lock`` beside it."""
    return log_path.with_suffix(".lock")


class SessionLock:
    """An acquired writer lock on one log. Release it with :meth:`release` (or by exiting).

    :meth:`fileno` is the descriptor the lock is held through (read-write, append-only,
    close-on-exec); a writer appends through a :func:`os.dup` of it, so that closing the writer's
    descriptor does not drop the lock before :meth:`release` has cleared the holder record.
    """

    def __init__(self, path: Path, session_id: str, fd: int) -> None:
        self.path = path
        """The log this lock is for."""
        self.session_id = session_id
        self.record_path = record_path_of(path)
        self._fd: int | None = fd
        self._record_fd: int | None = None
        st = os.fstat(fd)
        self._identity = (st.st_dev, st.st_ino)

    # ------------------------------------------------------------------ taking it

    @classmethod
    def acquire(cls, path: Path, session_id: str, *, record: bool = True) -> SessionLock:
        """Open the log at ``path`` and lock it without waiting.

        Raises :class:`SessionLockedError` (naming the holder) when another writer holds it,
        :class:`SessionNotFoundError` when there is no log at ``path``, and :class:`StoreError`
        for anything else (a full disk while recording the holder, an I/O error).
        """
        for _ in range(LOCK_ATTEMPTS):
            try:
                fd = os.open(path, _LOG_FLAGS)
            except FileNotFoundError:
                raise SessionNotFoundError(f"no session log at {path}") from None
            except OSError as exc:
                raise StoreError(describe_os_error(path, exc, "open the session log")) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                try:
                    if exc.errno in _BUSY:
                        holder = describe_holder(fd, record_path_of(path))
                        raise SessionLockedError(session_id, holder) from None
                    raise StoreError(describe_os_error(path, exc, "lock")) from exc
                finally:
                    os.close(fd)
            lock = cls(path, session_id, fd)
            if lock.still_at_path():
                stranded = lock._stranded_holder()
                if stranded is not None:
                    lock.release()
                    raise SessionLockedError(session_id, stranded)
                if record:
                    lock._record(f"session {session_id} was not opened; its log was not changed")
                return lock
            lock.release()  # the file was replaced between open and flock: lock the new one
        raise StoreError(
            f"could not lock {path}: the file at that path was replaced {LOCK_ATTEMPTS} times "
            f"while it was being opened; stop whatever keeps replacing it and try again"
        )

    @classmethod
    def adopt(cls, fd: int, path: Path, session_id: str, *, record: bool = True) -> SessionLock:
        """Lock the inode open at ``fd``, which is about to be put at ``path`` (a log being
        created, or a repaired log about to replace a damaged one): nobody else can have it yet.

        The lock holds its own duplicate of ``fd``; the caller still owns ``fd``.
        """
        own = os.dup(fd)  # non-inheritable, like every descriptor Python creates
        try:
            fcntl.flock(own, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(own)
            if exc.errno in _BUSY:  # only if someone found the temporary file: say so
                raise SessionLockedError(session_id, "another process") from None
            raise StoreError(describe_os_error(path, exc, "lock")) from exc
        lock = cls(path, session_id, own)
        if record:
            lock._record(f"session {session_id} was not created")
        return lock

    def _stranded_holder(self) -> str | None:
        """A live holder of an earlier inode of this log, replaced at the path while it held it.

        The lock on the file now at the path was free, but the holder record may name another
        inode that a live process still holds a flock on: that process believes it is the only
        writer, so this one must not become a second. Found only while the record survives and
        ``/proc/locks`` can be read; the holder itself refuses its next append either way.
        """
        record = _read_record(self.record_path)
        if record is None or not isinstance(record.get("ino"), int):
            return None
        dev, ino = record.get("dev"), record["ino"]
        if not isinstance(dev, int) or (dev, ino) == self._identity:
            return None
        pids = flock_holders(dev, ino)
        if not pids or record["pid"] not in pids:
            return None
        return (
            f"pid {record['pid']} on {record['host']} since {_when(record.get('since'))}, "
            f"which still holds the file that was at {self.path} before it was replaced (inode "
            f"{ino}); whatever replaced the log did so behind that writer's back"
        )

    def _record(self, outcome: str) -> None:
        """Write who holds the lock to ``<id>.lock``; on failure release and raise StoreError
        (``outcome`` says what that means for the caller)."""
        assert self._fd is not None
        dev, ino = self._identity
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": int(time.time() * 1000),
            "dev": dev,
            "ino": ino,
        }
        data = json.dumps(record).encode()
        fd = -1
        try:
            fd = os.open(
                self.record_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
            )
            os.ftruncate(fd, 0)
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            self.release()
            raise StoreError(
                describe_os_error(self.record_path, exc, "record the writer of the session in")
                + f"; {outcome}"
            ) from exc
        self._record_fd = fd

    # ------------------------------------------------------------------ holding it

    @property
    def held(self) -> bool:
        return self._fd is not None

    def fileno(self) -> int:
        """The descriptor the lock is held through (read-write, append-only)."""
        if self._fd is None:
            raise StoreError(f"the lock on {self.path} was released")
        return self._fd

    def still_at_path(self) -> bool:
        """True while the locked file is still the one at :attr:`path` (same device and inode).

        Cheap (``fstat`` + ``stat``): a writer calls it before each batch, and refuses to write
        when it is false: the log was renamed away, deleted or replaced, so another process may
        be writing to whatever is at the path now, believing it is the only writer.
        """
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def check_at_path(self) -> None:
        """:meth:`still_at_path`, raising :class:`AppendError` (nothing written) when false."""
        if not self.still_at_path():
            raise AppendError(
                f"{self.path}: the session log was moved, deleted or replaced while this writer "
                f"held it, so another process may now be writing to the file at that path; "
                f"nothing was appended. Find out what replaced the file, then open session "
                f"{self.session_id} again."
            )

    def release(self) -> None:
        """Drop the lock, clearing the holder record first. Idempotent.

        The record is cleared while the lock is still held, so it never erases the record of the
        next holder. Neither file is deleted.
        """
        fd, self._fd = self._fd, None
        record_fd, self._record_fd = self._record_fd, None
        if record_fd is not None:
            try:
                os.ftruncate(record_fd, 0)
            except OSError:
                pass  # the record is only ever a hint; a stale one is detected by its inode
            finally:
                os.close(record_fd)
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- naming the holder


def describe_holder(fd: int, record_path: Path) -> str:
    """Name whoever holds the flock on the file open at ``fd``.

    The holder's own record in ``record_path`` gives pid, host and since when, but it is believed
    only if it names the inode at ``fd`` and (where ``/proc/locks`` can tell) a pid that really
    holds a lock on it. Otherwise the pid comes from ``/proc/locks``.
    """
    st = os.fstat(fd)
    pids = flock_holders(st.st_dev, st.st_ino)
    record = _read_record(record_path)
    if record is not None:
        pid = record["pid"]
        inode = (record.get("dev"), record.get("ino"))
        names_this_file = inode in ((None, None), (st.st_dev, st.st_ino))
        if names_this_file and (pids is None or pid in pids):
            return f"pid {pid} on {record['host']} since {_when(record.get('since'))}"
    if pids:
        return (
            f"pid {pids[0]} on {socket.gethostname()} (since an unknown time: its record in "
            f"{record_path.name} is missing or does not match)"
        )
    return "another process (it has not recorded its pid yet)"


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
        record = json.loads(raw) if raw else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(record, dict):
        return None
    if not isinstance(record.get("pid"), int) or not isinstance(record.get("host"), str):
        return None
    return record


def _when(since: object) -> str:
    if isinstance(since, int) and not isinstance(since, bool):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since / 1000))
    return "an unknown time"


def flock_holders(dev: int, ino: int, table: str = "/proc/locks") -> list[int] | None:
    """The pids holding an exclusive flock on inode ``ino`` of device ``dev``, from
    ``/proc/locks`` (Linux); ``None`` when that table cannot be read."""
    try:
        with open(table, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    pids: list[int] = []
    for line in text.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146340 0 EOF"; waiters read "1: -> FLOCK ..."
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        if fields[5] == want and fields[4].isdigit() and int(fields[4]) > 0:
            pids.append(int(fields[4]))
    return pids
