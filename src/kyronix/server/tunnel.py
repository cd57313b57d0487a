"""The WebSocket tunnel (``/ws``): runtime clients' KML relayed to their project's executer.

The protocol is docs/tunnel.md. This module owns two things:

* :class:`Relay`, the in-memory state of one server process: the executers connected (by
  project and executer id), the requests **pending** (sent on, no result yet), the results kept
  for a while (a runtime client that reconnects and sends the same request again gets them at
  once), and the ``resolve`` frames in flight. Pending requests outlive connections: when an
  executer's connection drops its requests wait for it, and an executer of the same project and
  id that connects again is sent them again, with the same ids (its receipts make that harmless).
  :meth:`Relay.execute` is the same path for the server's own agent loop.
* :func:`websocket_endpoint`, the route: authentication (a Bearer header or a first ``auth``
  frame; failure closes with 4401), then one reader per connection that validates each frame
  (a bad one gets an ``error`` frame and the connection lives on) and hands it to the relay.

Frames for another project never cross: every lookup is keyed by the connection's project.

With several replicas on PostgreSQL (a :class:`~kyronix.server.cluster.Cluster`), a request
whose executer is connected to another replica is sent on through the mailbox: this replica (the
**origin**) keeps it pending, records its results and answers its client; the executer's replica
only relays its frames back. Requests whose executer moved are sent again where it is now
(:meth:`Relay.reroute`). docs/deploy.md says it for operators; ADR 0021 says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from kyronix.errors import KyronixRunError, KyronixUsageError
from kyronix.server import accounts

if TYPE_CHECKING:
    from kyronix.server.app import AppState
    from kyronix.server.cluster import Cluster, Where

__all__ = ["Peer", "Relay", "TunnelFailure", "websocket_endpoint"]

log = logging.getLogger("kyronix.server")

Role = Literal["executer", "runtime"]
FRAME_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
EXECUTER_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
DEFAULT_EXECUTER = "default"
AUTH_WAIT_S = 10.0
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 3600.0
KEEP_RESULTS_S = 600.0
KEEP_RESULTS = 1000
SILENT_S = 45.0
"""An executer heard nothing from for this long is dropped (it pings every 15 s)."""
RESOLUTIONS = ("rerun", "skipped", "applied")
CLOSE_UNAUTHORIZED = 4401
CLOSE_REPLACED = 4000


class TunnelFailure(KyronixRunError):
    """A request could not be answered: ``code`` is the error frame's code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, details={"code": code})
        self.code = code


class BadFrame(KyronixUsageError):
    """A frame that is not what docs/tunnel.md says (answered with a ``bad_frame`` error)."""


# --------------------------------------------------------------------------- connections


@dataclass(eq=False)
class Peer:
    """One authenticated connection."""

    ws: WebSocket
    role: Role
    project_id: str
    executer_id: str | None = None
    seen: float = field(default_factory=time.monotonic)
    closed: bool = False
    _send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, frame: dict[str, Any]) -> bool:
        """Send a frame; False if the connection is gone (never raises for that)."""
        if self.closed:
            return False
        try:
            async with self._send_lock:
                await self.ws.send_text(json.dumps(frame))
            return True
        except Exception:  # the connection went away under us
            self.closed = True
            return False

    async def close(self, code: int, reason: str) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            if self.ws.application_state is not WebSocketState.DISCONNECTED:
                await self.ws.close(code=code, reason=reason)


# --------------------------------------------------------------------------- the relay


Waiter = Callable[[dict[str, Any]], Awaitable[None]]
"""Gets the frames of one request: ``kml_progress``, then its ``kml_result`` or ``error``."""


@dataclass(eq=False)
class _Pending:
    project_id: str
    request_id: str
    executer_id: str
    frame: dict[str, Any]  # what the executer is sent
    deadline: float
    session_id: str | None = None
    waiters: list[Waiter] = field(default_factory=list)
    lost: bool = False
    """The executer's connection dropped while this was pending."""
    timer: asyncio.TimerHandle | None = None
    remote: str | None = None
    """The replica this was sent on to (its executer is connected there), or None: here."""
    origin: str | None = None
    """On the executer's replica, for a request sent on by another: that replica (it records
    the results and answers its runtime client; this one only relays)."""


ResultsHook = Callable[[str, str | None, dict[str, Any]], Awaitable[None]]
"""``hook(project_id, session_id, kml_result frame)``: record the results, before the runtime
client gets them (keep it short: it is on the round trip)."""


