"""The ``/ws`` route: a tunnel connection authenticated, then each of its frames read, checked
and handed to the relay (docs/tunnel.md).

Authentication is a Bearer header on the upgrade (role and executer id in the query string) or a
first ``auth`` frame within :data:`AUTH_WAIT_S` seconds; the key is checked by
:func:`kyronix.server.accounts.authenticate`, as for HTTP. A refusal closes with 4401 (4429 when
rate limited), and the reason says why. A frame that is not what the protocol says gets an
``error`` frame (``bad_frame``, or ``forbidden`` for a frame the connection's role may not send);
the connection lives on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from kyronix import wire
from kyronix.server import accounts
from kyronix.server.relay import Peer, Relay, TunnelFailure
from kyronix.server.relay.pending import Answer
from kyronix.server.state import AppState

__all__ = ["AUTH_WAIT_S", "websocket_endpoint"]

log = logging.getLogger("kyronix.server")

AUTH_WAIT_S = 10.0
KNOWN = frozenset().union(*wire.SENT_BY.values()) | {"auth"}


async def websocket_endpoint(ws: WebSocket) -> None:
    state: AppState = ws.app.state.kx
    await ws.accept()
    if state.draining:
        with contextlib.suppress(Exception):
            await ws.close(code=1012, reason="the server is restarting; connect again")
        return
    peer = await _authenticate(ws, state)
    if peer is None:
        return
    relay = state.relay
    await peer.send(wire.ready(peer.role, peer.project_id, peer.executer_id))
    if peer.role == "executer":
        await relay.attach_executer(peer)
        log.info("executer %s of project %s connected", peer.executer_id, peer.project_id)
    waiters: dict[str, Any] = {}
    try:
        while True:
            try:
                text = await ws.receive_text()
            except (WebSocketDisconnect, RuntimeError):
                break
            except KeyError:  # a binary frame
                await peer.send(wire.error("bad_frame", "send JSON text frames, not binary"))
                continue
            peer.seen = time.monotonic()
            await _dispatch(relay, peer, text, waiters)
    finally:
        peer.closed = True
        for waiter in waiters.values():
            relay.forget_waiter(waiter)
        relay.detach(peer)
        if peer.role == "executer":
            log.info("executer %s of project %s disconnected", peer.executer_id, peer.project_id)


async def _authenticate(ws: WebSocket, state: AppState) -> Peer | None:
    """The connection's peer, or None after closing it (4401, or 4429 when rate limited)."""
    header = ws.headers.get("authorization")
    role: Any = ws.query_params.get("role", "runtime")
    executer_id: Any = ws.query_params.get("executerId")
    key = accounts.bearer(header)
    if key is None:
        try:
            first = wire.parse(await asyncio.wait_for(ws.receive_text(), AUTH_WAIT_S))
        except (TimeoutError, WebSocketDisconnect, KeyError, RuntimeError):
            await _refuse(ws, "authenticate first: a Bearer header or an auth frame")
            return None
        if isinstance(first, wire.BadFrame) or not isinstance(first, wire.Auth):
            await _refuse(
                ws, 'the first frame must be {"type": "auth", "apiKey": ..., "role": ...}'
            )
            return None
        key, role, executer_id = first.api_key, first.role, first.executer_id
    if role not in wire.ROLES:
        await _refuse(ws, "role must be executer or runtime")
        return None
    if executer_id is not None and not wire.valid_executer_id(executer_id):
        await _refuse(ws, f"executerId must match {wire.EXECUTER_ID.pattern}")
        return None
    try:
        info = accounts.authenticate(state.keys, key)
    except accounts.KeyRefused as exc:
        if exc.retry_after is not None:
            seconds = max(1, math.ceil(exc.retry_after))
            await _refuse(ws, f"{exc} (retry after {seconds} s)", wire.CLOSE_RATE_LIMITED)
        else:
            await _refuse(ws, str(exc))
        return None
    if role == "executer" and executer_id is None:
        executer_id = wire.DEFAULT_EXECUTER
    return Peer(
        ws, role, info.project_id, executer_id if role == "executer" else None, key_id=info.id
    )


async def _refuse(ws: WebSocket, reason: str, code: int = wire.CLOSE_UNAUTHORIZED) -> None:
    with contextlib.suppress(Exception):
        await ws.close(code=code, reason=reason[:120])


async def _dispatch(relay: Relay, peer: Peer, text: str, waiters: dict[str, Any]) -> None:
    data = wire.decode(text)
    if isinstance(data, wire.BadFrame):
        await peer.send(wire.error("bad_frame", data.reason))
        return
    kind = data["type"]
    if kind not in KNOWN:
        await peer.send(wire.error("bad_frame", f"unknown frame type {kind!r:.40}"))
        return
    if kind not in wire.SENT_BY[peer.role]:
        eid = data.get("executionId")
        await peer.send(
            wire.error(
                "forbidden",
                f"a{'n' if peer.role == 'executer' else ''} {peer.role} may not send {kind!r} "
                f"frames",
                execution_id=eid if isinstance(eid, str) else None,
            )
        )
        return
    frame = wire.from_dict(data)
    if isinstance(frame, wire.BadFrame):
        await peer.send(wire.error("bad_frame", frame.reason, execution_id=frame.request_id))
    elif isinstance(frame, wire.Ping):
        await peer.send(wire.pong(frame.ts))
    elif isinstance(frame, wire.KmlRequest):
        await _kml_request(relay, peer, frame, waiters)
    elif isinstance(frame, wire.KmlResult):
        await relay.result(peer, frame)
    elif isinstance(frame, wire.KmlProgress):
        await relay.progress(peer, frame)
    elif isinstance(frame, wire.Resolve):
        if frame.resolution not in wire.RULINGS:
            await peer.send(
                wire.error("bad_frame", "resolve: 'resolution' must be rerun, skipped or applied")
            )
            return
        await relay.resolve(peer, frame)
    elif isinstance(frame, wire.Resolved | wire.ErrorFrame):  # an executer's answer to a resolve
        await relay.resolved(peer, frame)


async def _kml_request(
    relay: Relay, peer: Peer, frame: wire.KmlRequest, waiters: dict[str, Any]
) -> None:
    request_id = frame.request_id

    async def waiter(answer: Answer) -> None:
        await peer.send(wire.as_dict(answer))

    old = waiters.pop(request_id, None)
    if old is not None:
        relay.forget_waiter(old)
    waiters[request_id] = waiter
    try:
        await relay.request(
            peer.project_id, request_id, frame.kml, waiter, executer_id=frame.executer_id,
            timeout=frame.timeout or wire.DEFAULT_TIMEOUT_S,
        )  # fmt: skip
    except TunnelFailure as exc:
        waiters.pop(request_id, None)
        await peer.send(wire.error(exc.code, exc.message, execution_id=request_id))
