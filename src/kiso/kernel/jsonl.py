"""The default session store: one append-only JSONL file per session.

Layout: ``$KISO_HOME/projects/<workspace-slug>/<session-id>.jsonl`` with ``<session-id>.lock``
beside it (where the writer lock's holder records itself; the lock is on the log, see
:mod:`kiso.kernel.lock`) and a ``.index.json`` cache per project folder. Folders are created 0700
and files 0600; files that already existed keep the mode their owner gave them.

Write path: every append is one ``write(2)`` of whole lines followed by ``fsync``; a new log's
header is written to a temporary file, fsynced, locked, linked into place (never clobbering) and
the folder fsynced. Read path: strict. A final line with no newline is a torn write, ignored on
load and cut off when the session is next opened for writing; any other bad line is a
:class:`CorruptLogError` naming the file and the line (``kiso doctor`` repairs such a log).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, cast

from kiso._version import __version__
from kiso.kernel._fast import gc_paused
from kiso.kernel.errors import (
    AppendError,
    CorruptLogError,
    EventError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
    describe_os_error,
)
from kiso.kernel.events import (
    Assistant,
    Event,
    ExecutionStarted,
    SessionHeader,
    ToolCall,
    dumps_line,
    event_from_json,
    header_from_json,
)
from kiso.kernel.ids import check_session_id, new_id
from kiso.kernel.index import SidecarIndex
from kiso.kernel.layout import kiso_home, make_private_dirs, workspace_slug
from kiso.kernel.listing import SessionInfo
from kiso.kernel.lock import SessionLock, record_path_of
from kiso.kernel.store import Clock, SessionLog, SessionWriter, wall_clock_ms

__all__ = ["JsonlSessionStore", "JsonlWriter", "parse_log"]

LOG_SUFFIX = ".jsonl"


def parse_log(data: bytes, path: str = "<memory>", *, session_id: str | None = None) -> SessionLog:
    """Validate the bytes of a whole log. Pure: no I/O.

    ``session_id`` is the id the log's file name gives (``<id>.jsonl``), when there is one: a
    header that names another session is corruption. Beyond each line being a valid event of the
    next ``seq``, an ``execution_started`` must carry exactly the input of its call in the last
    ``assistant`` record (what was approved is what runs). Raises :class:`CorruptLogError` for
    anything but a torn final line.
    """
    with gc_paused():
        return _parse_log(data, path, session_id)


_NO_CALL: Any = object()


def _parse_log(data: bytes, path: str, session_id: str | None) -> SessionLog:
    end = data.rfind(b"\n") + 1  # everything after the last newline is a torn write
    torn = end < len(data)
    if end == 0:
        reason = "the header line is incomplete" if torn else "the file is empty"
        raise CorruptLogError(
            path, 1, f"{reason}; the session was never fully created", session_id=session_id
        )
    try:
        text = data[:end].decode("utf-8")  # strictly UTF-8: json.loads(bytes) would guess
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CorruptLogError(path, line, "not UTF-8 text", session_id=session_id) from None
    # One call into the C scanner per line, which must end exactly at its newline: as strict as
    # json.loads on each line (stricter: no surrounding whitespace) and cheaper than splitting.
    scan, find = _SCANNER, text.find
    number = 1  # the line being read
    pos = 0  # where it starts
    try:
        obj, stop = scan(text, 0)
        if text[stop] != "\n" or find("\n", 0, stop) >= 0:
            raise _beyond(text, 0, stop)
        header = header_from_json(obj)
        if session_id is not None and header.id != session_id:
            raise CorruptLogError(
                path,
                1,
                f"the header names session {header.id!r} but the file is {session_id}.jsonl "
                f"(copied or renamed from {header.id}.jsonl?)",
                session_id=session_id,
            )
        events: list[Event] = []
        append = events.append
        parse = event_from_json
        pos, size = stop + 1, len(text)
        turn: Assistant | None = None  # the last assistant record, and its line
        turn_line = 0
        inputs: dict[str, Any] | None = None  # its calls' inputs, built when first needed
        while pos < size:
            number += 1
            obj, stop = scan(text, pos)
            if text[stop] != "\n" or find("\n", pos, stop) >= 0:
                raise _beyond(text, pos, stop)
            event = parse(obj)
            if event.seq != number - 1:
                raise CorruptLogError(
                    path,
                    number,
                    f"seq {event.seq} where {number - 1} was expected (a gap or a duplicate)",
                    session_id=session_id,
                )
            kind = type(event)
            if kind is Assistant:
                turn, turn_line, inputs = cast(Assistant, event), number, None
            elif kind is ExecutionStarted and turn is not None:
                started = cast(ExecutionStarted, event)
                if inputs is None:
                    inputs = {b.call_id: b.input for b in turn.blocks if type(b) is ToolCall}
                expected = inputs.get(started.call_id, _NO_CALL)
                if expected is not _NO_CALL and expected != started.input:
                    raise CorruptLogError(
                        path,
                        number,
                        f"execution_started {started.execution_id} runs call {started.call_id} "
                        f"with an input that differs from the one the assistant record on line "
                        f"{turn_line} gave it",
                        session_id=session_id,
                    )
            append(event)
            pos = stop + 1
    except StopIteration as exc:  # no value where one must start: exc.value is where
        reason = _json_reason(text, pos, exc.value, "Expecting value")
        raise CorruptLogError(path, number, reason, session_id=session_id) from None
    except json.JSONDecodeError as exc:
        reason = _json_reason(text, pos, exc.pos, exc.msg)
        raise CorruptLogError(path, number, reason, session_id=session_id) from None
    except EventError as exc:
        raise CorruptLogError(
            path, number, f"not a valid event: {exc}", session_id=session_id
        ) from None
    except RecursionError:
        raise CorruptLogError(
            path, number, "not a valid event: nested too deeply to read", session_id=session_id
        ) from None
    return SessionLog(header, tuple(events), path, torn)


_SCANNER = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _beyond(text: str, start: int, stop: int) -> json.JSONDecodeError:
    """The value read from ``start`` ended at ``stop``: not at its line's end, or past it."""
    end = text.find("\n", start)
    if stop < end:
        return json.JSONDecodeError("extra data after the JSON value", text, stop)
    return json.JSONDecodeError("the value goes on past the end of the line", text, end + 1)


