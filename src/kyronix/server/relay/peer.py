"""One authenticated tunnel connection, as the relay sees it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from kyronix import wire

__all__ = ["Peer", "Socket"]


class Socket(Protocol):
    """What the relay needs of a WebSocket (Starlette's, or a test's)."""

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


@dataclass(eq=False)
class Peer:
    """One authenticated connection: a runtime client, or an executer of ``executer_id``."""

    ws: Socket
    role: wire.Role
    project_id: str
    executer_id: str | None = None
    key_id: str | None = None
    """The API key it authenticated with (who it is)."""
    seen: float = field(default_factory=time.monotonic)
    closed: bool = False
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
