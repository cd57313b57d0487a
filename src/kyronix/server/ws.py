"""The ``/ws`` route: a tunnel connection authenticated, then each of its frames read, checked
and handed to the relay (docs/tunnel.md).

Authentication is a Bearer header on the upgrade (role and executer id in the query string) or a
first ``auth`` frame (at most :data:`AUTH_FRAME_BYTES`) within :data:`AUTH_WAIT_S` seconds; the
key is checked by :func:`kyronix.server.accounts.authenticate`, as for HTTP (with the failures
of the client's address counted). A refusal closes with 4401, or 4429 when throttled; an
executer id held by another key's live connection closes with 4409.

Every frame first spends from the connection's budget and its project's, in frames and in bytes
(:meth:`Relay.admit`, ``tunnel.framesPerSecond``...): over it, the frame is dropped unread and
the connection told ``rate_limited``; a burst more of dropped frames and it is closed (1008,
which counts as a failed authentication of its address). A frame over ``tunnel.maxFrameBytes``
closes it (1009). A frame that is
not what the protocol says gets an ``error`` frame (``bad_frame``, or ``forbidden`` for a frame
the connection's role may not send), and an answer to something the relay never asked this
connection is refused (``unknown_request``): the connection lives on, up to
``tunnel.maxRefused`` refusals.
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
from kyronix.server.relay import (
    CLOSE_CLAIMED,
    CLOSE_POLICY,
    Answer,
    Peer,
    Relay,
    TunnelFailure,
    Verdict,
    connection_budget,
)
from kyronix.server.state import AppState

__all__ = ["AUTH_FRAME_BYTES", "AUTH_WAIT_S", "websocket_endpoint"]

log = logging.getLogger("kyronix.server")

AUTH_WAIT_S = 10.0
AUTH_FRAME_BYTES = 4096
CLOSE_TOO_BIG = 1009
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
    relay.connect(peer)
    if peer.role == "executer":
        refused = await relay.claim(peer)
        if refused is not None:
            relay.detach(peer)
            await peer.close(CLOSE_CLAIMED, refused)
            return
    await peer.send(wire.ready(peer.role, peer.project_id, peer.executer_id))
    if peer.role == "executer":
        await relay.attach_executer(peer)
        log.info("executer %s of project %s connected", peer.executer_id, peer.project_id)
    try:
        await _serve(ws, state, peer)
    finally:
        peer.closed = True
        for request_id, waiter in list(peer.waiters.items()):
            relay.forget_waiter(peer.project_id, request_id, waiter)
        relay.detach(peer)
        if peer.role == "executer":
            log.info("executer %s of project %s disconnected", peer.executer_id, peer.project_id)


async def _serve(ws: WebSocket, state: AppState, peer: Peer) -> None:
    limits = state.config.tunnel
    while not peer.closed:
        try:
            text = await ws.receive_text()
        except (WebSocketDisconnect, RuntimeError):
            return
        except KeyError:  # a binary frame
            text = None
        now = time.monotonic()
        peer.seen = now
        size = 0 if text is None else len(text) if text.isascii() else len(text.encode())
        verdict = state.relay.admit(peer, now, size)
        if verdict is Verdict.CLOSE:
            log.info("a connection of project %s closed: over its frame rate", peer.project_id)
            await _close_for_limits(
                state, peer, "too many frames: over the rate limit for too long"
            )
            return
        if verdict is Verdict.LIMITED:
            if peer.budget.tell(now):
                after = round(peer.budget.retry_after(), 3)
                message = "too many frames; this one and the next are dropped until the rate falls"
                await peer.send(wire.error("rate_limited", message, retryAfter=after))
            continue
        if text is None:
            await peer.send(wire.error("bad_frame", "send JSON text frames, not binary"))
            continue
        if size > limits.max_frame:
            await peer.close(CLOSE_TOO_BIG, f"a frame is at most {limits.max_frame} bytes")
            return
        if not await _dispatch(state.relay, peer, text):
            peer.refused += 1
            if peer.refused > limits.max_refused:
                await _close_for_limits(state, peer, "too many refused frames")
                return


async def _close_for_limits(state: AppState, peer: Peer, reason: str) -> None:
    """Close with 1008; it counts as a failed authentication of the connection's address, so
    a client that reconnects to flood again is soon refused before its key is even checked."""
    state.keys.failures.failed(peer.address)
    await peer.close(CLOSE_POLICY, reason)


async def _authenticate(ws: WebSocket, state: AppState) -> Peer | None:
    """The connection's peer, or None after closing it (4401, or 4429 when throttled)."""
    header = ws.headers.get("authorization")
    role: Any = ws.query_params.get("role", "runtime")
    executer_id: Any = ws.query_params.get("executerId")
    client = ws.client.host if ws.client is not None else None
    key = accounts.bearer(header)
    if key is None:
        try:
            text = await asyncio.wait_for(ws.receive_text(), AUTH_WAIT_S)
        except (TimeoutError, WebSocketDisconnect, KeyError, RuntimeError):
            await _refuse(ws, "authenticate first: a Bearer header or an auth frame")
            return None
        if len(text) > AUTH_FRAME_BYTES:  # nobody unauthenticated makes the server parse more
            state.keys.failures.failed(client)
            await _refuse(ws, f"an auth frame is at most {AUTH_FRAME_BYTES} bytes")
            return None
        first = wire.parse(text)
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
        info = accounts.authenticate(state.keys, key, client)
    except accounts.KeyRefused as exc:
        if exc.retry_after is not None:
            seconds = max(1, math.ceil(exc.retry_after))
            await _refuse(ws, f"{exc} (retry after {seconds} s)", wire.CLOSE_RATE_LIMITED)
        else:
            await _refuse(ws, str(exc))
        return None
    if role == "executer" and executer_id is None:
        executer_id = wire.DEFAULT_EXECUTER
    limits = state.config.tunnel
    return Peer(
        ws, role, info.project_id, executer_id if role == "executer" else None,
        key_id=info.id, address=client,
        budget=connection_budget(limits),
    )  # fmt: skip


