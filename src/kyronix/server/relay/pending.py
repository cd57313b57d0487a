"""The requests the relay has sent on and not yet seen answered, and the answers it keeps.

A request is **pending** from the moment it is sent on until its ``kml_result`` (or an ``error``)
comes back, or its timeout passes. It remembers the connection it was sent to: only that
connection may answer it, once. Pending requests outlive connections: when an executer's
connection drops they wait for it (``lost``), and are sent again (to the new connection) when it
is back. A request nobody waits for any more (its runtime connection went away) is dropped after
``tunnel.orphanTimeout``: the runtime may send it again, and the executer's receipts answer it.

An answered request's ``kml_result`` is **kept** for :data:`KEEP_RESULTS_S` seconds: a runtime
client that sends the same request again gets it at once. What is kept is bounded by count and
by bytes, for all projects and for each one (the oldest go first).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kyronix import wire
from kyronix.errors import KyronixRunError

if TYPE_CHECKING:
    from kyronix.server.relay.peer import Peer

__all__ = [
    "KEEP_RESULTS",
    "KEEP_RESULTS_S",
    "Answer",
    "Pending",
    "Requests",
    "TunnelFailure",
    "Waiter",
    "deliver",
]

KEEP_RESULTS_S = 600.0
KEEP_RESULTS = 1000
"""Answers kept per project (by count; and by bytes: ``tunnel.keptBytesPerProject``)."""

Answer = wire.KmlResult | wire.KmlProgress | wire.ErrorFrame
"""What the waiters of a request get: its progress, then its result or an error."""
Waiter = Callable[[Answer], Awaitable[None]]
Key = tuple[str, str]
"""(project id, request id)."""


class TunnelFailure(KyronixRunError):
    """A request could not be answered: ``code`` is the error frame's code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, details={"code": code})
        self.code = code


@dataclass(eq=False)
class Pending:
    project_id: str
    request_id: str
    executer_id: str
    kml: str
    deadline: float
    waiters: list[Waiter] = field(default_factory=list)
    internal: bool = False
    """The server's own request (the server-driven loop records its results itself)."""
    asker: Peer | None = None
    """The runtime connection that asked (its in-flight count)."""
    key_id: str | None = None
    """The API key of the runtime that asked (None: the server's own request). The request id
    is that key's: another key of the project may neither join it nor read its answer."""
    session_id: str | None = None
    """The session the runtime named (``sessionId``): its results are recorded there only."""
    sent_to: Peer | None = None
    """The executer connection this was last sent to: the only one whose answer counts."""
    lost: bool = False
    """The executer's connection dropped while this was pending."""
    orphaned: float | None = None
    """When its last waiter went away (None: somebody waits)."""
    timer: asyncio.TimerHandle | None = None
    remote: str | None = None
    """The replica this was sent on to (its executer is connected there), or None: here."""
    origin: str | None = None
    """On the executer's replica, for a request sent on by another: that replica (it records
    the results and answers its runtime client; this one only relays)."""

    @property
    def key(self) -> Key:
        return (self.project_id, self.request_id)

    def frame(self) -> dict[str, object]:
        """What the executer is sent."""
        return wire.kml_request(self.request_id, self.kml)


@dataclass
class _Kept:
    at: float
    result: wire.KmlResult
    size: int
    key_id: str | None


