"""One authenticated tunnel connection, as the relay sees it, and what it may take of the server.

A connection spends a token per frame from its :class:`FrameBudget` (a token bucket: the
``tunnel.framesPerSecond`` and ``frameBurst`` limits). Past it, its frames are dropped unread and
it is told once a second (``rate_limited``); if it goes on sending as many frames again while
limited, it is closed (1008). Frames the relay refuses (a result for a request it was not sent,
say) count too: past ``tunnel.maxRefused`` of them, it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from kyronix import wire
from kyronix.server.config import TunnelLimits

__all__ = [
    "CLOSE_POLICY",
    "FrameBudget",
    "Peer",
    "Socket",
    "Verdict",
    "connection_budget",
    "project_budget",
]

CLOSE_POLICY = 1008
"""The WebSocket close code of a connection that broke the limits (policy violation)."""


class Socket(Protocol):
    """What the relay needs of a WebSocket (Starlette's, or a test's)."""

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


class Verdict(Enum):
    OK = "ok"
    LIMITED = "limited"
    """Over the rate: the frame is dropped."""
    CLOSE = "close"
    """Over the rate for as many frames again: the connection goes."""


@dataclass
class FrameBudget:
    """Token buckets of frames, of bytes and of parsing time: ``burst`` frames (``byte_burst``
    bytes, ``parse_burst`` seconds) at once, refilled at ``rate`` frames (``byte_rate`` bytes,
    ``parse_rate`` seconds) a second. The parsing time is spent after the fact
    (:meth:`spend`): a frame that cost more than was left is let through, and the frames after
    it wait until the bucket is above zero again (JSON whose values are many small numbers
    costs fifty times more to read than a string of the same bytes). Frames dropped for want of
    tokens fill an "over" bucket that drains at ``rate``: past ``burst`` of them the sender is
    closed. So one that keeps on at more than twice the rate is closed, however often a frame
    of it gets through."""

    rate: float
    burst: float
    byte_rate: float = float("inf")
    byte_burst: float = float("inf")
    parse_rate: float = float("inf")
    parse_burst: float = float("inf")
    tokens: float = 0.0
    byte_tokens: float = 0.0
    parse_tokens: float = 0.0
    started: bool = False
    at: float = 0.0
    over: float = 0.0
    """Frames dropped lately (draining at ``rate``)."""
    told: float = float("-inf")
    """When the connection was last told it is rate limited."""

    def take(self, now: float, size: int = 0) -> Verdict:
        if not self.started:  # the first frame: full buckets
            self.started, self.at = True, now
            self.tokens, self.byte_tokens = self.burst, self.byte_burst
            self.parse_tokens = self.parse_burst
        elapsed = max(0.0, now - self.at)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.byte_tokens = min(self.byte_burst, self.byte_tokens + elapsed * self.byte_rate)
        self.parse_tokens = min(self.parse_burst, self.parse_tokens + elapsed * self.parse_rate)
        self.over = max(0.0, self.over - elapsed * self.rate)
        self.at = now
        if self.tokens >= 1 and self.byte_tokens >= size and self.parse_tokens > 0:
            self.tokens -= 1
            self.byte_tokens -= size
            return Verdict.OK
        return self.penalize()

    def spend(self, seconds: float) -> None:
        """What reading the frame let through cost (it may leave the bucket below zero)."""
        self.parse_tokens -= seconds

    def penalize(self) -> Verdict:
        """Count one frame dropped (here, or by the project's budget)."""
        self.over += 1
        return Verdict.CLOSE if self.over > self.burst else Verdict.LIMITED

    def retry_after(self) -> float:
        frames = max(0.0, (1 - self.tokens) / self.rate)
        parsing = max(0.0, -self.parse_tokens / self.parse_rate)
        return max(frames, parsing)

    def tell(self, now: float) -> bool:
        """Whether to tell the connection it is limited now (at most once a second)."""
        if now - self.told < 1.0:
            return False
        self.told = now
        return True


def connection_budget(limits: TunnelLimits) -> FrameBudget:
    """A new connection's budget (``tunnel.framesPerSecond``, ``bytesPerSecond``, ...)."""
    return FrameBudget(
        limits.frames_per_second, float(limits.frame_burst),
        float(limits.bytes_per_second), float(limits.byte_burst),
        limits.parse_seconds_per_second, limits.parse_burst,
    )  # fmt: skip


def project_budget(limits: TunnelLimits) -> FrameBudget:
    """A project's budget, over its connections to one replica (``...PerProject``)."""
    return FrameBudget(
        limits.project_frames_per_second, float(limits.project_frame_burst),
        float(limits.project_bytes_per_second), float(limits.project_byte_burst),
        limits.project_parse_seconds_per_second, limits.project_parse_burst,
    )  # fmt: skip


@dataclass(eq=False)
class Peer:
    """One authenticated connection: a runtime client, or an executer of ``executer_id``."""

    ws: Socket
    role: wire.Role
    project_id: str
    executer_id: str | None = None
    key_id: str | None = None
    """The API key it authenticated with: who it is (an executer id belongs to it)."""
    address: str | None = None
    budget: FrameBudget = field(default_factory=lambda: FrameBudget(200.0, 400.0))
    """Its own frame budget (:meth:`Relay.admit` spends it, and its project's)."""
    seen: float = field(default_factory=time.monotonic)
    closed: bool = False
    refused: int = 0
    """Frames the relay refused from this connection."""
    pending: int = 0
    """Requests of this (runtime) connection in flight."""
    pending_bytes: int = 0
    """The bytes of their KML."""
    resolving: int = 0
    """Its ``resolve`` frames waiting for an answer."""
    waiters: dict[str, Any] = field(default_factory=dict)
    """Its requests not answered yet -> the waiter that sends it their frames (forgotten when
    the answer goes out, or the connection)."""
    _send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, frame: dict[str, Any]) -> bool:
        """Send a frame; False if the connection is gone (never raises for that)."""
        if self.closed:
            return False
        try:
            async with self._send_lock:
                await self.ws.send_text(wire.encode(frame))
            return True
        except Exception:  # the connection went away under us
            self.closed = True
            return False

    async def close(self, code: int, reason: str) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self.ws.close(code=code, reason=reason[:120])
