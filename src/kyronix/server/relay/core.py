"""The relay: runtime clients' KML sent on to their project's executer, and its answers back.

One :class:`Relay` per server process holds the executers connected to it (by project and
executer id), the requests pending and the answers kept (:mod:`.pending`), and the ``resolve``
frames in flight. :meth:`Relay.execute` is the same path for the server's own agent loop. With
several replicas, executers on other replicas are reached through :mod:`.remote`.

It knows connections only as :class:`~.peer.Peer` s and frames only as :mod:`kyronix.wire`
values: the ``/ws`` route (:mod:`kyronix.server.ws`) authenticates and parses, the relay
decides. Frames for another project never cross: every look-up is keyed by the project.

It believes a connection only for answers to what it asked that connection: a ``kml_result``
(or progress, or the answer to a ``resolve``) counts only from the executer connection the
request was sent to, and only once; anything else is refused and recorded nowhere. An executer
id belongs to the key that claimed it while its connection lives: another key's connection
cannot take it (4409); the same key's new connection replaces the old one (4000: after a dropped
TCP connection the server may not have noticed yet that the old one is dead).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from kyronix import wire
from kyronix.server.config import TunnelLimits
from kyronix.server.relay.connections import Connections, no_executer_message
from kyronix.server.relay.peer import FrameBudget, Peer, Verdict, project_budget
from kyronix.server.relay.pending import (
    Answer,
    Pending,
    Requests,
    TunnelFailure,
    Waiter,
    deliver,
)
from kyronix.server.relay.remote import Remote, ReplicaSink
from kyronix.server.relay.rulings import Rulings
from kyronix.server.tasks import Background

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster, Where

__all__ = ["CLOSE_CLAIMED", "SILENT_S", "Relay", "ResultsHook"]

log = logging.getLogger("kyronix.server")

SILENT_S = wire.SILENT_S
"""An executer heard nothing from for this long is dropped (it pings every 15 s)."""
CLOSE_CLAIMED = wire.CLOSE_CLAIMED
"""The executer id is held by another key's live connection."""

ResultsHook = Callable[
    [str, str, Sequence[wire.EntryDict], str | None, str | None], Awaitable[None]
]
"""``hook(project_id, request_id, results, session_id, key_id)``: record a runtime client's
results (in ``session_id`` only, when the client named one; only in sessions whose plans the
client's key ``key_id`` ran), before the client gets them (keep it short: it is on the round
trip)."""


