"""The session store contract, and the writer logic both implementations share.

A store creates sessions, opens one for writing (one writer per session at a time), loads one for
reading (no lock needed) and lists them. A :class:`SessionWriter` appends one or several events at
once: it stamps ``seq`` and ``ts``, validates each event exactly as the loader will, writes them as
one batch and makes the batch durable before returning. After ``append`` returns, the events are
on disk; before it returns, the caller must not act on them.
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kiso.kernel.errors import AppendError, EventError
from kiso.kernel.events import Event, SessionHeader, dumps_line, event_from_json

if TYPE_CHECKING:
    from kiso.kernel.listing import SessionInfo

__all__ = ["Clock", "SessionLog", "SessionStore", "SessionWriter", "wall_clock_ms"]

Clock = Callable[[], int]
"""Returns the current time in unix milliseconds."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class SessionLog:
    """A loaded session: its header and every committed event after it, in ``seq`` order."""

    header: SessionHeader
    events: tuple[Event, ...]
    path: str | None = None
    torn_tail: bool = False
    """True when a final line without a newline was ignored (it is truncated at the next open)."""

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def next_seq(self) -> int:
        return self.events[-1].seq + 1 if self.events else 1


class SessionStore(Protocol):
    """Where session logs live. ``JsonlSessionStore`` and ``MemorySessionStore`` implement it."""

    def create(
        self, workspace: str, *, session_id: str | None = None, parent: str | None = None
    ) -> SessionWriter:
        """Write a new session's header and return its writer (the lock is held)."""
        ...

    def open(self, session_id: str) -> SessionWriter:
        """Open an existing session for writing; refuses while another writer holds it."""
        ...

    def load(self, session_id: str) -> SessionLog:
        """Read and validate a whole session without taking its lock."""
        ...

    def list(self, workspace: str | None = None) -> list[SessionInfo]:
        """Every session (of one workspace, when given), newest activity first."""
        ...


class SessionWriter(ABC):
    """The one writer of one session. Use it as a context manager or call :meth:`close`."""

    def __init__(self, log: SessionLog, clock: Clock) -> None:
        self.header = log.header
        self.path = log.path
        self._events: list[Event] = list(log.events)
        self._clock = clock
        self._closed = False

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def events(self) -> Sequence[Event]:
        """Every committed event, including those this writer appended."""
        return self._events

    @property
    def next_seq(self) -> int:
        """The seq the next appended event will get."""
        return self._events[-1].seq + 1 if self._events else 1

    @property
    def closed(self) -> bool:
        return self._closed

    def log(self) -> SessionLog:
        return SessionLog(self.header, tuple(self._events), self.path)

    def append(self, *events: Event) -> tuple[Event, ...]:
        """Stamp, validate, write and make durable ``events`` as one batch; return them stamped.

        An event built with the default ``seq`` (-1) gets the next one; an event that names a
        seq must name exactly the next one (a compare-and-set against lost updates). ``ts`` is
        stamped with the store's clock unless set. Nothing is written unless every event is valid.
        """
        if self._closed:
            raise AppendError(f"session {self.id}: the writer is closed; open the session again")
        if not events:
            return ()
        seq = self.next_seq
        now = self._clock()
        stamped: list[Event] = []
        lines: list[bytes] = []
        for event in events:
            if event.seq not in (-1, seq):
                raise AppendError(
                    f"session {self.id}: an event asked for seq {event.seq} but the next seq is "
                    f"{seq}; rebuild it from the current log"
                )
            ready = dataclasses.replace(event, seq=seq, ts=event.ts or now)
            try:
                obj = ready.to_json()
                line = dumps_line(obj)
                event_from_json(obj)  # the loader's own check: never write what cannot load
            except (EventError, TypeError, ValueError) as exc:
                raise AppendError(
                    f"session {self.id}: refused to append an invalid {event.type} event: {exc}"
                ) from None
            stamped.append(ready)
            lines.append(line)
            seq += 1
        self._write(b"".join(lines), len(lines))
        self._events.extend(stamped)
        return tuple(stamped)

    def close(self) -> None:
        """Release the writer lock. Idempotent."""
        if not self._closed:
            self._closed = True
            self._release()

    def __enter__(self) -> SessionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def _write(self, data: bytes, count: int) -> None:
        """Persist ``data`` (``count`` complete lines) durably, all of it or raise."""

    @abstractmethod
    def _release(self) -> None:
        """Give up the writer lock."""