class _Sink(Protocol):
    async def send(self, frame: dict[str, Any]) -> bool: ...


@dataclass(eq=False)
class _Replica:
    """A runtime client on another replica, waiting for a ``resolved`` frame from here."""

    cluster: Cluster
    target: str
    project_id: str

    async def send(self, frame: dict[str, Any]) -> bool:
        body = {"project": self.project_id, "frame": frame}
        await self.cluster.send(self.target, "resolved", body)
        return True


class Relay:
    def __init__(
        self, on_results: ResultsHook | None = None, cluster: Cluster | None = None
    ) -> None:
        self.executers: dict[tuple[str, str], Peer] = {}
        self.pending: dict[tuple[str, str], _Pending] = {}
        self.results: OrderedDict[tuple[str, str], tuple[float, dict[str, Any]]] = OrderedDict()
        self.resolves: dict[tuple[str, str], _Sink] = {}
        self.on_results = on_results
        self.cluster = cluster
        """Several replicas on one database: executers on others are reached through it."""
        self._arrived: dict[str, asyncio.Event] = {}  # project -> set when an executer connects
        self._tasks: set[asyncio.Task[Any]] = set()
        self._presence: dict[tuple[str, str], asyncio.Lock] = {}
        if cluster is not None:
            cluster.handlers.update(
                request=self._remote_request,
                frame=self._remote_frame,
                resolve=self._remote_resolve,
                resolved=self._remote_resolved,
            )

    # -- executers -------------------------------------------------------------------------

    async def attach_executer(self, peer: Peer) -> None:
        assert peer.executer_id is not None
        key = (peer.project_id, peer.executer_id)
        old = self.executers.get(key)
        self.executers[key] = peer
        if old is not None and old is not peer:
            await old.close(CLOSE_REPLACED, "replaced by a new connection of this executer")
        if self.cluster is not None:  # before anything is sent: the others route here now
            async with self._presence_lock(key):
                await asyncio.to_thread(self.cluster.announce, *key)
        arrived = self._arrived.pop(peer.project_id, None)
        if arrived is not None:
            arrived.set()
        for pending in list(self.pending.values()):  # what waited for it goes out again
            if (pending.project_id, pending.executer_id) == key:
                pending.lost = False
                pending.remote = None  # it is here now, whichever replica it was sent to
                await peer.send(pending.frame)

    def detach(self, peer: Peer) -> None:
        if peer.role == "executer" and peer.executer_id is not None:
            key = (peer.project_id, peer.executer_id)
            if self.executers.get(key) is peer:
                del self.executers[key]
                for pending in self.pending.values():
                    if (pending.project_id, pending.executer_id) == key and not pending.remote:
                        pending.lost = True
                if self.cluster is not None:
                    self._spawn(self._withdraw(key))
        for rkey, waiting in list(self.resolves.items()):
            if waiting is peer:
                del self.resolves[rkey]

    def _presence_lock(self, key: tuple[str, str]) -> asyncio.Lock:
        lock = self._presence.get(key)
        if lock is None:
            lock = self._presence[key] = asyncio.Lock()
        return lock

    async def _withdraw(self, key: tuple[str, str]) -> None:
        """Remove the executer's presence, unless it connected here again meanwhile (presence
        writes of one executer take turns: a late withdraw never undoes a new connection's)."""
        assert self.cluster is not None
        async with self._presence_lock(key):
            if key in self.executers:
                return
            await asyncio.to_thread(self.cluster.withdraw, *key)

    def _choose(self, project_id: str, executer_id: str | None) -> Peer | None:
        if executer_id is not None:
            return self.executers.get((project_id, executer_id))
        mine = [p for (proj, _), p in self.executers.items() if proj == project_id]
        if not mine:
            return None
        for peer in mine:
            if peer.executer_id == DEFAULT_EXECUTER:
                return peer
        return mine[-1]  # the most recently connected

    async def _route(self, project_id: str, executer_id: str | None) -> Peer | Where | None:
        """The executer to send to: connected here, else on another replica, else None."""
        peer = self._choose(project_id, executer_id)
        if peer is not None or self.cluster is None:
            return peer
        return await asyncio.to_thread(self.cluster.locate, project_id, executer_id)

    async def wait_for_executer(
        self, project_id: str, executer_id: str | None, until: float
    ) -> Peer | Where:
        while True:
            route = await self._route(project_id, executer_id)
            if route is not None:
                return route
            left = until - time.monotonic()
            if left <= 0:
                raise TunnelFailure("no_executer", _no_executer_message(project_id, executer_id))
            event = self._arrived.setdefault(project_id, asyncio.Event())
            if self.cluster is not None:  # one on another replica wakes nobody here: look again
                left = min(left, 0.5)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), left)

    def connected(self, project_id: str) -> int:
        """How many executers of the project are connected to this replica."""
        return sum(1 for proj, _ in self.executers if proj == project_id)

    async def reachable(self, project_id: str) -> int:
        """How many executers of the project this replica can reach (here or on another)."""
        if self.cluster is None:
            return self.connected(project_id)
        return max(
            self.connected(project_id),
            await asyncio.to_thread(self.cluster.count, project_id),
        )

    def silent(self, now: float) -> list[Peer]:
        return [p for p in self.executers.values() if now - p.seen > SILENT_S]

    # -- requests --------------------------------------------------------------------------

    async def request(
        self,
        project_id: str,
        request_id: str,
        kml: str,
        waiter: Waiter,
        *,
        executer_id: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        session_id: str | None = None,
        wait_for_executer: bool = False,
        origin: str | None = None,
    ) -> None:
        """Send a request on (or join the same one in flight, or answer it from the results
        kept); ``waiter`` gets its frames. Raises :class:`TunnelFailure` (``no_executer``).
        ``origin``: the replica that sent it on to this one (see :class:`_Pending`)."""
        key = (project_id, request_id)
        kept = self.results.get(key)
        if kept is not None:
            await waiter(kept[1])
            return
        pending = self.pending.get(key)
        if pending is not None:
            pending.waiters.append(waiter)
            return
        deadline = time.monotonic() + timeout
        route: Peer | Where | None
        if origin is not None:  # sent on by another replica: only an executer connected here
            route = self._choose(project_id, executer_id)
        elif wait_for_executer:
            route = await self.wait_for_executer(project_id, executer_id, deadline)
        else:
            route = await self._route(project_id, executer_id)
        if route is None and origin is None:
            raise TunnelFailure("no_executer", _no_executer_message(project_id, executer_id))
        if key in self.pending:  # it arrived while we waited for an executer
            self.pending[key].waiters.append(waiter)
            return
        frame = {"type": "kml_request", "executionId": request_id, "kmlResponse": kml}
        if isinstance(route, Peer):
            assert route.executer_id is not None
            target_executer = route.executer_id
        elif route is not None:
            target_executer = route[1]
        else:  # sent on to us, but the executer is not (or no longer) here
            target_executer = executer_id or DEFAULT_EXECUTER
        pending = _Pending(
            project_id, request_id, target_executer, frame, deadline, session_id, [waiter],
            origin=origin,
        )  # fmt: skip
        self.pending[key] = pending
        pending.timer = asyncio.get_running_loop().call_at(
            asyncio.get_running_loop().time() + max(0.0, deadline - time.monotonic()),
            self._expire,
            key,
        )
        if isinstance(route, Peer):
            if not await route.send(frame):
                pending.lost = True  # it goes out again when the executer is back
        elif route is not None:
            await self._send_on(pending, route[0])
        else:
            pending.lost = True
            assert origin is not None and self.cluster is not None
            await self.cluster.send(
                origin, "frame", {"project": project_id, "requestId": request_id,
                                  "via": self.cluster.id, "moved": True},
            )  # fmt: skip

    async def _send_on(self, pending: _Pending, replica: str) -> None:
        """Send a request on to the replica its executer is connected to."""
        assert self.cluster is not None
        pending.remote, pending.lost = replica, False
        left = max(0.001, pending.deadline - time.monotonic())
        body = {
            "project": pending.project_id, "requestId": pending.request_id,
            "kml": pending.frame["kmlResponse"], "executerId": pending.executer_id,
            "timeout": left, "origin": self.cluster.id,
        }  # fmt: skip
        await self.cluster.send(replica, "request", body)

    def _expire(self, key: tuple[str, str]) -> None:
        pending = self.pending.pop(key, None)
        if pending is None:
            return
        if pending.lost:
            code, message = (
                "executer_disconnected",
                f"the executer {pending.executer_id!r} disconnected and did not come back before "
                f"the request's timeout; send the same request again once it is connected (its "
                f"receipts keep anything that already ran from running twice)",
            )
        else:
            code, message = (
                "timeout",
                f"the executer {pending.executer_id!r} did not answer in time; the request may "
                f"still be running there: send the same request again to get its results",
            )
        frame = {"type": "error", "code": code, "message": message, "executionId": key[1]}
        self._spawn(_deliver(pending.waiters, frame))

    async def result(self, peer: Peer, frame: dict[str, Any]) -> None:
        out = {
            "type": "kml_result",
            "executionId": frame["executionId"],
            "results": frame["results"],
        }
        if "error" in frame:
            out["error"] = frame["error"]
        await self._finish(peer.project_id, out)

    async def _finish(self, project_id: str, out: dict[str, Any]) -> None:
        """A request's ``kml_result``: kept, recorded, delivered to whoever waits for it."""
        key = (project_id, out["executionId"])
        pending = self.pending.pop(key, None)
        repeat = pending is None and key in self.results  # delivered twice: recorded once
        self.results[key] = (time.monotonic(), out)
        self._trim()
        if pending is not None and pending.timer is not None:
            pending.timer.cancel()
        relaying = pending is not None and pending.origin is not None  # the origin records it
        if self.on_results is not None and not repeat and not relaying:
            try:  # recorded first: a runtime that reads the session after its result came back
                session_id = pending.session_id if pending is not None else None  # finds it
                await self.on_results(project_id, session_id, out)
            except Exception:
                log.exception("recording the results of request %s failed", out["executionId"])
        if pending is not None:
            await _deliver(pending.waiters, out)

    async def progress(self, peer: Peer, frame: dict[str, Any]) -> None:
        pending = self.pending.get((peer.project_id, frame["executionId"]))
        if pending is not None:
            await _deliver(pending.waiters, frame)

    def forget_waiter(self, waiter: Waiter) -> None:
        for pending in self.pending.values():
            if waiter in pending.waiters:
                pending.waiters.remove(waiter)

    def _trim(self) -> None:
        now = time.monotonic()
        while self.results and (
            len(self.results) > KEEP_RESULTS
            or now - next(iter(self.results.values()))[0] > KEEP_RESULTS_S
        ):
            self.results.popitem(last=False)

    async def execute(
        self,
        project_id: str,
        request_id: str,
        kml: str,
        *,
        executer_id: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        session_id: str | None = None,
    ) -> dict[str, Any]:
        """The server's own use: send a request and wait for its ``kml_result`` frame (waiting
        for an executer to connect, up to ``timeout``). Raises :class:`TunnelFailure`."""
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        async def waiter(frame: dict[str, Any]) -> None:
            if frame["type"] in ("kml_result", "error") and not done.done():
                done.set_result(frame)

        await self.request(
            project_id, request_id, kml, waiter, executer_id=executer_id, timeout=timeout,
            session_id=session_id, wait_for_executer=True,
        )  # fmt: skip
        try:
            frame = await done
        finally:
            self.forget_waiter(waiter)
        if frame["type"] == "error":
            raise TunnelFailure(frame["code"], frame["message"])
        return frame

    # -- resolve ---------------------------------------------------------------------------

    async def resolve(
        self, peer: _Sink | Peer, frame: dict[str, Any], project_id: str = ""
    ) -> None:
        project_id = peer.project_id if isinstance(peer, Peer) else project_id
        route = await self._route(project_id, frame.get("executerId"))
        if isinstance(peer, _Replica):  # sent on to us: only an executer connected here
            route = route if isinstance(route, Peer) else None
        request_id = frame.get("requestId") or f"res_{secrets.token_hex(8)}"
        if route is None:
            await peer.send(
                _error(
                    "no_executer",
                    _no_executer_message(project_id, frame.get("executerId")),
                    executionId=frame["executionId"],
                    requestId=request_id,
                )
            )
            return
        self.resolves[(project_id, request_id)] = peer
        if not isinstance(route, Peer):
            assert self.cluster is not None
            body = {"project": project_id, "frame": {**frame, "requestId": request_id,
                                                     "executerId": route[1]},
                    "origin": self.cluster.id}  # fmt: skip
            await self.cluster.send(route[0], "resolve", body)
            return
        out = {
            "type": "resolve",
            "executionId": frame["executionId"],
            "resolution": frame["resolution"],
            "requestId": request_id,
        }
        if isinstance(frame.get("basePath"), str):
            out["basePath"] = frame["basePath"]
        await route.send(out)

    async def resolved(self, peer: Peer, frame: dict[str, Any]) -> None:
        request_id = frame.get("requestId")
        if not isinstance(request_id, str):
            return
        waiting = self.resolves.pop((peer.project_id, request_id), None)
        if waiting is not None:
            await waiting.send(frame)

    # -- across replicas (docs/deploy.md) ---------------------------------------------------

    async def _remote_request(self, body: dict[str, Any]) -> None:
        """Another replica sends on a request for an executer connected here."""
        assert self.cluster is not None
        cluster, origin = self.cluster, str(body["origin"])
        project_id, request_id = str(body["project"]), str(body["requestId"])

        async def waiter(frame: dict[str, Any]) -> None:
            out = {"project": project_id, "requestId": request_id, "via": cluster.id}
            await cluster.send(origin, "frame", {**out, "frame": frame})

        key = (project_id, request_id)
        known = self.pending.get(key)
        if known is not None and known.origin == origin and known.waiters:
            return  # a repeat of a request already relayed (its frames already go back)
        await self.request(
            project_id, request_id, str(body["kml"]), waiter,
            executer_id=body.get("executerId"), timeout=float(body["timeout"]), origin=origin,
        )  # fmt: skip

    async def _remote_frame(self, body: dict[str, Any]) -> None:
        """A frame of a request this replica sent on, from the executer's replica."""
        project_id, request_id = str(body["project"]), str(body["requestId"])
        key = (project_id, request_id)
        pending = self.pending.get(key)
        if body.get("moved"):  # the executer was no longer there: route again at the next tick
            assert self.cluster is not None
            self.cluster.forget_route(project_id)
            if pending is not None and pending.remote == body.get("via"):
                pending.lost = True
            return
        frame = body["frame"]
        kind = frame.get("type")
        if kind == "kml_result":
            await self._finish(project_id, frame)
        elif pending is None or pending.remote != body.get("via"):
            return  # progress or an error from a route this request no longer takes
        elif kind == "kml_progress":
            await _deliver(pending.waiters, frame)
        elif kind == "error":
            if frame.get("code") == "executer_disconnected":
                pending.lost = True  # it may be on another replica now: route again
                return
            self.pending.pop(key, None)
            if pending.timer is not None:
                pending.timer.cancel()
            await _deliver(pending.waiters, frame)

    async def _remote_resolve(self, body: dict[str, Any]) -> None:
        assert self.cluster is not None
        project_id = str(body["project"])
        sink = _Replica(self.cluster, str(body["origin"]), project_id)
        await self.resolve(sink, body["frame"], project_id)

    async def _remote_resolved(self, body: dict[str, Any]) -> None:
        frame = body["frame"]
        request_id = frame.get("requestId")
        if not isinstance(request_id, str):
            return
        waiting = self.resolves.pop((str(body["project"]), request_id), None)
        if waiting is not None:
            await waiting.send(frame)

    async def reroute(self) -> int:
        """Send again the requests whose executer is no longer where they were sent (it went
        to another replica, or theirs died); the executer's receipts make a repeat harmless.
        Returns how many were sent again."""
        if self.cluster is None:
            return 0
        stray = [p for p in self.pending.values() if p.origin is None and (p.remote or p.lost)]
        if not stray:
            return 0
        routes = await asyncio.to_thread(self.cluster.routes, {p.project_id for p in stray})
        sent = 0
        for pending in stray:
            if (pending.project_id, pending.executer_id) in self.executers:
                continue  # it came back here: attach_executer sent it
            where = [w for w in routes.get(pending.project_id, []) if w[1] == pending.executer_id]
            if not where:
                pending.lost = True
                continue
            replica = where[-1][0]
            if replica == pending.remote and not pending.lost:
                continue
            await self._send_on(pending, replica)
            sent += 1
        return sent

    def heard(self) -> dict[tuple[str, str], int]:
        """When each executer connected here was last heard from (unix ms)."""
        offset = time.time() - time.monotonic()
        return {key: int((peer.seen + offset) * 1000) for key, peer in self.executers.items()}

    # -- housekeeping ----------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for pending in self.pending.values():
            if pending.timer is not None:
                pending.timer.cancel()
        self.pending.clear()
        for peer in list(self.executers.values()):
            await peer.close(1001, "the server is shutting down")
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _deliver(waiters: list[Waiter], frame: dict[str, Any]) -> None:
    for waiter in list(waiters):
        with contextlib.suppress(Exception):
            await waiter(frame)


