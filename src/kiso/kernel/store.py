"""The session store contract, and the writer logic both implementations share.

A store creates sessions, opens one for writing (one writer per session at a time), loads one for
reading (no lock needed) and lists them. A :class:`SessionWriter` is the one writer of a session.
It stamps ``seq`` and ``ts`` and validates each event exactly as the loader will, then:

* :meth:`~SessionWriter.append` writes the events as one batch and makes it durable (one
  ``write``, one ``fsync``) before returning: after it returns they are on disk, before it returns
  the caller must not act on them;
* :meth:`~SessionWriter.stage` adds events to the next batch without any I/O, and
  :meth:`~SessionWriter.flush` (start writing it in the background), :meth:`~SessionWriter.commit`
  (block until it is durable) and ``await`` :meth:`~SessionWriter.committed` (the same without
  blocking an event loop) make staged events durable, in order, several batches in one ``fsync``
  when they queue up behind each other (group commit).

The runtime stages what nothing acts on yet and waits only where DURABILITY.md's write order
demands it (the fsync budget): that is how a round with effects costs two fsyncs and a read-only
round one, and how many sessions share one event loop without a fsync ever blocking it. Batches of
different sessions are written by a shared pool of I/O threads, so their fsyncs overlap.
docs/adr/0012-the-fsync-budget.md says why.

A batch that fails to write (a full disk) is taken back so the file still ends on a whole record,
and the writer refuses everything after it: what was staged but not written is named in the error,
and the session must be opened again (from what is on disk).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kiso.kernel.errors import AppendError, EventError, InvalidEventError
from kiso.kernel.events import (
    Assistant,
    Event,
    ExecutionStarted,
    SessionHeader,
    SettingChanged,
    User,
    dumps_line,
    event_from_json,
)

if TYPE_CHECKING:
    from kiso.kernel.listing import SessionInfo

__all__ = ["Clock", "DurableHook", "SessionLog", "SessionStore", "SessionWriter", "wall_clock_ms"]

Clock = Callable[[], int]
"""Returns the current time in unix milliseconds."""

DurableHook = Callable[[Sequence[Event]], None]
"""Called with the events of each batch once it is durable (from whichever thread wrote it)."""


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


_OUTSIDE_DATA = frozenset({Assistant, User, SettingChanged})
_POOL_SIZE = 32


class _Writers:
    """The threads that write batches for every writer of this process.

    One more thread starts whenever a batch arrives and none is idle, up to :data:`_POOL_SIZE`,
    so the fsyncs of different sessions overlap; handing a batch over is one queue put (no
    future, no callback: the writer wakes its own waiters). The threads are daemons, and an exit
    handler lets them finish what is queued before the interpreter goes.
    """

    def __init__(self, size: int) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._size = size
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # an idle thread will take it
            elif len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"kiso-log-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with contextlib.suppress(Exception):  # the writer records its own failures
                job()
            with self._lock:
                self._idle += 1

    def drain(self) -> None:
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join(30)


_writers: _Writers | None = None
_writers_lock = threading.Lock()


def _io_pool() -> _Writers:
    """The process's batch writers (created on first use)."""
    global _writers
    with _writers_lock:
        if _writers is None:
            _writers = _Writers(_POOL_SIZE)
        return _writers


