"""The runtime client's end of the WebSocket tunnel (docs/tunnel.md), sync and asyncio.

One connection per client, opened on the first call (``<base_url>/ws``, ``http`` → ``ws``,
``https`` → ``wss``; role ``runtime``; ``Authorization: Bearer``) and kept. A reader (a daemon
thread, or an asyncio task) owns receiving: it answers ``ping``, and hands each ``kml_result``,
``kml_progress``, ``resolved`` and ``error`` frame to the call waiting for its
``executionId``, so several calls share one connection.

When the connection drops, every call still waiting connects again (with backoff and jitter,
one connection shared again) and sends **its same frame** (same ``executionId``): the server
attaches it to the pending request, or answers with the result it kept. A call ends with its
answer, the error its ``error`` frame means, or, once its timeout (+ :data:`GRACE`) has passed,
:class:`APITimeoutError` (still connected) / :class:`APIConnectionError` (could not reconnect).

A connection passed in (``Kyronix(ws=…)``) is used as it is: if its opening request carried an
``Authorization`` header it is taken as authenticated, otherwise an ``auth`` frame is sent first
and its ``ready`` awaited. If it drops, the client connects to ``<base_url>/ws`` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any, TypeAlias

from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as aconnect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidStatus,
    InvalidURI,
    WebSocketException,
)
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect

from kyronix import wire
from kyronix.client._base import ClientConfig, ws_url
from kyronix.client._frames import (
    GRACE,
    Answer,
    OnProgress,
    classify,
    close_error,
    waiter_key,
)
from kyronix.client._retry import backoff
from kyronix.errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    KyronixError,
    KyronixSignal,
    KyronixTypeError,
    KyronixUsageError,
    NotFoundError,
)

__all__ = ["AsyncTunnel", "OnProgress", "SyncTunnel"]

Item: TypeAlias = tuple[int, Answer | None]
"""What a waiter receives: (connection generation, the answer; None: that connection dropped)."""

OPEN_TIMEOUT = 10.0


class _Retry(KyronixSignal):
    """Internal: this attempt to connect failed in a way worth trying again."""

    def __init__(self, error: KyronixError) -> None:
        super().__init__(error.message)
        self.error = error


_CONNECT_FAILURES = (OSError, TimeoutError, WebSocketException)


def _has_auth_header(conn: SyncConnection | AsyncConnection) -> bool:
    request = conn.request
    return request is not None and "Authorization" in request.headers


def _connect_failure(exc: Exception, url: str) -> tuple[KyronixError, bool]:
    """(the error a failed opening means, whether trying again may help)."""
    if isinstance(exc, KyronixError):
        return exc, False
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if status in (401, 403):
            return AuthenticationError(
                f"the tunnel at {url} refused the API key (HTTP {status}); check KYRONIX_API_KEY",
                code="invalid_api_key",
                status_code=status,
            ), False
        if status == 404:
            return NotFoundError(
                f"{url} has no WebSocket tunnel (HTTP 404): check base_url, and that the server "
                f"is a kyronix serve with /ws",
                code="not_found",
                status_code=404,
            ), False
        if status != 429 and status < 500:
            return APIError(
                f"the tunnel at {url} refused the connection (HTTP {status})",
                code=f"http_{status}",
                status_code=status,
            ), False
    if isinstance(exc, InvalidURI):
        return KyronixUsageError(f"the tunnel address {url!r} is not a valid ws:// URL"), False
    detail = str(exc) or type(exc).__name__
    return APIConnectionError(f"cannot open the tunnel {url}: {detail}"), True


def _opening_failed(exc: Exception, url: str) -> KyronixError:
    error, retry = _connect_failure(exc, url)
    if retry:
        return _Retry(error)
    return error


class _Base:
    """What both tunnels keep: settings, the waiters by id, the connection's generation."""

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._url = ws_url(config.base_url)
        self._headers = {"Authorization": f"Bearer {config.api_key}"}
        self._waiters: dict[str, queue.Queue[Item] | asyncio.Queue[Item]] = {}
        self._generation = 0
        self._reconnects = 0
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise KyronixUsageError("this client is closed; make a new one to use the tunnel")

    def _register(self, key: str, waiter: queue.Queue[Item] | asyncio.Queue[Item]) -> None:
        self._check_open()
        if key in self._waiters:
            raise KyronixUsageError(f"a call for {key!r} is already waiting on this tunnel")
        self._waiters[key] = waiter

    def _dispatch(self, message: str | bytes, generation: int) -> wire.Ping | None:
        """Route one received frame to its waiter; a ``ping`` is returned (to be answered).
        A frame that is not what docs/tunnel.md says (not JSON, nested too deep, a binary
        frame...) is a :class:`~kyronix.wire.BadFrame`: ignored, the connection lives on."""
        frame = wire.parse(message)
        if isinstance(frame, wire.BadFrame):
            return None
        self._reconnects = 0
        if isinstance(frame, wire.Ping):
            return frame
        routed = classify(frame)
        if routed is not None:
            keys, answer = routed
            for key in keys:
                waiter = self._waiters.get(key)
                if waiter is not None:
                    waiter.put_nowait((generation, answer))
                    break
        return None

    def _dropped(self, generation: int) -> None:
        for waiter in list(self._waiters.values()):
            waiter.put_nowait((generation, None))

    def _reconnect_delay(self) -> float:
        delay = backoff(self._reconnects)
        self._reconnects += 1
        return delay

    def _timed_out(self, frame: Mapping[str, Any], timeout: float) -> APITimeoutError:
        return APITimeoutError(
            f"no answer to {frame['type']} {waiter_key(frame)} within {timeout:g} s (nor the "
            f"server's own timeout); the request may still be running at the executer: send it "
            f"again with the same KML to get its result"
        )

    def _unreachable(self, last: KyronixError | None, timeout: float) -> APIConnectionError:
        detail = f": {last.message}" if last is not None else ""
        return APIConnectionError(
            f"could not (re)connect to the tunnel {self._url} within {timeout:g} s{detail}"
        )