def _error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, **extra}


def _no_executer_message(project_id: str, executer_id: str | None) -> str:
    which = f"executer {executer_id!r}" if executer_id else "executer"
    return (
        f"no {which} of project {project_id} is connected; start one with `kyronix executer "
        f"--ws URL --base DIR` (or KyronixExecuter(ws_url=...)) using a key of this project"
    )


# --------------------------------------------------------------------------- frames


def _field(frame: dict[str, Any], name: str, pattern: re.Pattern[str] | None = None) -> str:
    value = frame.get(name)
    if not isinstance(value, str) or (pattern is not None and not pattern.fullmatch(value)):
        want = f"a string matching {pattern.pattern}" if pattern is not None else "a string"
        raise BadFrame(f"{frame.get('type')}: {name!r} must be {want}")
    return value


def _optional(frame: dict[str, Any], name: str, pattern: re.Pattern[str]) -> str | None:
    if frame.get(name) is None:
        return None
    return _field(frame, name, pattern)


def parse_frame(text: str | bytes | None) -> dict[str, Any]:
    if text is None:
        raise BadFrame("send JSON text frames")
    try:
        frame = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadFrame(f"not JSON ({exc})") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise BadFrame('a frame is a JSON object with a "type"')
    return frame


ALLOWED: dict[Role, frozenset[str]] = {
    "runtime": frozenset({"kml_request", "resolve", "ping", "pong"}),
    "executer": frozenset({"kml_result", "kml_progress", "resolved", "error", "ping", "pong"}),
}
KNOWN = frozenset().union(*ALLOWED.values()) | {"auth"}


