"""The WebSocket transport under ``/ws``: uvicorn's, cut off once the server has closed.

After the server sends its close frame (a connection over its limits, revoked, replaced),
uvicorn keeps reading for up to ten seconds, waiting for the peer's close frame, and parses
everything the peer sends meanwhile only to discard it. A peer that floods on instead of
closing would keep the event loop busy with frames nobody reads, connection after connection.
Here a peer may send :data:`AFTER_CLOSE_BYTES` after the server's close frame (enough for a
close frame and what was already in flight); past that its connection is aborted unread.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

__all__ = ["AFTER_CLOSE_BYTES", "TunnelProtocol"]

AFTER_CLOSE_BYTES = 64 * 1024


class TunnelProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after_close = 0
        """Bytes the peer sent since the server's close frame."""

    def data_received(self, data: bytes) -> None:
        if self.close_sent:
            self.after_close += len(data)
            if self.after_close > AFTER_CLOSE_BYTES:
                self.transport.abort()
                return
        super().data_received(data)
