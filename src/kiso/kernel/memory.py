"""An in-memory session store with the same contract as the JSONL one.

For tests, examples and runs where durability is deliberately off: nothing survives the process.
The single-writer rule still holds within the process, and every appended event is checked field
by field exactly as the loader checks it (events are not turned into log lines: nothing is
written).
"""

from __future__ import annotations

import os

from kiso._version import __version__
from kiso.kernel.errors import SessionExistsError, SessionLockedError, SessionNotFoundError
from kiso.kernel.events import Event, SessionHeader
from kiso.kernel.ids import check_session_id, new_id
from kiso.kernel.listing import SessionInfo, summarize
from kiso.kernel.store import Clock, SessionLog, SessionWriter, wall_clock_ms

__all__ = ["MemorySessionStore", "MemoryWriter"]


class MemoryWriter(SessionWriter):
    inline_io = True
    serialises = False  # nothing is written; every field is still checked as the loader would

    def __init__(
        self, store: MemorySessionStore, header: SessionHeader, events: list[Event], clock: Clock
    ) -> None:
        super().__init__(SessionLog(header, tuple(events)), clock)
        self._events = events  # appends land in the store's own list
        self._store = store

    def _write(self, data: bytes, count: int) -> None:
        # Staging already put the events in self._events, which is the store's own list.
        pass

    def _release(self) -> None:
        self._store._writers.discard(self.id)


class MemorySessionStore:
    def __init__(self, *, clock: Clock = wall_clock_ms) -> None:
        self._clock = clock
        self._sessions: dict[str, tuple[SessionHeader, list[Event]]] = {}
        self._writers: set[str] = set()

    def create(
        self,
        workspace: str | os.PathLike[str],
        *,
        session_id: str | None = None,
        parent: str | None = None,
    ) -> MemoryWriter:
        sid = check_session_id(session_id) if session_id is not None else new_id()
        if sid in self._sessions:
            raise SessionExistsError(f"session {sid!r} already exists in this memory store")
        header = SessionHeader(
            id=sid,
            workspace=os.path.realpath(os.fspath(workspace)),
            created=self._clock(),
            kiso=__version__,
            parent=parent,
        )
        self._sessions[sid] = (header, [])
        return self._writer(sid)

    def open(self, session_id: str) -> MemoryWriter:
        if session_id not in self._sessions:
            raise SessionNotFoundError(f"no session {session_id!r} in this memory store")
        if session_id in self._writers:
            raise SessionLockedError(
                session_id, f"another writer in this process (pid {os.getpid()})"
            )
        return self._writer(session_id)

    def _writer(self, sid: str) -> MemoryWriter:
        header, events = self._sessions[sid]
        writer = MemoryWriter(self, header, events, self._clock)
        self._writers.add(sid)
        return writer

    def load(self, session_id: str) -> SessionLog:
        try:
            header, events = self._sessions[session_id]
        except KeyError:
            raise SessionNotFoundError(f"no session {session_id!r} in this memory store") from None
        return SessionLog(header, tuple(events))

    def list(self, workspace: str | os.PathLike[str] | None = None) -> list[SessionInfo]:
        ws = os.path.realpath(os.fspath(workspace)) if workspace is not None else None
        rows = [
            summarize(self.load(sid))
            for sid, (header, _) in self._sessions.items()
            if ws is None or header.workspace == ws
        ]
        rows.sort(key=lambda r: (r.updated, r.id), reverse=True)
        return rows