class Requests:
    """The pending requests and the kept answers of one relay."""

    def __init__(
        self,
        *,
        kept_bytes: int = 64 * 1024 * 1024,
        kept_bytes_project: int = 16 * 1024 * 1024,
    ) -> None:
        self.pending: dict[Key, Pending] = {}
        self.kept: OrderedDict[Key, _Kept] = OrderedDict()
        self.kept_bytes = kept_bytes
        self.kept_bytes_project = kept_bytes_project
        self._kept_total = 0
        self._kept_by_project: Counter[str] = Counter()
        self._kept_count: Counter[str] = Counter()
        self.by_project: Counter[str] = Counter()
        """Requests of runtime connections in flight, per project."""
        self.bytes_by_project: Counter[str] = Counter()
        """The bytes of their KML, per project."""

    def add(self, pending: Pending, on_expire: Callable[[Key], None]) -> None:
        self.pending[pending.key] = pending
        if pending.asker is not None:
            pending.asker.pending += 1
            pending.asker.pending_bytes += len(pending.kml)
            self.by_project[pending.project_id] += 1
            self.bytes_by_project[pending.project_id] += len(pending.kml)
        loop = asyncio.get_running_loop()
        delay = max(0.0, pending.deadline - time.monotonic())
        pending.timer = loop.call_at(loop.time() + delay, on_expire, pending.key)

    def pop(self, key: Key) -> Pending | None:
        pending = self.pending.pop(key, None)
        if pending is None:
            return None
        if pending.timer is not None:
            pending.timer.cancel()
        if pending.asker is not None:
            pending.asker.pending -= 1
            pending.asker.pending_bytes -= len(pending.kml)
            self.by_project[pending.project_id] -= 1
            self.bytes_by_project[pending.project_id] -= len(pending.kml)
            if self.by_project[pending.project_id] <= 0:
                del self.by_project[pending.project_id]
                del self.bytes_by_project[pending.project_id]
        return pending

    # -- answers kept ------------------------------------------------------------------------

    def keep(
        self, project_id: str, result: wire.KmlResult, size: int, key_id: str | None = None
    ) -> None:
        """Keep an answer for re-sent requests of the key ``key_id`` (not when it alone is over
        the project's bound); the oldest kept go first past the bounds."""
        key = (project_id, result.request_id)
        self._forget(key)
        if size > self.kept_bytes_project or size > self.kept_bytes:
            return
        self.kept[key] = _Kept(time.monotonic(), result, size, key_id)
        self._kept_total += size
        self._kept_by_project[project_id] += size
        self._kept_count[project_id] += 1
        self._trim(project_id)

    def kept_answer(self, key: Key) -> wire.KmlResult | None:
        self._trim(None)
        found = self.kept.get(key)
        return None if found is None else found.result

    def owner(self, key: Key) -> tuple[bool, str | None]:
        """Whether the request id is in use (in flight, or its answer kept), and by which key."""
        pending = self.pending.get(key)
        if pending is not None:
            return True, pending.key_id
        found = self.kept.get(key)
        return (True, found.key_id) if found is not None else (False, None)

    @property
    def kept_size(self) -> int:
        return self._kept_total

    def _forget(self, key: Key) -> None:
        old = self.kept.pop(key, None)
        if old is not None:
            self._kept_total -= old.size
            self._kept_by_project[key[0]] -= old.size
            self._kept_count[key[0]] -= 1
            if self._kept_count[key[0]] <= 0:
                del self._kept_by_project[key[0]]
                del self._kept_count[key[0]]

    def _trim(self, project_id: str | None) -> None:
        now = time.monotonic()
        while self.kept:
            key, oldest = next(iter(self.kept.items()))
            if now - oldest.at > KEEP_RESULTS_S or self._kept_total > self.kept_bytes:
                self._forget(key)
            else:
                break
        if project_id is not None:  # one project's answers never push out another's
            while (
                self._kept_by_project.get(project_id, 0) > self.kept_bytes_project
                or self._kept_count.get(project_id, 0) > KEEP_RESULTS
            ):
                mine = next(k for k in self.kept if k[0] == project_id)
                self._forget(mine)

    # -- waiters -----------------------------------------------------------------------------

    def forget_waiter(self, key: Key, waiter: Waiter) -> Pending | None:
        """Remove a waiter of the request ``key``; the request, if that left nobody waiting for
        it (an orphan)."""
        pending = self.pending.get(key)
        if pending is None or waiter not in pending.waiters:
            return None
        pending.waiters.remove(waiter)
        if pending.waiters or pending.internal:
            return None
        pending.orphaned = time.monotonic()
        return pending

    def join(self, pending: Pending, waiter: Waiter) -> None:
        pending.waiters.append(waiter)
        pending.orphaned = None

    def clear(self) -> None:
        for key in list(self.pending):
            self.pop(key)


async def deliver(waiters: list[Waiter], answer: Answer) -> None:
    for waiter in list(waiters):
        with contextlib.suppress(Exception):
            await waiter(answer)