# --------------------------------------------------------------------------- the route


async def _authenticate(ws: WebSocket, state: AppState) -> Peer | None:
    """The connection's peer, or None after closing it with 4401."""
    header = ws.headers.get("authorization")
    query = ws.query_params
    role: Any = query.get("role", "runtime")
    executer_id: Any = query.get("executerId")
    key = ""
    if header:
        m = re.fullmatch(r"Bearer\s+(\S+)\s*", header, re.IGNORECASE)
        key = m.group(1) if m else ""
    else:
        try:
            first = await asyncio.wait_for(ws.receive_text(), AUTH_WAIT_S)
            frame = parse_frame(first)
        except (TimeoutError, BadFrame, WebSocketDisconnect, KeyError, RuntimeError):
            await _refuse(ws, "authenticate first: a Bearer header or an auth frame")
            return None
        if frame.get("type") != "auth":
            await _refuse(
                ws, 'the first frame must be {"type": "auth", "apiKey": ..., "role": ...}'
            )
            return None
        api_key = frame.get("apiKey")
        key = api_key if isinstance(api_key, str) else ""
        role = frame.get("role", "runtime")
        executer_id = frame.get("executerId")
    if role not in ("executer", "runtime"):
        await _refuse(ws, "role must be executer or runtime")
        return None
    if executer_id is not None and (
        not isinstance(executer_id, str) or not EXECUTER_ID.fullmatch(executer_id)
    ):
        await _refuse(ws, f"executerId must match {EXECUTER_ID.pattern}")
        return None
    if not accounts.KEY_PATTERN.fullmatch(key):
        await _refuse(ws, "not a Kyronix API key (kyr_...)")
        return None
    info = await asyncio.to_thread(
        state.db.read, lambda c: accounts.lookup_key(c, state.secret, key)
    )
    if info is None:
        await _refuse(ws, "this API key is unknown or has been revoked")
        return None
    if role == "executer" and executer_id is None:
        executer_id = DEFAULT_EXECUTER
    return Peer(ws, role, info.project_id, executer_id if role == "executer" else None)


