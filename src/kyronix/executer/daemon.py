"""The executer's end of the WebSocket tunnel: dial out to ``kyronix serve``'s ``/ws``, run the
``kml_request`` frames it relays, answer with ``kml_result`` (docs/tunnel.md).

A :class:`Tunnel` belongs to one :class:`~kyronix.executer.KyronixExecuter` and runs on one
event loop (:meth:`Tunnel.run`, until :meth:`Tunnel.stop`). What it does, all frame logic being
in :mod:`kyronix.executer.frames`:

- **connects** as role ``executer`` (``Authorization: Bearer kyr_...`` plus
  ``?role=executer&executerId=...``), waits for ``ready``, and **reconnects** after any drop with
  exponential backoff and jitter (:class:`~kyronix.executer.frames.Backoff`: 0.5 s doubling to
  30 s, reset once a connection has been up 10 s). A refused key (close code 4401, or HTTP
  401/403 on the upgrade) and being replaced by another executer of the same id (4000) end it
  with :class:`TunnelRefusedError` / :class:`TunnelReplacedError`: retrying would not help. An
  id another key's live executer holds (4409) is tried again with the same backoff: whoever
  holds it (another key of the project squatting on it, say) cannot keep this executer off for
  longer than its own connection lives;
- runs each request through the executer's one pipeline (``execute()``: permissions, sandbox,
  receipts) in its base path, several at once, sending ``kml_progress`` as tools start, print
  and finish. A request id that is **already running** is not run again: the run in progress
  answers it. One that **finished recently** (the last 1,000, for 10 minutes) is answered from
  memory, unless one of its tools was uncertain, running or busy (those can change, so the
  pipeline is asked again). Across a restart the per-tool receipts do the same job;
- keeps running a request when the connection drops and sends its ``kml_result`` right after
  the next ``ready`` (the copy of the request the server sends again at that moment gets no
  second answer);
- answers ``resolve`` with ``resolved`` or an ``error`` frame, ``ping`` with ``pong``, and sends
  its own ``ping`` every 15 s; a connection the server has said nothing on for 45 s is closed
  and made again;
- on :meth:`Tunnel.stop` takes no new request, lets the running ones finish and sends their
  results, then closes the connection (code 1000): nothing is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from kyronix import wire
from kyronix.errors import (
    ExecutionRunningError,
    KmlError,
    KyronixError,
    KyronixRefusedError,
    KyronixRunError,
    KyronixUsageError,
    NotUncertainError,
    UnknownExecutionError,
)
from kyronix.executer import frames
from kyronix.executer.frames import (
    Backoff,
    BadFrame,
    KmlRequest,
    OtherFrame,
    Ping,
    Pong,
    Ready,
    Resolve,
    ResultError,
    ServerError,
)
from kyronix.executer.results import EntryDict

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from kyronix.executer.executer import KyronixExecuter, Progress, RulingName

__all__ = [
    "CLOSE_CLAIMED",
    "CLOSE_REFUSED",
    "CLOSE_REPLACED",
    "Tunnel",
    "TunnelEvent",
    "TunnelRefusedError",
    "TunnelReplacedError",
]

log = logging.getLogger("kyronix.executer.daemon")

CLOSE_REFUSED = wire.CLOSE_UNAUTHORIZED
"""The server's close code for a missing, unknown or revoked key (4401)."""
CLOSE_REPLACED = wire.CLOSE_REPLACED
"""The server's close code for a connection another executer of the same id replaced (4000)."""
CLOSE_CLAIMED = wire.CLOSE_CLAIMED
"""The server's close code for an executer id another key's live executer holds (4409)."""

HEARTBEAT_S = wire.HEARTBEAT_S
SILENCE_S = 45.0
READY_TIMEOUT_S = 10.0
REMEMBER = 1000
REMEMBER_S = 600.0
MAX_FRAME = 64 * 1024 * 1024
"""The largest frame the executer accepts (a ``kml_request`` carrying a big file)."""
MAX_PROGRESS_BACKLOG = 1000
"""Progress frames waiting to be sent beyond this are dropped (progress is for display; the
``kml_result`` holds everything)."""


