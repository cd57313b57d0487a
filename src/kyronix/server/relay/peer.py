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

__all__ = ["CLOSE_POLICY", "FrameBudget", "Peer", "Socket", "Verdict"]

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
    """A token bucket of frames: ``burst`` at once, refilled at ``rate`` a second."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float = 0.0
    over: int = 0
    """Frames dropped since the last one let through."""
    told: float = float("-inf")
    """When the connection was last told it is rate limited."""

    def take(self, now: float) -> Verdict:
        if self.tokens < 0:  # the first frame: a full bucket
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            self.over = 0
            return Verdict.OK
        self.over += 1
        return Verdict.CLOSE if self.over > self.burst else Verdict.LIMITED

    def retry_after(self) -> float:
        return max(0.0, (1 - self.tokens) / self.rate)

    def tell(self, now: float) -> bool:
        """Whether to tell the connection it is limited now (at most once a second)."""
        if now - self.told < 1.0:
            return False
        self.told = now
        return True


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
    seen: float = field(default_factory=time.monotonic)
    closed: bool = False
    refused: int = 0
    """Frames the relay refused from this connection."""
    pending: int = 0
    """Requests of this (runtime) connection in flight."""
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