async def _refuse(ws: WebSocket, reason: str) -> None:
    with contextlib.suppress(Exception):
        await ws.close(code=CLOSE_UNAUTHORIZED, reason=reason[:120])


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
    ready: dict[str, Any] = {"type": "ready", "role": peer.role, "projectId": peer.project_id}
    if peer.executer_id is not None:
        ready["executerId"] = peer.executer_id
    await peer.send(ready)
    if peer.role == "executer":
        await relay.attach_executer(peer)
        log.info("executer %s of project %s connected", peer.executer_id, peer.project_id)
    waiters: dict[str, Waiter] = {}
    try:
        while True:
            try:
                text = await ws.receive_text()
            except (WebSocketDisconnect, RuntimeError):
                break
            except KeyError:  # a binary frame
                await peer.send(_error("bad_frame", "send JSON text frames, not binary"))
                continue
            peer.seen = time.monotonic()
            try:
                frame = parse_frame(text)
                await _dispatch(relay, peer, frame, waiters)
            except BadFrame as exc:
                await peer.send(_error("bad_frame", str(exc)))
    finally:
        peer.closed = True
        for waiter in waiters.values():
            relay.forget_waiter(waiter)
        relay.detach(peer)
        if peer.role == "executer":
            log.info("executer %s of project %s disconnected", peer.executer_id, peer.project_id)