class TunnelRefusedError(KyronixRefusedError):
    """The server refused the executer's key (close code 4401, or HTTP 401/403 on the upgrade).
    ``details`` has ``code`` and ``reason``."""


class TunnelReplacedError(KyronixRunError):
    """Another executer of the same key connected with the same project and executer id and
    the server closed this one (code 4000). Two executers fighting over one id would replace
    each other forever, so this one stops. ``details`` has ``code`` and ``reason``."""


EventKind = Literal[
    "connected", "disconnected", "request", "resolve", "frame", "stopping", "stopped"
]


@dataclass(frozen=True, slots=True)
class TunnelEvent:
    """What the tunnel tells whoever watches it (``on_event``; the CLI prints ``message``)."""

    kind: EventKind
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _Out:
    """A frame waiting to be sent; ``request_id`` marks a ``kml_result`` (never dropped)."""

    frame: dict[str, Any]
    request_id: str | None = None
    droppable: bool = False


class Tunnel:
    """One executer's connection to the server, kept up until :meth:`stop` (see the module)."""

    def __init__(
        self,
        executer: KyronixExecuter,
        ws_url: str,
        *,
        api_key: str,
        executer_id: str,
        base_path: Path,
        heartbeat_s: float = HEARTBEAT_S,
        silence_s: float = SILENCE_S,
        ready_timeout_s: float = READY_TIMEOUT_S,
        backoff: Backoff | None = None,
        remember: int = REMEMBER,
        remember_s: float = REMEMBER_S,
        on_event: Callable[[TunnelEvent], object] | None = None,
    ) -> None:
        self.executer = executer
        self.ws_url = ws_url
        self.url = frames.executer_url(ws_url, executer_id)
        """The URL dialled: ``ws_url`` with ``role=executer&executerId=...``."""
        self.shown_url = frames.shown_url(ws_url)
        self.executer_id = executer_id
        self.base_path = base_path
        self._api_key = api_key
        self.heartbeat_s = heartbeat_s
        self.silence_s = silence_s
        self.ready_timeout_s = ready_timeout_s
        self.backoff = backoff if backoff is not None else Backoff()
        self.remember = remember
        self.remember_s = remember_s
        self.on_event = on_event

        self.ready: Ready | None = None
        """The current connection's ``ready`` frame; None while not connected."""
        self.project_id: str | None = None
        """The project of the last ``ready`` (kept while reconnecting)."""
        self.connections = 0
        """How many connections reached ``ready``."""
        self.error: BaseException | None = None
        """What ended :meth:`run` (a refusal, a replacement), once it has ended."""
        self.started = False
        self.ended = False

        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        self._stopping = False
        self._ws: ClientConnection | None = None
        self._outbox: deque[_Out] = deque()
        self._wake: asyncio.Event = asyncio.Event()
        self._unsent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._flushed: set[str] = set()
        """Results sent right after this connection's ``ready``: the server sends the same
        requests again at that moment, and those copies need no second answer."""
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._recent: OrderedDict[tuple[str, str], tuple[float, dict[str, Any]]] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiters: list[asyncio.Future[None]] = []
        self._cond = threading.Condition()
        self._last_heard = 0.0

    # -- state, for callers ------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the current connection has received ``ready``."""
        return self.ready is not None

    @property
    def running_requests(self) -> list[str]:
        """The ids of the requests being run now."""
        return sorted({rid for rid, _ in self._running})

    async def wait_until_connected(self, timeout: float | None = None) -> None:
        """Wait (on the tunnel's loop) for ``ready``; raise what ended the tunnel if it ended,
        and :class:`TimeoutError` after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while not (self.connected or self.ended):
                await self._changed()
        self._raise_if_ended()

    def wait_connected_sync(self, timeout: float | None = None) -> bool:
        """:meth:`wait_until_connected` from another thread: True once connected, False after
        ``timeout``; raises what ended the tunnel."""
        with self._cond:
            self._cond.wait_for(lambda: self.connected or self.ended, timeout)
        if self.connected:
            return True
        if self.ended:
            self._raise_if_ended()
        return False

    def _raise_if_ended(self) -> None:
        if not self.ended:
            return
        if self.error is not None:
            raise self.error
        raise KyronixUsageError(f"the tunnel to {self.shown_url} was closed")

    # -- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve and reconnect until :meth:`stop`; raise :class:`TunnelRefusedError`
        or :class:`TunnelReplacedError` when the server says retrying cannot help."""
        if self.started:
            raise KyronixUsageError("a tunnel runs once; make a new one to connect again")
        self.started = True
        with self._cond:
            self._loop = asyncio.get_running_loop()
            self._stopping = self._stop_requested
        try:
            while not self._stopping:
                opened = time.monotonic()
                reason, reached = await self._connect_once()
                if self._stopping:
                    break
                if reached:
                    self.backoff.connection_ended(time.monotonic() - opened)
                delay = self.backoff.next_delay()
                verb = "disconnected from" if reached else "cannot connect to"
                self._event(
                    "disconnected",
                    f"{verb} {self.shown_url} ({reason}); reconnecting in {delay:.1f} s",
                    reason=reason,
                    delay_s=delay,
                )
                await self._sleep(delay)
        except Exception as exc:
            self.error = exc
            raise
        finally:
            self._stopping = True
            await self._finish_children()
            self.ended = True
            self.ready = None
            self._notify()
            self._event("stopped", f"stopped serving {self.shown_url}")

    def stop(self) -> None:
        """Stop (call on the tunnel's loop): take no new request, let the running ones finish
        and send their results, close the connection. :meth:`run` returns after that."""
        if self._stopping:
            return
        self._stopping = True
        if self._running:
            ids = ", ".join(self.running_requests)
            self._event(
                "stopping",
                f"stopping: waiting for {len(self.running_requests)} running request(s) "
                f"({ids}) to finish",
                requests=self.running_requests,
            )
        else:
            self._event("stopping", "stopping")
        self._wake.set()
        self._notify()

    def stop_threadsafe(self) -> None:
        """:meth:`stop` from any thread."""
        with self._cond:
            self._stop_requested = True
            loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop just closed: it is stopped already
            loop.call_soon_threadsafe(self.stop)

    async def _sleep(self, delay: float) -> None:
        deadline = time.monotonic() + delay
        while not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed()

    async def _connect_once(self) -> tuple[str, bool]:
        """One connection, from dialling to its end: (why it ended, whether it got ``ready``)."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

        before = self.connections
        try:
            async with connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self._api_key}"},
                open_timeout=self.ready_timeout_s,
                close_timeout=5,
                max_size=MAX_FRAME,
                compression=None,
            ) as ws:
                with contextlib.suppress(ConnectionClosed):
                    await self._session(ws)
                code, why = ws.close_code, ws.close_reason
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise TunnelRefusedError(
                    f"{self.shown_url} refused the executer's key (HTTP {status}); check the "
                    f"key (--api-key or KYRONIX_API_KEY) and that it is not revoked",
                    details={"code": status, "reason": exc.response.reason_phrase},
                ) from None
            if 400 <= status < 500 and status not in (408, 425, 429):
                raise KyronixRunError(
                    f"{self.shown_url} answered HTTP {status} instead of opening the tunnel; "
                    f"is it the /ws URL of `kyronix serve` (ws://HOST:PORT/ws)?",
                    details={"code": status},
                ) from None
            return f"HTTP {status}", False
        except (OSError, TimeoutError, WebSocketException) as exc:
            return _describe(exc), False
        reached = self.connections > before
        if code == CLOSE_REFUSED:
            raise TunnelRefusedError(
                f"{self.shown_url} refused the executer's key (close code 4401: "
                f"{why or 'no reason given'}); check the key (--api-key or KYRONIX_API_KEY) and "
                f"that it is not revoked",
                details={"code": code, "reason": why},
            )
        if code == CLOSE_CLAIMED:  # tried again: the holder may be gone by then (or a squatter)
            return (
                f"the executer id {self.executer_id!r} is held by a live executer of another "
                f"key (close code 4409); this one takes it when that connection is gone: use "
                f"that key, or give this executer its own --executer-id"
            ), False
        if code == CLOSE_REPLACED and not self._stopping:
            raise TunnelReplacedError(
                f"another executer connected to {self.shown_url} as {self.executer_id!r} of "
                f"the same project and replaced this one; give each executer its own "
                f"--executer-id",
                details={"code": code, "reason": why},
            )
        return (f"code {code}{': ' + why if why else ''}" if code else "connection lost"), reached

    async def _session(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._last_heard = time.monotonic()
        ready = asyncio.Event()
        helpers = [
            asyncio.create_task(self._write(ws), name="kyronix-tunnel-writer"),
            asyncio.create_task(self._heartbeat(ws, ready), name="kyronix-tunnel-heartbeat"),
            asyncio.create_task(self._close_when_stopped(ws), name="kyronix-tunnel-closer"),
        ]
        try:
            async for message in ws:
                self._last_heard = time.monotonic()
                frame = frames.parse_frame(message)
                if isinstance(frame, Ready):
                    ready.set()
                self._handle(frame)
        finally:
            self._ws = None
            if self.ready is not None:
                self.ready = None
                self._notify()
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            self._requeue()

    # -- frames in ---------------------------------------------------------------------------

    def _handle(self, frame: frames.Frame) -> None:
        if isinstance(frame, Ready):
            self._on_ready(frame)
        elif isinstance(frame, KmlRequest):
            self._on_request(frame)
        elif isinstance(frame, Resolve):
            self._spawn(self._on_resolve(frame), f"kyronix-resolve-{frame.execution_id}")
        elif isinstance(frame, Ping):
            self._send(frames.pong(frame.ts))
        elif isinstance(frame, Pong):
            pass
        elif isinstance(frame, ServerError):
            self._event(
                "frame",
                f"the server said {frame.code}: {frame.message}",
                code=frame.code,
                executionId=frame.execution_id,
            )
        elif isinstance(frame, OtherFrame):
            self._event("frame", f"ignored a {frame.type} frame (not for an executer)")
        else:
            assert isinstance(frame, BadFrame)
            if frame.request_id is not None:
                self._deliver(
                    frame.request_id,
                    frames.kml_result(
                        frame.request_id,
                        [],
                        {"code": "bad_frame", "message": f"{frame.reason}; nothing was run"},
                    ),
                )
            self._event("frame", f"ignored a frame from the server: {frame.reason}")

    def _on_ready(self, frame: Ready) -> None:
        self.ready = frame
        self.project_id = frame.project_id
        self.connections += 1
        shown_id = frame.executer_id or self.executer_id
        self._event(
            "connected",
            f"connected to {self.shown_url} as executer {shown_id} of project {frame.project_id}",
            projectId=frame.project_id,
            executerId=shown_id,
        )
        # Results that finished while there was no connection go first.
        self._flushed = set()
        while self._unsent:
            rid, result = self._unsent.popitem(last=False)
            self._outbox.append(_Out(result, rid))
            self._flushed.add(rid)
        self._wake.set()
        self._notify()

    def _on_request(self, req: KmlRequest) -> None:
        if self._stopping:
            self._event(
                "request",
                f"{req.request_id}: not taken, the executer is stopping (the server sends it "
                f"again to the next executer that connects)",
            )
            return
        key = (req.request_id, hashlib.sha256(req.kml.encode("utf-8", "replace")).hexdigest())
        if req.request_id in self._flushed:
            self._flushed.discard(req.request_id)
            self._event(
                "request",
                f"{req.request_id}: its result was just sent on this connection",
            )
            return
        unsent = self._unsent.pop(req.request_id, None)
        if unsent is not None:
            self._deliver(req.request_id, unsent)
            return
        if key in self._running:
            self._event(
                "request",
                f"{req.request_id}: already running; the run in progress answers it",
            )
            return
        remembered = self._remembered(key)
        if remembered is not None:
            self._event("request", f"{req.request_id}: finished recently, answered from memory")
            self._deliver(req.request_id, remembered)
            return
        task = self._spawn(self._serve(req, key), f"kyronix-request-{req.request_id}")
        self._running[key] = task

    async def _serve(self, req: KmlRequest, key: tuple[str, str]) -> None:
        rid = req.request_id
        problem: ResultError | None = None
        results: list[EntryDict] = []
        try:
            results = await self.executer.execute(
                req.kml, self.base_path, on_progress=lambda p: self._progress(rid, p)
            )
        except KmlError as exc:
            problem = {"code": "bad_kml", "message": f"not valid KML {exc}; nothing was run"}
        except KyronixError as exc:
            problem = {"code": "executer_error", "message": str(exc)}
        except Exception as exc:  # a bug: say so in the frame rather than leave it unanswered
            log.exception("request %s failed", rid)
            problem = {
                "code": "executer_error",
                "message": f"the executer failed: {type(exc).__name__}: {exc}",
            }
        finally:
            self._running.pop(key, None)
        result = frames.kml_result(rid, results, problem)
        if (problem is None and _settled(results)) or (
            problem is not None and problem["code"] == "bad_kml"
        ):
            self._remember(key, result)
        self._deliver(rid, result)
        ok = sum(1 for r in results if r["result"]["success"])
        what = problem["message"] if problem else f"{len(results)} tool(s), {ok} succeeded"
        self._event("request", f"{rid}: {what}", requestId=rid, error=problem)
        self._notify()

    async def _on_resolve(self, frame: Resolve) -> None:
        eid, how, rid = frame.execution_id, frame.resolution, frame.request_id

        def refuse(code: str, message: str) -> None:
            self._send(frames.error(code, message, execution_id=eid, request_id=rid))
            self._event("resolve", f"resolve {eid} {how}: refused ({code}): {message}")

        if how not in frames.RULINGS:
            refuse("bad_ruling", f"a resolution is rerun, skipped or applied, not {how!r:.40}")
            return
        if frame.base_path is not None and os.path.realpath(frame.base_path) != str(self.base_path):
            refuse(
                "unknown_execution",
                f"this executer runs in {self.base_path}; it keeps no executions for "
                f"{frame.base_path!r:.200}",
            )
            return
        try:
            ruling = cast("RulingName", how)
            await asyncio.to_thread(self.executer.resolve, eid, ruling, self.base_path)
        except UnknownExecutionError as exc:
            refuse("unknown_execution", str(exc))
            return
        except NotUncertainError as exc:
            refuse("not_uncertain", str(exc))
            return
        except ExecutionRunningError as exc:
            refuse("running", str(exc))
            return
        except KyronixUsageError as exc:
            refuse("bad_ruling", str(exc))
            return
        except KyronixError as exc:
            refuse("executer_error", str(exc))
            return
        # A remembered answer that mentions the ruled-on tool is stale now.
        for key, (_, result) in list(self._recent.items()):
            if any(r["result"].get("executionId") == eid for r in result["results"]):
                del self._recent[key]
        self._send(frames.resolved(eid, how, rid))
        self._event("resolve", f"resolve {eid} {how}: done")

    # -- frames out --------------------------------------------------------------------------

    def _send(self, frame: dict[str, Any], *, droppable: bool = False) -> None:
        """Queue a frame for the current connection (dropped when there is none)."""
        if self._ws is None:
            return
        if droppable and len(self._outbox) >= MAX_PROGRESS_BACKLOG:
            return
        self._outbox.append(_Out(frame, droppable=droppable))
        self._wake.set()

    def _deliver(self, request_id: str, result: dict[str, Any]) -> None:
        """Send a ``kml_result`` now, or after the next ``ready`` when not connected."""
        if self._ws is None or self.ready is None:
            self._unsent[request_id] = result
            return
        self._outbox.append(_Out(result, request_id))
        self._wake.set()

    def _progress(self, request_id: str, progress: Progress) -> None:
        self._send(
            frames.kml_progress(
                request_id,
                progress.event,
                progress.tool,
                progress.execution_id,
                success=progress.success,
                chunk=progress.chunk,
            ),
            droppable=True,
        )

    async def _write(self, ws: ClientConnection) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._outbox:
                item = self._outbox.popleft()
                try:
                    await ws.send(frames.encode(item.frame))
                except BaseException:
                    self._outbox.appendleft(item)
                    raise
            self._notify()

    def _requeue(self) -> None:
        """The connection ended: its unsent results wait for the next one; the rest goes."""
        while self._outbox:
            item = self._outbox.popleft()
            if item.request_id is not None:
                self._unsent[item.request_id] = item.frame

    async def _heartbeat(self, ws: ClientConnection, ready: asyncio.Event) -> None:
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                await ready.wait()
        except TimeoutError:
            self._event("frame", f"no ready frame within {self.ready_timeout_s:g} s")
            await ws.close(1002, "no ready frame")
            return
        while True:
            await asyncio.sleep(self.heartbeat_s)
            if time.monotonic() - self._last_heard > self.silence_s:
                await ws.close(1001, f"nothing heard for {self.silence_s:g} s")
                return
            self._send(frames.ping())

    async def _close_when_stopped(self, ws: ClientConnection) -> None:
        while not (self._stopping and not self._running and not self._outbox):
            await self._changed()
        await ws.close(1000, "executer stopping")

    # -- memory of recent requests -----------------------------------------------------------

    def _remembered(self, key: tuple[str, str]) -> dict[str, Any] | None:
        self._forget_old()
        found = self._recent.get(key)
        return found[1] if found is not None else None

    def _remember(self, key: tuple[str, str], result: dict[str, Any]) -> None:
        self._recent[key] = (time.monotonic(), result)
        self._recent.move_to_end(key)
        self._forget_old()

    def _forget_old(self) -> None:
        horizon = time.monotonic() - self.remember_s
        while self._recent and (
            len(self._recent) > self.remember or next(iter(self._recent.values()))[0] < horizon
        ):
            self._recent.popitem(last=False)

    # -- plumbing ----------------------------------------------------------------------------

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _finish_children(self) -> None:
        """Wait for the running requests (and rulings) to end; cancel them only if this task
        itself is being cancelled."""
        try:
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
        except asyncio.CancelledError:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
            raise

    async def _changed(self) -> None:
        """Until the next :meth:`_notify` (any change of state)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        with self._cond:
            self._cond.notify_all()

    def _event(self, kind: EventKind, message: str, **details: Any) -> None:
        log.info("%s", message)
        if self.on_event is not None:
            try:
                self.on_event(TunnelEvent(kind, message, details))
            except Exception:
                log.exception("the tunnel's on_event callback failed")


def _settled(results: list[EntryDict]) -> bool:
    """Whether an answer can be given again from memory: none of its tools is in a state that
    may change (uncertain until a ruling, running until it ends, busy until the lock frees)."""
    return not any(
        r["result"].get("uncertain")
        or r["result"].get("running")
        or r["result"].get("errorType") == "Busy"
        for r in results
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
