"""The relay: runtime clients' KML sent on to their project's executer, and its answers back.

One :class:`Relay` per server process holds the executers connected to it (by project and
executer id), the requests pending and the answers kept (:mod:`.pending`), and the ``resolve``
frames in flight. :meth:`Relay.execute` is the same path for the server's own agent loop. With
several replicas, executers on other replicas are reached through :mod:`.remote`.

It knows connections only as :class:`~.peer.Peer` s and frames only as :mod:`kyronix.wire`
values: the ``/ws`` route (:mod:`kyronix.server.ws`) authenticates and parses, the relay
decides. Frames for another project never cross: every look-up is keyed by the project.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kyronix import wire
from kyronix.server.relay.peer import Peer
from kyronix.server.relay.pending import (
    Answer,
    Pending,
    Requests,
    TunnelFailure,
    Waiter,
    deliver,
)
from kyronix.server.relay.remote import Remote, ReplicaSink

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster, Where

__all__ = ["SILENT_S", "Relay", "ResultsHook"]

log = logging.getLogger("kyronix.server")

SILENT_S = 45.0
"""An executer heard nothing from for this long is dropped (it pings every 15 s)."""
HEARTBEAT_S = 15.0

ResultsHook = Callable[[str, str, Sequence[wire.EntryDict]], Awaitable[None]]
"""``hook(project_id, request_id, results)``: record a runtime client's results (before the
client gets them; keep it short: it is on the round trip)."""


class _Sink(Protocol):
    async def send(self, frame: dict[str, Any]) -> bool: ...


class Relay:
    def __init__(
        self, on_results: ResultsHook | None = None, cluster: Cluster | None = None
    ) -> None:
        self.executers: dict[tuple[str, str], Peer] = {}
        self.requests = Requests()
        self.resolves: dict[tuple[str, str], _Sink] = {}
        self.on_results = on_results
        self.remote = Remote(cluster, self.requests, self) if cluster is not None else None
        self._arrived: dict[str, asyncio.Event] = {}  # project -> set when an executer connects
        self._tasks: set[asyncio.Task[Any]] = set()
        self._presence: dict[tuple[str, str], asyncio.Lock] = {}
        self._cluster = cluster

    # -- executers -------------------------------------------------------------------------

    async def attach_executer(self, peer: Peer) -> None:
        assert peer.executer_id is not None
        key = (peer.project_id, peer.executer_id)
        old = self.executers.get(key)
        self.executers[key] = peer
        if old is not None and old is not peer:
            await old.close(wire.CLOSE_REPLACED, "replaced by a new connection of this executer")
        if self._cluster is not None:  # before anything is sent: the others route here now
            async with self._presence_lock(key):
                await asyncio.to_thread(self._cluster.announce, *key)
        arrived = self._arrived.pop(peer.project_id, None)
        if arrived is not None:
            arrived.set()
        for pending in list(self.requests.pending.values()):  # what waited for it goes out again
            if (pending.project_id, pending.executer_id) == key:
                pending.lost = False
                pending.remote = None  # it is here now, whichever replica it was sent to
                await peer.send(pending.frame())

    def detach(self, peer: Peer) -> None:
        if peer.role == "executer" and peer.executer_id is not None:
            key = (peer.project_id, peer.executer_id)
            if self.executers.get(key) is peer:
                del self.executers[key]
                for pending in self.requests.pending.values():
                    if (pending.project_id, pending.executer_id) == key and not pending.remote:
                        pending.lost = True
                if self._cluster is not None:
                    self._spawn(self._withdraw(key))
        for rkey, waiting in list(self.resolves.items()):
            if waiting is peer:
                del self.resolves[rkey]

    def here(self, project_id: str, executer_id: str) -> bool:
        return (project_id, executer_id) in self.executers

    def _presence_lock(self, key: tuple[str, str]) -> asyncio.Lock:
        lock = self._presence.get(key)
        if lock is None:
            lock = self._presence[key] = asyncio.Lock()
        return lock

    async def _withdraw(self, key: tuple[str, str]) -> None:
        """Remove the executer's presence, unless it connected here again meanwhile (presence
        writes of one executer take turns: a late withdraw never undoes a new connection's)."""
        assert self._cluster is not None
        async with self._presence_lock(key):
            if key in self.executers:
                return
            await asyncio.to_thread(self._cluster.withdraw, *key)

    def _choose(self, project_id: str, executer_id: str | None) -> Peer | None:
        if executer_id is not None:
            return self.executers.get((project_id, executer_id))
        mine = [p for (proj, _), p in self.executers.items() if proj == project_id]
        if not mine:
            return None
        for peer in mine:
            if peer.executer_id == wire.DEFAULT_EXECUTER:
                return peer
        return mine[-1]  # the most recently connected

    async def _route(self, project_id: str, executer_id: str | None) -> Peer | Where | None:
        """The executer to send to: connected here, else on another replica, else None."""
        peer = self._choose(project_id, executer_id)
        if peer is not None or self.remote is None:
            return peer
        return await self.remote.locate(project_id, executer_id)

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
            if self.remote is not None:  # one on another replica wakes nobody here: look again
                left = min(left, 0.5)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), left)

    def connected(self, project_id: str) -> int:
        """How many executers of the project are connected to this replica."""
        return sum(1 for proj, _ in self.executers if proj == project_id)

    async def reachable(self, project_id: str) -> int:
        """How many executers of the project this replica can reach (here or on another)."""
        if self._cluster is None:
            return self.connected(project_id)
        return max(
            self.connected(project_id),
            await asyncio.to_thread(self._cluster.count, project_id),
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
        timeout: float = wire.DEFAULT_TIMEOUT_S,
        wait_for_executer: bool = False,
        internal: bool = False,
    ) -> None:
        """Send a request on (or join the same one in flight, or answer it from the answers
        kept); ``waiter`` gets its frames. Raises :class:`TunnelFailure` (``no_executer``)."""
        key = (project_id, request_id)
        kept = self.requests.kept_answer(key)
        if kept is not None:
            await waiter(kept)
            return
        pending = self.requests.pending.get(key)
        if pending is not None:
            pending.waiters.append(waiter)
            return
        deadline = time.monotonic() + timeout
        route: Peer | Where | None
        if wait_for_executer:
            route = await self.wait_for_executer(project_id, executer_id, deadline)
        else:
            route = await self._route(project_id, executer_id)
        if route is None:
            raise TunnelFailure("no_executer", _no_executer_message(project_id, executer_id))
        if key in self.requests.pending:  # it arrived while we waited for an executer
            self.requests.pending[key].waiters.append(waiter)
            return
        target = route.executer_id if isinstance(route, Peer) else route[1]
        assert target is not None
        pending = Pending(project_id, request_id, target, kml, deadline, [waiter], internal)
        self.requests.add(pending, self._expire)
        if isinstance(route, Peer):
            if not await route.send(pending.frame()):
                pending.lost = True  # it goes out again when the executer is back
        else:
            assert self.remote is not None
            await self.remote.send_on(pending, route[0])

    async def request_from(
        self, origin: str, project_id: str, request_id: str, kml: str, *,
        executer_id: str | None, timeout: float, waiter: Waiter,
    ) -> None:  # fmt: skip
        """A request another replica sent on for an executer connected here: relayed, its frames
        sent back to ``origin`` (which records the results and answers its client)."""
        key = (project_id, request_id)
        kept = self.requests.kept_answer(key)
        if kept is not None:
            await waiter(kept)
            return
        if key in self.requests.pending:
            self.requests.pending[key].waiters.append(waiter)
            return
        route = self._choose(project_id, executer_id)
        target = route.executer_id if route is not None else executer_id
        pending = Pending(
            project_id, request_id, target or wire.DEFAULT_EXECUTER, kml,
            time.monotonic() + timeout, [waiter], origin=origin,
        )  # fmt: skip
        self.requests.add(pending, self._expire)
        if route is not None:
            if not await route.send(pending.frame()):
                pending.lost = True
            return
        pending.lost = True  # sent on to us, but the executer is not (or no longer) here
        assert self.remote is not None
        await self.remote.moved(origin, project_id, request_id)

    def _expire(self, key: tuple[str, str]) -> None:
        pending = self.requests.pending.pop(key, None)
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
        self._spawn(deliver(pending.waiters, wire.ErrorFrame(code, message, key[1])))

    async def result(self, peer: Peer, frame: wire.KmlResult) -> None:
        """An executer's ``kml_result``."""
        await self.finish(peer.project_id, frame)

    async def finish(self, project_id: str, result: wire.KmlResult) -> None:
        """A request's ``kml_result``: kept, recorded, delivered to whoever waits for it."""
        key = (project_id, result.request_id)
        pending = self.requests.pop(key)
        first = self.requests.keep(project_id, result)  # delivered twice: recorded once
        relaying = pending is not None and pending.origin is not None  # the origin records it
        internal = pending is not None and pending.internal  # the server's loop records it
        if self.on_results is not None and first and not relaying and not internal:
            try:  # recorded first: a runtime that reads the session after its result came back
                await self.on_results(project_id, result.request_id, result.results)  # finds it
            except Exception:
                log.exception("recording the results of request %s failed", result.request_id)
        if pending is not None:
            await deliver(pending.waiters, result)

    async def progress(self, peer: Peer, frame: wire.KmlProgress) -> None:
        pending = self.requests.pending.get((peer.project_id, frame.request_id))
        if pending is not None:
            await deliver(pending.waiters, frame)

    def forget_waiter(self, waiter: Waiter) -> None:
        self.requests.forget_waiter(waiter)

    async def execute(
        self,
        project_id: str,
        request_id: str,
        kml: str,
        *,
        executer_id: str | None = None,
        timeout: float = wire.DEFAULT_TIMEOUT_S,
    ) -> wire.KmlResult:
        """The server's own use: send a request and wait for its ``kml_result`` (waiting for an
        executer to connect, up to ``timeout``). Raises :class:`TunnelFailure`."""
        done: asyncio.Future[wire.KmlResult | wire.ErrorFrame] = (
            asyncio.get_running_loop().create_future()
        )

        async def waiter(answer: Answer) -> None:
            if isinstance(answer, wire.KmlResult | wire.ErrorFrame) and not done.done():
                done.set_result(answer)

        await self.request(
            project_id, request_id, kml, waiter, executer_id=executer_id, timeout=timeout,
            wait_for_executer=True, internal=True,
        )  # fmt: skip
        try:
            answer = await done
        finally:
            self.forget_waiter(waiter)
        if isinstance(answer, wire.ErrorFrame):
            raise TunnelFailure(answer.code, answer.message)
        return answer

    # -- resolve ---------------------------------------------------------------------------

    async def resolve(self, peer: Peer, frame: wire.Resolve) -> None:
        """A runtime client's ruling, sent to the executer that holds the execution."""
        await self._resolve(peer, frame, peer.project_id, local_only=False)

    async def resolve_for(self, sink: ReplicaSink, frame: wire.Resolve, project_id: str) -> None:
        """A ruling another replica sent on: only an executer connected here may take it."""
        await self._resolve(sink, frame, project_id, local_only=True)

    async def _resolve(
        self, sink: _Sink, frame: wire.Resolve, project_id: str, *, local_only: bool
    ) -> None:
        route = await self._route(project_id, frame.executer_id)
        if local_only and not isinstance(route, Peer):
            route = None
        request_id = frame.request_id or f"res_{secrets.token_hex(8)}"
        if route is None:
            message = _no_executer_message(project_id, frame.executer_id)
            await sink.send(
                wire.error(
                    "no_executer", message, execution_id=frame.execution_id, request_id=request_id
                )
            )
            return
        self.resolves[(project_id, request_id)] = sink
        if not isinstance(route, Peer):
            assert self.remote is not None
            await self.remote.send_resolve(route, _with_request_id(frame, request_id), project_id)
            return
        await route.send(
            wire.resolve(
                frame.execution_id, frame.resolution, request_id, base_path=frame.base_path
            )
        )

    async def resolved(self, peer: Peer, answer: wire.Resolved | wire.ErrorFrame) -> None:
        """An executer's answer to a ``resolve``."""
        await self.answer_resolve(peer.project_id, answer)

    async def answer_resolve(
        self, project_id: str, answer: wire.Resolved | wire.ErrorFrame
    ) -> None:
        if answer.request_id is None:
            return
        waiting = self.resolves.pop((project_id, answer.request_id), None)
        if waiting is not None:
            await waiting.send(wire.as_dict(answer))

    # -- across replicas -------------------------------------------------------------------

    async def reroute(self) -> int:
        """Send again the requests whose executer moved to (or died on) another replica."""
        return 0 if self.remote is None else await self.remote.reroute()

    def heard(self) -> dict[tuple[str, str], int]:
        """When each executer connected here was last heard from (unix ms)."""
        offset = time.time() - time.monotonic()
        return {key: int((peer.seen + offset) * 1000) for key, peer in self.executers.items()}

    # -- housekeeping ----------------------------------------------------------------------

    async def heartbeat_forever(self, every: float = HEARTBEAT_S) -> None:
        """Drop executers that went silent (their pending requests wait for them to return)."""
        while True:
            await asyncio.sleep(every)
            for peer in self.silent(time.monotonic()):
                log.info(
                    "executer %s of project %s went silent; dropped",
                    peer.executer_id,
                    peer.project_id,
                )
                self.detach(peer)
                await peer.close(wire.CLOSE_SILENT, "no heartbeat for 45 s")

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self.requests.clear()
        for peer in list(self.executers.values()):
            await peer.close(1001, "the server is shutting down")
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _with_request_id(frame: wire.Resolve, request_id: str) -> wire.Resolve:
    return wire.Resolve(
        frame.execution_id, frame.resolution, request_id, frame.base_path, frame.executer_id
    )


def _no_executer_message(project_id: str, executer_id: str | None) -> str:
    which = f"executer {executer_id!r}" if executer_id else "executer"
    return (
        f"no {which} of project {project_id} is connected; start one with `kyronix executer "
        f"--ws URL --base DIR` (or KyronixExecuter(ws_url=...)) using a key of this project"
    )