async def _dispatch(
    relay: Relay, peer: Peer, frame: dict[str, Any], waiters: dict[str, Waiter]
) -> None:
    kind = frame["type"]
    if kind not in KNOWN:
        raise BadFrame(f"unknown frame type {kind!r}")
    if kind not in ALLOWED[peer.role]:
        await peer.send(
            _error(
                "forbidden",
                f"a{'n' if peer.role == 'executer' else ''} {peer.role} may not send {kind!r} "
                f"frames",
                **(
                    {"executionId": frame["executionId"]}
                    if isinstance(frame.get("executionId"), str)
                    else {}
                ),
            )
        )
        return
    if kind == "ping":
        await peer.send({"type": "pong", **({"ts": frame["ts"]} if "ts" in frame else {})})
    elif kind == "pong":
        return
    elif kind == "kml_request":
        await _kml_request(relay, peer, frame, waiters)
    elif kind == "kml_result":
        _field(frame, "executionId", FRAME_ID)
        if not isinstance(frame.get("results"), list):
            raise BadFrame("kml_result: 'results' must be a list")
        await relay.result(peer, frame)
    elif kind == "kml_progress":
        _field(frame, "executionId", FRAME_ID)
        await relay.progress(peer, frame)
    elif kind == "resolve":
        _field(frame, "executionId", FRAME_ID)
        if frame.get("resolution") not in RESOLUTIONS:
            raise BadFrame("resolve: 'resolution' must be rerun, skipped or applied")
        _optional(frame, "executerId", EXECUTER_ID)
        _optional(frame, "requestId", FRAME_ID)
        await relay.resolve(peer, frame)
    elif kind in ("resolved", "error"):  # an executer's answer to a resolve
        await relay.resolved(peer, frame)