class Relay:
    def __init__(
        self,
        on_results: ResultsHook | None = None,
        cluster: Cluster | None = None,
        limits: TunnelLimits | None = None,
        revoked: Callable[[set[str]], set[str]] | None = None,
    ) -> None:
        self.limits = limits or TunnelLimits()
        self.revoked = revoked
        """``revoked(key ids)``: those of them revoked now (a blocking database read)."""
        self.connections = Connections(cluster)
        self.requests = Requests(
            kept_bytes=self.limits.kept_bytes, kept_bytes_project=self.limits.kept_bytes_project
        )
        self.on_results = on_results
        self.remote = Remote(cluster, self.requests, self) if cluster is not None else None
        self.rulings = Rulings(self.connections, self.remote, self.limits)
        self.budgets: dict[str, FrameBudget] = {}
        """Each project's frame budget, over all its connections to this replica."""
        self._cluster = cluster
        if cluster is not None:  # a key revoked anywhere: its connections here close at once
            cluster.on("revoked", self._revoked_elsewhere)
            cluster.on("replaced", self._replaced_elsewhere)
        self._tasks = Background("relaying")

    # -- connections -----------------------------------------------------------------------

    def connect(self, peer: Peer) -> None:
        """A connection authenticated (its frames may come now)."""
        self.connections.connect(peer)

    def admit(self, peer: Peer, now: float, size: int) -> Verdict:
        """Spend a frame of ``size`` bytes from the connection's budget and its project's
        (``tunnel.framesPerSecond``..., ``tunnel.framesPerSecondPerProject``...): a frame the
        project has no room for counts against the connection that sent it."""
        verdict = peer.budget.take(now, size)
        if verdict is not Verdict.OK:
            return verdict
        project = self.budgets.get(peer.project_id)
        if project is None:
            project = self.budgets[peer.project_id] = project_budget(self.limits)
        if project.take(now, size) is Verdict.OK:
            return Verdict.OK
        project.over = 0.0  # the project is not closed: the connection that sent it pays
        return peer.budget.penalize()

    def spent(self, peer: Peer, seconds: float) -> None:
        """Reading a frame ``peer`` sent took ``seconds``: from its budget and its project's."""
        peer.budget.spend(seconds)
        project = self.budgets.get(peer.project_id)
        if project is not None:
            project.spend(seconds)

    def tidy(self, now: float) -> None:
        """The heartbeat round's sweep: rulings nobody answered are forgotten, and the budgets
        of projects with no connection here dropped."""
        self.rulings.expire(now)
        live = self.connections.project_ids()
        for project_id in [p for p in self.budgets if p not in live]:
            del self.budgets[project_id]

    async def claim(self, peer: Peer) -> str | None:
        """May ``peer`` be its project's executer? None if so, else why not."""
        return await self.connections.claim(peer)

    async def attach_executer(self, peer: Peer) -> None:
        """``peer`` (claimed) is its project's executer now: the old connection of the same key
        is closed (4000), and what waited for this executer goes out to it."""
        old = await self.connections.put_executer(peer)
        if old is not None:
            await old.close(wire.CLOSE_REPLACED, "replaced by a new connection of this executer")
        key = (peer.project_id, peer.executer_id)
        for pending in list(self.requests.pending.values()):  # what waited for it goes out again
            if (pending.project_id, pending.executer_id) == key:
                pending.lost = False
                pending.remote = None  # it is here now, whichever replica it was sent to
                pending.sent_to = peer
                if not await peer.send(pending.frame()):
                    pending.lost = True

    def detach(self, peer: Peer) -> None:
        if self.connections.remove(peer):
            key = (peer.project_id, peer.executer_id)
            for pending in self.requests.pending.values():
                if (pending.project_id, pending.executer_id) == key and not pending.remote:
                    pending.lost = True
        self.rulings.forget(peer)

    async def close_key(self, key_id: str, reason: str) -> int:
        """Close every connection opened with the key (revoked): 4401. Returns how many."""
        gone = self.connections.of_key(key_id)
        for peer in gone:
            self.detach(peer)
            await peer.close(wire.CLOSE_UNAUTHORIZED, reason)
        return len(gone)

    def key_ids(self) -> set[str]:
        """The keys of the connections open now."""
        return self.connections.key_ids()

    async def _revoked_elsewhere(self, body: dict[str, Any]) -> None:
        await self.close_key(str(body["keyId"]), "the API key was revoked")

    async def _replaced_elsewhere(self, body: dict[str, Any]) -> None:
        """The same key's executer connected again to another replica: its connection here (a
        dropped TCP connection the server may not have noticed) is closed, 4000, as it would be
        here, and requests no longer go to it."""
        key = (str(body["project"]), str(body["executerId"]))
        old = self.connections.executers.get(key)
        if old is None or old.key_id != body.get("keyId"):
            return
        self.detach(old)
        await old.close(wire.CLOSE_REPLACED, "replaced by a new connection of this executer")

    def here(self, project_id: str, executer_id: str) -> bool:
        return self.connections.here(project_id, executer_id)

    async def reachable(self, project_id: str) -> int:
        """How many executers of the project this replica can reach (here or on another)."""
        return await self.connections.reachable(project_id)

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
        asker: Peer | None = None,
        session_id: str | None = None,
    ) -> None:
        """Send a request on (or join the same one in flight, or answer it from the answers
        kept); ``waiter`` gets its frames. Raises :class:`TunnelFailure` (``no_executer``, or
        ``too_many_pending`` past the limits of ``asker``, the runtime connection, or of its
        project)."""
        key = (project_id, request_id)
        key_id = asker.key_id if asker is not None else None
        if await self._answered(key, waiter, key_id):
            return
        if asker is not None:
            self._check_room(asker, len(kml))
        deadline = time.monotonic() + timeout
        route: Peer | Where | None
        if wait_for_executer:
            route = await self.connections.wait_for(project_id, executer_id, deadline)
        else:
            route = await self.connections.route(project_id, executer_id)
        if route is None:
            raise TunnelFailure("no_executer", no_executer_message(project_id, executer_id))
        if await self._answered(key, waiter, key_id):  # it arrived while we waited
            return
        target = route.executer_id if isinstance(route, Peer) else route[1]
        assert target is not None
        pending = Pending(
            project_id, request_id, target, kml, deadline, [waiter], internal, asker=asker,
            key_id=key_id, session_id=session_id,
        )  # fmt: skip
        self.requests.add(pending, self._expire)
        if isinstance(route, Peer):
            pending.sent_to = route
            if not await route.send(pending.frame()):
                pending.lost = True  # it goes out again when the executer is back
        else:
            assert self.remote is not None
            await self.remote.send_on(pending, route[0])

    async def _answered(self, key: tuple[str, str], waiter: Waiter, key_id: str | None) -> bool:
        """Whether the request of the key ``key_id`` needs sending no more: its answer is kept
        (given to ``waiter`` now), or it is in flight (``waiter`` joins it). An id another key
        uses is refused (``request_in_use``): nobody reads or joins another key's request."""
        used, owner = self.requests.owner(key)
        if used and owner != key_id:
            raise TunnelFailure(
                "request_in_use",
                f"the request id {key[1]!r} is in use by another API key of this project (or "
                f"by the server): choose another id",
            )
        kept = self.requests.kept_answer(key)
        if kept is not None:
            await waiter(kept)
            return True
        pending = self.requests.pending.get(key)
        if pending is not None:
            self.requests.join(pending, waiter)
            return True
        return False

    def _check_room(self, asker: Peer, size: int) -> None:
        limits = self.limits
        project = asker.project_id
        if asker.pending_bytes + size > limits.max_pending_bytes:
            raise TunnelFailure(
                "too_many_pending",
                f"this connection has {asker.pending_bytes} bytes of requests in flight; with "
                f"{size} more it would be over tunnel.maxPendingBytes: wait for their results",
            )
        if self.requests.bytes_by_project[project] + size > limits.max_pending_bytes_project:
            raise TunnelFailure(
                "too_many_pending",
                f"project {project} has too many bytes of requests in flight "
                f"(tunnel.maxPendingBytesPerProject); wait for their results",
            )
        if asker.pending >= limits.max_pending:
            raise TunnelFailure(
                "too_many_pending",
                f"this connection has {asker.pending} requests in flight, the most it may "
                f"(tunnel.maxPending); wait for their results before sending more",
            )
        if self.requests.by_project[asker.project_id] >= limits.max_pending_project:
            raise TunnelFailure(
                "too_many_pending",
                f"project {asker.project_id} has {limits.max_pending_project} requests in "
                f"flight, the most it may (tunnel.maxPendingPerProject); wait for their results",
            )

    async def request_from(
        self, origin: str, project_id: str, request_id: str, kml: str, *,
        executer_id: str | None, timeout: float, waiter: Waiter, key_id: str | None = None,
    ) -> None:  # fmt: skip
        """A request another replica sent on for an executer connected here: relayed, its frames
        sent back to ``origin`` (which records the results and answers its client). Raises
        :class:`TunnelFailure` ``request_in_use`` when another key's request has its id."""
        key = (project_id, request_id)
        if await self._answered(key, waiter, key_id):
            return
        route = self.connections.choose(project_id, executer_id)
        target = route.executer_id if route is not None else executer_id
        pending = Pending(
            project_id, request_id, target or wire.DEFAULT_EXECUTER, kml,
            time.monotonic() + timeout, [waiter], origin=origin, key_id=key_id,
        )  # fmt: skip
        self.requests.add(pending, self._expire)
        if route is not None:
            pending.sent_to = route
            if not await route.send(pending.frame()):
                pending.lost = True
            return
        pending.lost = True  # sent on to us, but the executer is not (or no longer) here
        assert self.remote is not None
        await self.remote.moved(origin, project_id, request_id)

    def _expire(self, key: tuple[str, str]) -> None:
        pending = self.requests.pop(key)
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
        self._tasks.spawn(deliver(pending.waiters, wire.ErrorFrame(code, message, key[1])))

    async def result(self, peer: Peer, frame: wire.KmlResult, size: int) -> bool:
        """An executer's ``kml_result`` (``size``: its frame's bytes). False when it answers no
        request sent to this connection (unknown, already answered, or sent to another): it is
        refused, and nothing of it is kept or recorded."""
        pending = self.requests.pending.get((peer.project_id, frame.request_id))
        if pending is None or pending.sent_to is not peer:
            return False
        await self.finish(peer.project_id, frame, size)
        return True

    async def finish(self, project_id: str, result: wire.KmlResult, size: int) -> None:
        """The answer to a pending request: kept, recorded, delivered to whoever waits for it.
        (The caller checked it answers a request this relay sent.)"""
        key = (project_id, result.request_id)
        pending = self.requests.pop(key)
        if pending is None:
            return
        self.requests.keep(project_id, result, size, pending.key_id)
        relaying = pending.origin is not None  # the origin records it
        if self.on_results is not None and not relaying and not pending.internal:
            try:  # recorded first: a runtime that reads the session after its result came back
                await self.on_results(  # finds it
                    project_id, result.request_id, result.results, pending.session_id,
                    pending.key_id,
                )  # fmt: skip
            except Exception:
                log.exception("recording the results of request %s failed", result.request_id)
        await deliver(pending.waiters, result)

    async def progress(self, peer: Peer, frame: wire.KmlProgress) -> bool:
        """An executer's progress on a request: passed on only from the connection the request
        was sent to."""
        pending = self.requests.pending.get((peer.project_id, frame.request_id))
        if pending is None or pending.sent_to is not peer:
            return False
        await deliver(pending.waiters, frame)
        return True

    def forget_waiter(self, project_id: str, request_id: str, waiter: Waiter) -> None:
        """A runtime connection went away (or sent the same request again): a request nobody
        else waits for is dropped after ``tunnel.orphanTimeout`` (unless someone joins it)."""
        orphan = self.requests.forget_waiter((project_id, request_id), waiter)
        if orphan is not None:
            asyncio.get_running_loop().call_later(self.limits.orphan_s, self._drop_orphan, orphan)

    def _drop_orphan(self, pending: Pending) -> None:
        if pending.orphaned is None or self.requests.pending.get(pending.key) is not pending:
            return  # somebody joined it again, or it was answered
        self.requests.pop(pending.key)

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
            self.requests.forget_waiter((project_id, request_id), waiter)
        if isinstance(answer, wire.ErrorFrame):
            raise TunnelFailure(answer.code, answer.message)
        return answer

    # -- rulings -------------------------------------------------------------------------

    async def resolve(self, peer: Peer, frame: wire.Resolve) -> None:
        """A runtime client's ruling, sent to the executer that holds the execution."""
        await self.rulings.ask(peer, frame, peer.project_id, local_only=False)

    async def resolve_for(self, sink: ReplicaSink, frame: wire.Resolve, project_id: str) -> None:
        """A ruling another replica sent on: only an executer connected here may take it."""
        await self.rulings.ask(sink, frame, project_id, local_only=True)

    async def resolved(self, peer: Peer, answer: wire.Resolved | wire.ErrorFrame) -> bool:
        """An executer's answer to a ``resolve`` (believed only from the executer it was sent
        to; False: refused)."""
        return await self.rulings.answered(peer, answer)

    async def answer_resolve(
        self, project_id: str, answer: wire.Resolved | wire.ErrorFrame
    ) -> None:
        await self.rulings.answer(project_id, answer)

    # -- across replicas -------------------------------------------------------------------

    async def reroute(self) -> int:
        """Send again the requests whose executer moved to (or died on) another replica."""
        return 0 if self.remote is None else await self.remote.reroute()

    @property
    def cluster(self) -> Cluster | None:
        return self._cluster

    def heard(self) -> dict[tuple[str, str], int]:
        """When each executer connected here was last heard from (unix ms)."""
        return self.connections.heard()

    # -- housekeeping ----------------------------------------------------------------------

    async def close(self) -> None:
        self.requests.clear()
        for peer in self.connections.executers_here():
            await peer.close(1001, "the server is shutting down")
        await self.connections.close()
        await self._tasks.close()