def _closed_error() -> APIConnectionError:
    return APIConnectionError("the client was closed while a tunnel call was waiting")


class SyncTunnel(_Base):
    """The tunnel for :class:`kyronix.Kyronix`: a reader thread, one queue per waiting call."""

    def __init__(self, config: ClientConfig, ws: object = None) -> None:
        super().__init__(config)
        if ws is not None and not isinstance(ws, SyncConnection):
            raise KyronixTypeError(
                f"ws must be a connection from websockets.sync.client.connect(), not "
                f"{type(ws).__name__} (an asyncio connection goes to AsyncKyronix)"
            )
        self._given: SyncConnection | None = ws
        self._conn: SyncConnection | None = None
        self._lock = threading.Lock()
        self._connecting = threading.Lock()
        self._readers: list[threading.Thread] = []

    def call(
        self, frame: dict[str, Any], timeout: float, on_progress: OnProgress | None = None
    ) -> Any:
        """Send ``frame`` and wait for its answer (re-sending it after every reconnect)."""
        key = waiter_key(frame)
        deadline = time.monotonic() + timeout + GRACE
        waiter: queue.Queue[Item] = queue.Queue()
        with self._lock:
            self._register(key, waiter)
        try:
            while True:
                conn, generation = self._connection(deadline, timeout)
                try:
                    conn.send(json.dumps(frame))
                except ConnectionClosed:
                    self._lost(conn)
                    continue
                while True:
                    remaining = deadline - time.monotonic()
                    try:
                        got, answer = waiter.get(timeout=max(0.0, remaining))
                    except queue.Empty:
                        raise self._timed_out(frame, timeout) from None
                    if answer is None:
                        if self._closed:
                            raise _closed_error()
                        if got == generation:
                            break  # that connection dropped: connect again, send again
                    elif answer.kind == "progress":
                        if on_progress is not None:
                            on_progress(answer.value)
                    elif answer.kind == "error":
                        raise answer.value
                    else:
                        return answer.value
        finally:
            with self._lock:
                self._waiters.pop(key, None)

    def _connection(self, deadline: float, timeout: float) -> tuple[SyncConnection, int]:
        if not self._connecting.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise self._unreachable(None, timeout)
        try:
            return self._connect(deadline, timeout)
        finally:
            self._connecting.release()

    def _connect(self, deadline: float, timeout: float) -> tuple[SyncConnection, int]:
        """Holding ``_connecting``: the live connection, or a new one (backing off)."""
        last: KyronixError | None = None
        while True:
            with self._lock:
                self._check_open()
                if self._conn is not None:
                    return self._conn, self._generation
            remaining = deadline - time.monotonic()
            if self._generation or last is not None:  # a reconnection: back off first
                delay = self._reconnect_delay()
                if delay >= remaining:
                    raise self._unreachable(last, timeout)
                time.sleep(delay)
                remaining -= delay
            try:
                conn = self._open(remaining)
            except _Retry as retry:
                last = retry.error
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    self._check_open()
                self._generation += 1
                self._conn = conn
                reader = threading.Thread(
                    target=self._read,
                    args=(conn, self._generation),
                    name="kyronix-tunnel-reader",
                    daemon=True,
                )
                self._readers = [r for r in self._readers if r.is_alive()] + [reader]
            reader.start()

    def _open(self, remaining: float) -> SyncConnection:
        given, self._given = self._given, None
        try:
            if given is not None:
                if not _has_auth_header(given):
                    given.send(json.dumps(wire.auth(self._config.api_key)))
                    self._await_ready(given, remaining)
                return given
            conn = connect(
                self._url,
                additional_headers=self._headers,
                open_timeout=min(OPEN_TIMEOUT, max(remaining, 0.01)),
            ).__enter__()  # the context-manager form websockets >= 17.1 asks for; close() ends it
            self._await_ready(conn, remaining)
            return conn
        except (*_CONNECT_FAILURES, KyronixError) as exc:
            raise _opening_failed(exc, self._url) from exc

    def _await_ready(self, conn: SyncConnection, remaining: float) -> None:
        try:
            while True:
                if isinstance(wire.parse(conn.recv(timeout=max(remaining, 0.01))), wire.Ready):
                    return
        except ConnectionClosed:
            error = close_error(conn.close_code, conn.close_reason or "")
            if error is not None:
                raise error from None
            raise
        except TimeoutError:
            conn.close()
            raise

    def _read(self, conn: SyncConnection, generation: int) -> None:
        try:
            for message in conn:
                ping = self._dispatch(message, generation)
                if ping is not None:
                    conn.send(json.dumps(wire.pong(ping.ts)))
        except ConnectionClosed:
            pass
        finally:
            self._lost(conn)
            with self._lock:
                self._dropped(generation)

    def _lost(self, conn: SyncConnection) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
        with contextlib.suppress(Exception):
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for c in (self._conn, self._given) if c is not None]
            self._conn = self._given = None
            readers = list(self._readers)
            self._dropped(-1)
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
        for reader in readers:
            if reader is not threading.current_thread():
                reader.join(OPEN_TIMEOUT)


