"""The default session store: one append-only JSONL file per session.

Layout: ``$KISO_HOME/projects/<workspace-slug>/<session-id>.jsonl`` with ``<session-id>.lock``
beside it and a ``.index.json`` cache per project folder. Folders are created 0700 and files 0600;
files that already existed keep the mode their owner gave them.

Write path: every append is one ``write(2)`` of whole lines followed by ``fsync``; a new log's
header is written to a temporary file, fsynced, linked into place (never clobbering) and the folder
fsynced. Read path: strict. A final line with no newline is a torn write, ignored on load and cut
off when the session is next opened for writing; any other bad line is a :class:`CorruptLogError`
naming the file and the line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kiso import __version__
from kiso.kernel._fast import gc_paused
from kiso.kernel.errors import (
    AppendError,
    CorruptLogError,
    EventError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
)
from kiso.kernel.events import Event, SessionHeader, dumps_line, event_from_json, header_from_json
from kiso.kernel.ids import check_session_id, new_id
from kiso.kernel.index import SidecarIndex
from kiso.kernel.layout import kiso_home, make_private_dirs, workspace_slug
from kiso.kernel.listing import SessionInfo
from kiso.kernel.lock import SessionLock
from kiso.kernel.store import Clock, SessionLog, SessionWriter, wall_clock_ms

__all__ = ["JsonlSessionStore", "JsonlWriter", "parse_log"]

LOG_SUFFIX = ".jsonl"


def parse_log(data: bytes, path: str = "<memory>") -> SessionLog:
    """Validate the bytes of a whole log. Pure: no I/O.

    Raises :class:`CorruptLogError` for anything but a torn final line.
    """
    with gc_paused():
        return _parse_log(data, path)


def _parse_log(data: bytes, path: str) -> SessionLog:
    end = data.rfind(b"\n") + 1  # everything after the last newline is a torn write
    torn = end < len(data)
    if end == 0:
        reason = "the header line is incomplete" if torn else "the file is empty"
        raise CorruptLogError(path, 1, f"{reason}; the session was never fully created")
    try:
        text = data[:end].decode("utf-8")  # strictly UTF-8: json.loads(bytes) would guess
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CorruptLogError(path, line, "not UTF-8 text") from None
    # One call into the C scanner per line, which must end exactly at its newline: as strict as
    # json.loads on each line (stricter: no surrounding whitespace) and cheaper than splitting.
    scan = _SCANNER
    number = 1  # the line being read
    try:
        obj, stop = scan(text, 0)
        if text[stop] != "\n":
            raise json.JSONDecodeError("extra data after the JSON value", text, stop)
        header = header_from_json(obj)
        events: list[Event] = []
        append = events.append
        parse = event_from_json
        pos, size = stop + 1, len(text)
        while pos < size:
            number += 1
            obj, stop = scan(text, pos)
            if text[stop] != "\n":
                raise json.JSONDecodeError("extra data after the JSON value", text, stop)
            event = parse(obj)
            if event.seq != number - 1:
                raise CorruptLogError(
                    path,
                    number,
                    f"seq {event.seq} where {number - 1} was expected (a gap or a duplicate)",
                )
            append(event)
            pos = stop + 1
    except StopIteration:
        raise CorruptLogError(path, number, "not valid JSON (no value at column 1)") from None
    except json.JSONDecodeError as exc:
        column = exc.pos - (text.rfind("\n", 0, exc.pos) + 1) + 1
        reason = f"not valid JSON ({exc.msg} at column {column})"
        raise CorruptLogError(path, number, reason) from None
    except EventError as exc:
        raise CorruptLogError(path, number, f"not a valid event: {exc}") from None
    return SessionLog(header, tuple(events), path, torn)


_SCANNER = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JsonlWriter(SessionWriter):
    """The writer of one JSONL log; holds the session's lock until closed."""

    def __init__(self, log: SessionLog, clock: Clock, lock: SessionLock, fd: int, size: int):
        super().__init__(log, clock)
        self._lock = lock
        self._fd = fd
        self._size = size

    def _write(self, data: bytes, count: int) -> None:
        fd = self._fd
        actual = os.fstat(fd).st_size
        if actual != self._size:
            raise AppendError(
                f"{self.path}: the file changed underneath this writer ({self._size} bytes "
                f"expected, {actual} found); nothing was appended. Open the session again."
            )
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, view[written:])
            os.fsync(fd)
        except OSError as exc:
            try:  # take back a partial batch so the file still ends on a whole record
                os.ftruncate(fd, self._size)
                os.fsync(fd)
            except OSError:
                pass
            raise AppendError(
                f"{self.path}: could not append {count} event(s): {exc.strerror}; nothing was "
                f"committed"
            ) from exc
        self._size += len(data)

    def _release(self) -> None:
        try:
            os.close(self._fd)
        finally:
            self._lock.release()