def _wake(future: asyncio.Future[None], error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


class SessionWriter(ABC):
    """The one writer of one session. Use it as a context manager or call :meth:`close`.

    Safe to use from several threads (every method takes the writer's own locks), though a
    session is normally driven from one.
    """

    inline_io = False
    """Write batches on the calling thread (a store with no real I/O, like the memory store)."""
    serialises = True
    """Events are turned into log lines. A store that writes nothing may skip it: every field is
    still checked exactly as the loader checks it, and the records that carry data from outside
    (model turns, user input, settings) are still encoded once to prove they are JSON."""

    def __init__(self, log: SessionLog, clock: Clock) -> None:
        self.header = log.header
        self.path = log.path
        self._events: list[Event] = list(log.events)
        self._clock = clock
        self._closed = False
        self.on_durable: DurableHook | None = None
        """Called with each durable batch's events (the failpoint uses it)."""
        self._state = threading.Lock()  # guards everything below
        self._io = threading.Lock()  # one batch on its way to disk at a time, in seq order
        self._lines: list[bytes] = []  # staged, not yet handed to _write
        self._staged: list[Event] = []
        self._durable = self._events[-1].seq if self._events else 0
        self._wanted = self._durable  # the highest seq a flush was asked for
        self._flushing = False  # a background flush is queued or running
        self._failed: AppendError | None = None
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._turn: dict[str, object] = {}  # call id -> input, for the last assistant record
        for event in reversed(self._events):
            if isinstance(event, Assistant):
                self._turn = {c.call_id: c.input for c in event.calls}
                break

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def events(self) -> Sequence[Event]:
        """Every event of the session, staged ones included (in ``seq`` order)."""
        return self._events

    @property
    def next_seq(self) -> int:
        """The seq the next appended event will get."""
        return self._events[-1].seq + 1 if self._events else 1

    @property
    def durable_seq(self) -> int:
        """The highest seq known to be on disk (0 when only the header is)."""
        return self._durable

    @property
    def pending(self) -> int:
        """How many staged events are not durable yet."""
        last = self._events[-1].seq if self._events else 0
        return last - self._durable

    @property
    def closed(self) -> bool:
        return self._closed

    def log(self) -> SessionLog:
        return SessionLog(self.header, tuple(self._events), self.path)

    # ------------------------------------------------------------------ staging

    def stage(self, *events: Event) -> tuple[Event, ...]:
        """Stamp and validate ``events`` and add them to the next batch; return them stamped.

        No I/O: they are part of :attr:`events` at once and become durable with the next
        :meth:`flush`, :meth:`commit`, :meth:`committed` or :meth:`append`. An event built with
        the default ``seq`` (-1) gets the next one; an event that names a seq must name exactly
        the next one (a compare-and-set against lost updates). ``ts`` is stamped with the store's
        clock unless set. Nothing is staged unless every event is valid.
        """
        if not events:
            return ()
        with self._state:
            self._usable()
            seq = self.next_seq
            now = self._clock()
            turn = self._turn
            serialises = self.serialises
            stamped: list[Event] = []
            lines: list[bytes] = []
            for event in events:
                if event.seq not in (-1, seq):
                    raise AppendError(
                        f"session {self.id}: an event asked for seq {event.seq} but the next seq "
                        f"is {seq}; rebuild it from the current log"
                    )
                try:
                    obj = event.to_json()
                    obj["seq"] = seq
                    obj["ts"] = event.ts or now
                    if serialises:
                        lines.append(dumps_line(obj))
                    elif type(event) in _OUTSIDE_DATA:  # still prove it is JSON
                        dumps_line(obj)
                    # The loader's own check, which also builds the stamped event: never write
                    # what cannot load.
                    ready = event_from_json(obj)
                except (EventError, TypeError, ValueError, RecursionError) as exc:
                    why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                    raise InvalidEventError(
                        f"session {self.id}: refused to append an invalid {event.type} event: {why}"
                    ) from None
                turn = self._check_turn(ready, turn)
                stamped.append(ready)
                seq += 1
            self._events.extend(stamped)
            self._staged.extend(stamped)
            self._lines.extend(lines)
            self._turn = turn
        return tuple(stamped)

    def _check_turn(self, event: Event, turn: dict[str, object]) -> dict[str, object]:
        """The loader's cross-record check: a start runs exactly the input its call was given."""
        if isinstance(event, Assistant):
            return {c.call_id: c.input for c in event.calls}
        if (
            isinstance(event, ExecutionStarted)
            and event.call_id in turn
            and turn[event.call_id] != event.input
        ):
            raise InvalidEventError(
                f"session {self.id}: refused to append execution_started {event.execution_id}: "
                f"its input differs from the one the assistant record gave call {event.call_id}"
            )
        return turn

    def append(self, *events: Event) -> tuple[Event, ...]:
        """Stage ``events`` and make them (and everything staged before) durable; blocks."""
        stamped = self.stage(*events)
        self.commit()
        return stamped

    # ------------------------------------------------------------------ making it durable

    def commit(self) -> None:
        """Block until every staged event is durable (writing on this thread if need be)."""
        self._drain()
        with self._state:
            self._usable()

    def flush(self) -> None:
        """Start making every staged event durable, in the background; returns at once."""
        with self._state:
            self._usable()
            last = self._events[-1].seq if self._events else 0
            if last <= self._durable:
                return
            self._wanted = max(self._wanted, last)
            if self._flushing:
                return  # the running flush writes it before it stops
            if self.inline_io:
                start = False
            else:
                self._flushing = start = True
        if start:
            _io_pool().submit(self._flush_in_background)
        else:
            self._drain()

    async def committed(self, upto: int | None = None) -> None:
        """Wait, without blocking the event loop, until ``upto`` (default: every staged event)
        is durable. Raises :class:`AppendError` if the batch holding it failed."""
        if self.inline_io:  # nothing to wait for: write it here
            self.commit()
            return
        with self._state:
            self._usable()
            target = upto if upto is not None else (self._events[-1].seq if self._events else 0)
            if target <= self._durable:
                return
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((target, loop, future))
        self.flush()
        await future

    def _flush_in_background(self) -> None:
        try:
            while True:
                with contextlib.suppress(AppendError):  # recorded in _failed; waiters were told
                    self._drain()
                with self._state:
                    if self._failed is not None or self._durable >= self._wanted:
                        self._flushing = False
                        return
        except BaseException as exc:  # a bug, not an I/O error: never leave a waiter hanging
            with self._state:
                self._flushing = False
                self._failed = self._failed or AppendError(
                    f"session {self.id}: the log writer failed ({type(exc).__name__}: {exc}); "
                    f"the log on disk ends at seq {self._durable}. Open the session again."
                )
                waiters, self._waiters = self._waiters, []
            for _, loop, future in waiters:
                self._notify(loop, future, self._failed)
            raise

    def _drain(self) -> None:
        """Write everything staged as one batch (one write, one fsync), then wake the waiters."""
        with self._io:
            with self._state:
                if self._failed is not None or not self._staged:
                    return
                data = b"".join(self._lines)
                batch = self._staged
                self._lines, self._staged = [], []
            try:
                self._write(data, len(batch))
            except AppendError as exc:
                self._fail(exc, batch)
                raise
            except OSError as exc:  # a store that did not say what it was doing
                error = AppendError(f"session {self.id}: could not write the log: {exc}")
                self._fail(error, batch)
                raise error from exc
            with self._state:
                self._durable = batch[-1].seq
                ready = [w for w in self._waiters if w[0] <= self._durable]
                self._waiters = [w for w in self._waiters if w[0] > self._durable]
            for _, loop, future in ready:
                self._notify(loop, future, None)
            hook = self.on_durable
            if hook is not None:
                hook(batch)

    def _fail(self, exc: AppendError, batch: Sequence[Event]) -> None:
        with self._state:
            lost = len(batch) + len(self._staged)
            self._failed = AppendError(
                f"{exc} The session's writer stopped: {lost} event(s) from seq {batch[0].seq} on "
                f"were not committed (the log on disk ends at seq {self._durable}, intact). Open "
                f"the session again to continue from there."
            )
            waiters, self._waiters = self._waiters, []
        for _, loop, future in waiters:
            self._notify(loop, future, self._failed)

    @staticmethod
    def _notify(
        loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], error: BaseException | None
    ) -> None:
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_wake, future, error)

    def _usable(self) -> None:
        """Raise if nothing more may be appended (call with ``_state`` held)."""
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise AppendError(f"session {self.id}: the writer is closed; open the session again")

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Make staged events durable, then release the writer lock. Idempotent."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self._drain()
        finally:
            with self._state:
                self._closed = True
            self._release()

    def __enter__(self) -> SessionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def _write(self, data: bytes, count: int) -> None:
        """Persist ``data`` (``count`` complete lines) durably, all of it or raise (taking back
        any part written, so the file still ends on a whole record)."""

    @abstractmethod
    def _release(self) -> None:
        """Give up the writer lock."""


@atexit.register
def _drain_pool() -> None:  # pragma: no cover - process exit
    """Let queued batches reach the disk before the interpreter goes."""
    writers = _writers
    if writers is not None:
        writers.drain()