def _json_reason(text: str, start: int, index: int, message: str) -> str:
    """Why the line starting at ``start`` is not JSON, with the column on *that* line.

    The scanner skips whitespace, newlines included, so an unfinished value (a missing ``}``, a
    torn record in the middle of the file) fails on a later line; the column is then this line's
    end, where its value was cut off.
    """
    end = text.find("\n", start)
    if index > end:
        return f"not valid JSON (the line ends at column {end - start + 1} inside its value)"
    what = message.removesuffix(" at")  # "Invalid control character at"
    return f"not valid JSON ({what} at column {index - start + 1})"


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
        self._lock.check_at_path()  # the log was not moved or replaced: we are its one writer
        try:
            actual = os.fstat(fd).st_size
        except OSError as exc:
            raise AppendError(describe_os_error(self.path or "the log", exc, "append to")) from exc
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
            reason = describe_os_error(self.path or "the log", exc, "append to")
            raise AppendError(f"{reason}; {count} event(s) were not committed.") from exc
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
            raise StoreError(
                describe_os_error(self.root, exc, "list the session folders in")
            ) from exc

    # ------------------------------------------------------------------ the contract

    def create(
        self,
        workspace: str | os.PathLike[str],
        *,
        session_id: str | None = None,
        parent: str | None = None,
    ) -> JsonlWriter:
        """Write a new session's header and return its writer, holding the lock.

        The header goes to a temporary file that is fsynced and locked *before* it is linked into
        place (never clobbering), so from the moment the log exists at its path its inode is
        locked by this writer, and it never exists without its header.
        """
        sid = check_session_id(session_id) if session_id is not None else new_id()
        try:
            existing = self.path_of(sid)
        except SessionNotFoundError:
            pass
        else:
            raise SessionExistsError(f"session {sid!r} already exists at {existing}")
        ws = os.path.realpath(os.fspath(workspace))
        folder = self.project_dir(ws)
        try:
            make_private_dirs(folder)
        except OSError as exc:
            raise StoreError(
                describe_os_error(exc.filename or folder, exc, "create the session folder")
                + f"; session {sid} was not created"
            ) from exc
        header = SessionHeader(
            id=sid, workspace=ws, created=self._clock(), kiso=__version__, parent=parent
        )
        data = dumps_line(header.to_json())
        path = folder / (sid + LOG_SUFFIX)
        tmp = folder / f".{sid}.{os.getpid()}.tmp"
        doing = "create the session log"
        lock: SessionLock | None = None
        fd = -1
        linked = False
        try:
            try:
                fd = os.open(
                    tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
                )
                lock = SessionLock.adopt(fd, path, sid)
                doing = "write the header of"
                _write_all(fd, data)
                os.fsync(fd)
                doing = "link into place"
                try:
                    os.link(tmp, path)  # atomic and never clobbers
                except FileExistsError:
                    raise SessionExistsError(f"session {sid!r} already exists at {path}") from None
                linked = True
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                doing = "make durable the folder holding"
                _fsync_dir(folder)
            except OSError as exc:
                outcome = (
                    f"; session {sid} exists but may not survive a power loss: open it again"
                    if linked
                    else f"; session {sid} was not created"
                )
                raise StoreError(describe_os_error(path, exc, doing) + outcome) from exc
        except BaseException:
            if lock is not None:
                lock.release()
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if not linked and not path.exists():  # no log: its holder record is only litter
                with contextlib.suppress(OSError):
                    os.unlink(record_path_of(path))
            raise
        log = SessionLog(header, (), str(path))
        return JsonlWriter(log, self._clock, lock, fd, len(data))

    def open(self, session_id: str) -> JsonlWriter:
        """Open a session for writing: lock its log, load it, cut a torn tail off."""
        path = self.path_of(session_id)
        lock = SessionLock.acquire(path, session_id)
        fd = -1
        try:
            doing = "read"
            try:
                fd = os.dup(lock.fileno())
                data = _read_fd(fd)
                log = parse_log(data, str(path), session_id=session_id)
                size = len(data)
                if log.torn_tail:  # cut the torn write off before anything is appended
                    doing = "cut the torn last line off"
                    size = data.rindex(b"\n") + 1
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                    log = SessionLog(log.header, log.events, log.path)
            except OSError as exc:
                raise StoreError(
                    describe_os_error(path, exc, doing) + f"; session {session_id} was not opened"
                ) from exc
        except BaseException:
            if fd >= 0:
                os.close(fd)
            lock.release()
            raise
        return JsonlWriter(log, self._clock, lock, fd, size)

    def load(self, session_id: str) -> SessionLog:
        return self.load_path(self.path_of(session_id))

    def load_path(self, path: str | os.PathLike[str]) -> SessionLog:
        """Read and validate the log at ``path`` (no lock: a reader never blocks the writer).

        A file named ``<id>.jsonl`` must hold session ``<id>``.
        """
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise SessionNotFoundError(f"no session log at {path}") from None
        except OSError as exc:
            raise StoreError(describe_os_error(path, exc, "read")) from exc
        name = os.path.basename(os.fspath(path))
        sid = name[: -len(LOG_SUFFIX)] if name.endswith(LOG_SUFFIX) else None
        return parse_log(data, os.fspath(path), session_id=sid or None)

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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    written = 0
    while written < len(data):
        written += os.write(fd, view[written:])


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