async def _refuse(ws: WebSocket, reason: str, code: int = wire.CLOSE_UNAUTHORIZED) -> None:
    with contextlib.suppress(Exception):
        await ws.close(code=code, reason=reason[:120])


def _read(peer: Peer, text: str) -> wire.Frame | tuple[dict[str, Any], bool]:
    """The frame, or what to answer instead and whether that counts as a refusal."""
    data = wire.decode(text)
    if isinstance(data, wire.BadFrame):
        return wire.error("bad_frame", data.reason, execution_id=data.request_id), False
    kind = data["type"]
    if kind not in KNOWN:
        return wire.error("bad_frame", f"unknown frame type {kind!r:.40}"), False
    if kind not in wire.SENT_BY[peer.role]:
        eid = data.get("executionId")
        article = "an" if peer.role == "executer" else "a"
        message = f"{article} {peer.role} may not send {kind!r} frames"
        return wire.error(
            "forbidden", message, execution_id=eid if isinstance(eid, str) else None
        ), True
    frame = wire.from_dict(data, decoded=True)
    if isinstance(frame, wire.BadFrame):
        return wire.error("bad_frame", frame.reason, execution_id=frame.request_id), False
    return frame


async def _dispatch(relay: Relay, peer: Peer, text: str) -> bool:
    """Hand one frame to the relay; False when it was refused (it counts against the
    connection). Reading it is timed and spent from the connection's budget and its
    project's (``tunnel.parseSecondsPerSecond``)."""
    started = time.perf_counter()  # (thread_time() is a system call: 0.8 µs, not 0.06)
    frame = _read(peer, text)
    relay.spent(peer, time.perf_counter() - started)
    if isinstance(frame, tuple):
        answer, refused = frame
        await peer.send(answer)
        return not refused
    if isinstance(frame, wire.Ping):
        await peer.send(wire.pong(frame.ts))
    elif isinstance(frame, wire.KmlRequest):
        await _kml_request(relay, peer, frame)
    elif isinstance(frame, wire.KmlResult):
        if not await relay.result(peer, frame, len(text)):
            await peer.send(_unknown_request(frame.request_id))
            return False
    elif isinstance(frame, wire.KmlProgress):
        return await relay.progress(peer, frame)
    elif isinstance(frame, wire.Resolve):
        if frame.resolution not in wire.RULINGS:
            await peer.send(
                wire.error("bad_frame", "resolve: 'resolution' must be rerun, skipped or applied")
            )
            return True
        await relay.resolve(peer, frame)
    elif isinstance(frame, wire.Resolved | wire.ErrorFrame) and not await relay.resolved(
        peer, frame
    ):  # an executer's answer to a resolve it was not sent
        await peer.send(_unknown_request(frame.request_id or "?", "resolve"))
        return False
    return True


def _unknown_request(request_id: str, what: str = "request") -> dict[str, Any]:
    return wire.error(
        "unknown_request",
        f"no {what} {request_id!r} was sent to this connection, or it was answered already: "
        f"the answer was refused and recorded nowhere",
        execution_id=request_id if what == "request" else None,
        request_id=request_id if what != "request" else None,
    )


async def _kml_request(relay: Relay, peer: Peer, frame: wire.KmlRequest) -> None:
    request_id, waiters = frame.request_id, peer.waiters

    async def waiter(answer: Answer) -> None:
        if not isinstance(answer, wire.KmlProgress) and waiters.get(request_id) is waiter:
            del waiters[request_id]  # answered: nothing left to forget when the client goes
        await peer.send(wire.as_dict(answer))

    old = waiters.pop(request_id, None)
    if old is not None:
        relay.forget_waiter(peer.project_id, request_id, old)
    waiters[request_id] = waiter
    try:
        await relay.request(
            peer.project_id, request_id, frame.kml, waiter, executer_id=frame.executer_id,
            timeout=frame.timeout or wire.DEFAULT_TIMEOUT_S, asker=peer,
            session_id=frame.session_id,
        )  # fmt: skip
    except TunnelFailure as exc:
        if waiters.get(request_id) is waiter:
            del waiters[request_id]
        await peer.send(wire.error(exc.code, exc.message, execution_id=request_id))