class AsyncTunnel(_Base):
    """The tunnel for :class:`kyronix.AsyncKyronix`: a reader task, calls in flight together."""

    def __init__(self, config: ClientConfig, ws: object = None) -> None:
        super().__init__(config)
        if ws is not None and not isinstance(ws, AsyncConnection):
            raise KyronixTypeError(
                f"ws must be a connection from websockets.asyncio.client.connect(), not "
                f"{type(ws).__name__} (a sync connection goes to Kyronix)"
            )
        self._given: AsyncConnection | None = ws
        self._conn: AsyncConnection | None = None
        self._connecting: asyncio.Lock | None = None
        self._readers: set[asyncio.Task[None]] = set()

    async def call(
        self, frame: dict[str, Any], timeout: float, on_progress: OnProgress | None = None
    ) -> Any:
        """Send ``frame`` and wait for its answer (re-sending it after every reconnect)."""
        key = waiter_key(frame)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout + GRACE
        waiter: asyncio.Queue[Item] = asyncio.Queue()
        self._register(key, waiter)
        try:
            while True:
                conn, generation = await self._connection(deadline, timeout)
                try:
                    await conn.send(json.dumps(frame))
                except ConnectionClosed:
                    await self._lost(conn)
                    continue
                while True:
                    remaining = deadline - loop.time()
                    try:
                        got, answer = await asyncio.wait_for(waiter.get(), max(0.0, remaining))
                    except TimeoutError:
                        raise self._timed_out(frame, timeout) from None
                    if answer is None:
                        if self._closed:
                            raise _closed_error()
                        if got == generation:
                            break
                    elif answer.kind == "progress":
                        if on_progress is not None:
                            done = on_progress(answer.value)
                            if inspect.isawaitable(done):
                                await done
                    elif answer.kind == "error":
                        raise answer.value
                    else:
                        return answer.value
        finally:
            self._waiters.pop(key, None)

    async def _connection(self, deadline: float, timeout: float) -> tuple[AsyncConnection, int]:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self._connecting.acquire(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise self._unreachable(None, timeout) from None
        try:
            return await self._connect(deadline, timeout)
        finally:
            self._connecting.release()

    async def _connect(self, deadline: float, timeout: float) -> tuple[AsyncConnection, int]:
        """Holding ``_connecting``: the live connection, or a new one (backing off)."""
        loop = asyncio.get_running_loop()
        last: KyronixError | None = None
        while True:
            self._check_open()
            if self._conn is not None:
                return self._conn, self._generation
            remaining = deadline - loop.time()
            if self._generation or last is not None:
                delay = self._reconnect_delay()
                if delay >= remaining:
                    raise self._unreachable(last, timeout)
                await asyncio.sleep(delay)
                remaining -= delay
            try:
                conn = await self._open(remaining)
            except _Retry as retry:
                last = retry.error
                continue
            if self._closed:
                await conn.close()
                self._check_open()
            self._generation += 1
            self._conn = conn
            task = loop.create_task(self._read(conn, self._generation))
            self._readers.add(task)
            task.add_done_callback(self._readers.discard)

    async def _open(self, remaining: float) -> AsyncConnection:
        given, self._given = self._given, None
        try:
            if given is not None:
                if not _has_auth_header(given):
                    await given.send(json.dumps(wire.auth(self._config.api_key)))
                    await self._await_ready(given, remaining)
                return given
            conn = await aconnect(
                self._url,
                additional_headers=self._headers,
                open_timeout=min(OPEN_TIMEOUT, max(remaining, 0.01)),
            )
            await self._await_ready(conn, remaining)
            return conn
        except (*_CONNECT_FAILURES, KyronixError) as exc:
            raise _opening_failed(exc, self._url) from exc

    async def _await_ready(self, conn: AsyncConnection, remaining: float) -> None:
        try:
            async with asyncio.timeout(max(remaining, 0.01)):
                while True:
                    if isinstance(wire.parse(await conn.recv()), wire.Ready):
                        return
        except ConnectionClosed:
            error = close_error(conn.close_code, conn.close_reason or "")
            if error is not None:
                raise error from None
            raise
        except TimeoutError:
            await conn.close()
            raise

    async def _read(self, conn: AsyncConnection, generation: int) -> None:
        try:
            async for message in conn:
                ping = self._dispatch(message, generation)
                if ping is not None:
                    await conn.send(json.dumps(wire.pong(ping.ts)))
        except ConnectionClosed:
            pass
        finally:
            await self._lost(conn)
            self._dropped(generation)

    async def _lost(self, conn: AsyncConnection) -> None:
        if self._conn is conn:
            self._conn = None
        with contextlib.suppress(Exception):
            await conn.close()

    async def close(self) -> None:
        self._closed = True
        conns = [c for c in (self._conn, self._given) if c is not None]
        self._conn = self._given = None
        self._dropped(-1)
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()
        readers = list(self._readers)
        if readers:
            await asyncio.wait(readers, timeout=OPEN_TIMEOUT)