async def _kml_request(
    relay: Relay, peer: Peer, frame: dict[str, Any], waiters: dict[str, Waiter]
) -> None:
    request_id = _field(frame, "executionId", FRAME_ID)
    kml = _field(frame, "kmlResponse")
    executer_id = _optional(frame, "executerId", EXECUTER_ID)
    session_id = frame.get("sessionId") if isinstance(frame.get("sessionId"), str) else None
    timeout = frame.get("timeout", DEFAULT_TIMEOUT_S)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT_S
    ):
        raise BadFrame(
            f"kml_request: 'timeout' must be seconds, more than 0 and at most {MAX_TIMEOUT_S:g}"
        )

    async def waiter(out: dict[str, Any]) -> None:
        await peer.send(out)

    old = waiters.pop(request_id, None)
    if old is not None:
        relay.forget_waiter(old)
    waiters[request_id] = waiter
    try:
        await relay.request(
            peer.project_id, request_id, kml, waiter, executer_id=executer_id,
            timeout=float(timeout), session_id=session_id,
        )  # fmt: skip
    except TunnelFailure as exc:
        waiters.pop(request_id, None)
        await peer.send(_error(exc.code, exc.message, executionId=request_id))


async def heartbeat_forever(relay: Relay, every: float = 15.0) -> None:
    """Drop executers that went silent (their pending requests wait for them to return)."""
    while True:
        await asyncio.sleep(every)
        for peer in relay.silent(time.monotonic()):
            log.info(
                "executer %s of project %s went silent; dropped", peer.executer_id, peer.project_id
            )
            relay.detach(peer)
            await peer.close(4408, "no heartbeat for 45 s")