class JsonlSessionStore:
    """Sessions as JSONL files under ``home/projects`` (``home`` defaults to ``$KISO_HOME``)."""

    def __init__(self, home: str | os.PathLike[str] | None = None, *, clock: Clock = wall_clock_ms):
        self.home = Path(home) if home is not None else kiso_home()
        self.root = self.home / "projects"
        self._clock = clock

    # ------------------------------------------------------------------ paths

    def project_dir(self, workspace: str | os.PathLike[str]) -> Path:
        return self.root / workspace_slug(workspace)

    def path_of(self, session_id: str) -> Path:
        """The log of ``session_id``, in whichever project folder holds it."""
        check_session_id(session_id)
        name = session_id + LOG_SUFFIX
        for folder in self._project_dirs():
            candidate = folder / name
            if candidate.is_file():
                return candidate
        raise SessionNotFoundError(
            f"no session {session_id!r} under {self.root}; `kiso sessions --all` lists them"
        )

    def _project_dirs(self) -> list[Path]:
        try:
            with os.scandir(self.root) as entries:
                return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {self.root}: {exc.strerror}") from exc

    # ------------------------------------------------------------------ the contract

    def create(
        self,
        workspace: str | os.PathLike[str],
        *,
        session_id: str | None = None,
        parent: str | None = None,
    ) -> JsonlWriter:
        sid = check_session_id(session_id) if session_id is not None else new_id()
        try:
            existing = self.path_of(sid)
        except SessionNotFoundError:
            pass
        else:
            raise SessionExistsError(f"session {sid!r} already exists at {existing}")
        ws = os.path.realpath(os.fspath(workspace))
        folder = self.project_dir(ws)
        make_private_dirs(folder)
        lock = SessionLock.acquire(folder / f"{sid}.lock", sid)
        try:
            header = SessionHeader(
                id=sid, workspace=ws, created=self._clock(), kiso=__version__, parent=parent
            )
            data = dumps_line(header.to_json())
            path = folder / (sid + LOG_SUFFIX)
            tmp = folder / f".{sid}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # atomic and never clobbers
            except FileExistsError:
                raise SessionExistsError(f"session {sid!r} already exists at {path}") from None
            finally:
                os.unlink(tmp)
            _fsync_dir(folder)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except BaseException:
            lock.release()
            raise
        log = SessionLog(header, (), str(path))
        return JsonlWriter(log, self._clock, lock, fd, len(data))

    def open(self, session_id: str) -> JsonlWriter:
        path = self.path_of(session_id)
        lock = SessionLock.acquire(path.with_suffix(".lock"), session_id)
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            try:
                data = _read_fd(fd)
                log = parse_log(data, str(path))
                size = len(data)
                if log.torn_tail:  # cut the torn write off before anything is appended
                    size = data.rindex(b"\n") + 1
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                    log = SessionLog(log.header, log.events, log.path)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            lock.release()
            raise
        return JsonlWriter(log, self._clock, lock, fd, size)

    def load(self, session_id: str) -> SessionLog:
        return self.load_path(self.path_of(session_id))

    def load_path(self, path: str | os.PathLike[str]) -> SessionLog:
        """Read and validate the log at ``path`` (no lock: a reader never blocks the writer)."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise SessionNotFoundError(f"no session log at {path}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror}") from exc
        return parse_log(data, os.fspath(path))

    def list(self, workspace: str | os.PathLike[str] | None = None) -> list[SessionInfo]:
        """Every session (only those of ``workspace``, when given), newest activity first.

        Each project folder's ``.index.json`` caches the rows; a row is recomputed from its log
        whenever the log's size, mtime or inode differs from what the cache recorded.
        """
        if workspace is not None:
            ws = os.path.realpath(os.fspath(workspace))
            folder = self.project_dir(ws)
            folders = [folder] if folder.is_dir() else []
        else:
            folders = self._project_dirs()
        rows: list[SessionInfo] = []
        for folder in folders:
            rows.extend(SidecarIndex(folder).refresh(self.load_path))
        if workspace is not None:
            rows = [r for r in rows if r.workspace == ws]
        rows.sort(key=lambda r: (r.updated, r.id), reverse=True)
        return rows


def _read_fd(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, max(size - offset, 65536), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
