"""The requests the relay has sent on and not yet seen answered, and the answers it keeps.

A request is **pending** from the moment it is sent on until its ``kml_result`` (or an ``error``)
comes back, or its timeout passes. Pending requests outlive connections: when an executer's
connection drops they wait for it (``lost``), and are sent again when it is back.

An answered request's ``kml_result`` is **kept** for :data:`KEEP_RESULTS_S` seconds (at most
:data:`KEEP_RESULTS` of them): a runtime client that reconnects and sends the same request again
gets it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kyronix import wire
from kyronix.errors import KyronixRunError

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
    lost: bool = False
    """The executer's connection dropped while this was pending."""
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


class Requests:
    """The pending requests and the kept answers of one relay."""

    def __init__(self) -> None:
        self.pending: dict[Key, Pending] = {}
        self.kept: OrderedDict[Key, tuple[float, wire.KmlResult]] = OrderedDict()

    def add(self, pending: Pending, on_expire: Callable[[Key], None]) -> None:
        self.pending[pending.key] = pending
        loop = asyncio.get_running_loop()
        delay = max(0.0, pending.deadline - time.monotonic())
        pending.timer = loop.call_at(loop.time() + delay, on_expire, pending.key)

    def pop(self, key: Key) -> Pending | None:
        pending = self.pending.pop(key, None)
        if pending is not None and pending.timer is not None:
            pending.timer.cancel()
        return pending

    def keep(self, project_id: str, result: wire.KmlResult) -> bool:
        """Keep an answer; False when it had been kept already (a repeat)."""
        key = (project_id, result.request_id)
        repeat = key in self.kept
        self.kept[key] = (time.monotonic(), result)
        self._trim()
        return not repeat

    def kept_answer(self, key: Key) -> wire.KmlResult | None:
        found = self.kept.get(key)
        return None if found is None else found[1]

    def _trim(self) -> None:
        now = time.monotonic()
        while self.kept and (
            len(self.kept) > KEEP_RESULTS
            or now - next(iter(self.kept.values()))[0] > KEEP_RESULTS_S
        ):
            self.kept.popitem(last=False)

    def forget_waiter(self, waiter: Waiter) -> None:
        for pending in self.pending.values():
            if waiter in pending.waiters:
                pending.waiters.remove(waiter)

    def clear(self) -> None:
        for pending in self.pending.values():
            if pending.timer is not None:
                pending.timer.cancel()
        self.pending.clear()


async def deliver(waiters: list[Waiter], answer: Answer) -> None:
    for waiter in list(waiters):
        with contextlib.suppress(Exception):
            await waiter(answer)
