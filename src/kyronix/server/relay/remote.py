"""The relay across replicas (several servers on one PostgreSQL database; docs/deploy.md).

A request whose executer is connected to another replica is sent on through the cluster mailbox
(``request``): this replica (the **origin**) keeps it pending, records its results and answers its
runtime client; the executer's replica only relays the executer's frames back (``frame``). A
``resolve`` travels the same way (``resolve``, answered by ``resolved``). Requests whose executer
moved are sent again where it is now (:meth:`Remote.reroute`); a request sent to a replica whose
executer is no longer there is answered ``moved``, and routed again.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kyronix import wire
from kyronix.server.relay.pending import Answer, Pending, Requests, TunnelFailure, deliver

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster, Where

__all__ = ["Remote", "ReplicaSink"]


class _Local(Protocol):
    """What the cross-replica part needs of the relay."""

    def here(self, project_id: str, executer_id: str) -> bool: ...

    async def request_from(
        self, origin: str, project_id: str, request_id: str, kml: str, *,
        executer_id: str | None, timeout: float, waiter: Any, key_id: str | None,
    ) -> None: ...  # fmt: skip

    async def finish(self, project_id: str, result: wire.KmlResult, size: int) -> None: ...

    async def resolve_for(
        self, sink: ReplicaSink, frame: wire.Resolve, project_id: str
    ) -> None: ...

    async def answer_resolve(
        self, project_id: str, answer: wire.Resolved | wire.ErrorFrame
    ) -> None: ...


@dataclass(eq=False)
class ReplicaSink:
    """A runtime client on another replica, waiting for the answer to its ``resolve``."""

    cluster: Cluster
    target: str
    project_id: str

    async def send(self, frame: dict[str, Any]) -> bool:
        await self.cluster.send(
            self.target, "resolved", {"project": self.project_id, "frame": frame}
        )
        return True


class Remote:
    def __init__(self, cluster: Cluster, requests: Requests, local: _Local) -> None:
        self.cluster = cluster
        self.requests = requests
        self.local = local
        cluster.on("request", self._request)
        cluster.on("frame", self._frame)
        cluster.on("resolve", self._resolve)
        cluster.on("resolved", self._resolved)

    # -- sending on --------------------------------------------------------------------------

    async def send_on(self, pending: Pending, replica: str) -> None:
        """Send a request on to the replica its executer is connected to."""
        pending.remote, pending.lost = replica, False
        left = max(0.001, pending.deadline - time.monotonic())
        body = {
            "project": pending.project_id, "requestId": pending.request_id, "kml": pending.kml,
            "executerId": pending.executer_id, "timeout": left, "origin": self.cluster.id,
            "keyId": pending.key_id,
        }  # fmt: skip
        await self.cluster.send(replica, "request", body)

    async def moved(self, origin: str, project_id: str, request_id: str) -> None:
        """Tell ``origin`` the executer it sent a request here for is not here (any more)."""
        body = {"project": project_id, "requestId": request_id, "via": self.cluster.id,
                "moved": True}  # fmt: skip
        await self.cluster.send(origin, "frame", body)

    async def send_resolve(self, where: Where, frame: wire.Resolve, project_id: str) -> None:
        out = wire.resolve(
            frame.execution_id, frame.resolution, frame.request_id or "", executer_id=where[1],
            base_path=frame.base_path,
        )  # fmt: skip
        body = {"project": project_id, "frame": out, "origin": self.cluster.id}
        await self.cluster.send(where[0], "resolve", body)

    async def reroute(self) -> int:
        """Send again the requests whose executer is no longer where they were sent (it went to
        another replica, or theirs died); the executer's receipts make a repeat harmless.
        Returns how many were sent again."""
        stray = [
            p for p in self.requests.pending.values() if p.origin is None and (p.remote or p.lost)
        ]
        if not stray:
            return 0
        routes = await asyncio.to_thread(self.cluster.routes, {p.project_id for p in stray})
        sent = 0
        for pending in stray:
            if self.local.here(pending.project_id, pending.executer_id):
                continue  # it came back here: attaching it sent the request again
            where = [w for w in routes.get(pending.project_id, []) if w[1] == pending.executer_id]
            if not where:
                pending.lost = True
                continue
            replica = where[-1][0]
            if replica == pending.remote and not pending.lost:
                continue
            await self.send_on(pending, replica)
            sent += 1
        return sent

    # -- the mailbox -------------------------------------------------------------------------

    async def _request(self, body: dict[str, Any]) -> None:
        """Another replica sends on a request for an executer connected here."""
        cluster, origin = self.cluster, str(body["origin"])
        project_id, request_id = str(body["project"]), str(body["requestId"])

        async def waiter(answer: Answer) -> None:
            out = {"project": project_id, "requestId": request_id, "via": cluster.id}
            await cluster.send(origin, "frame", {**out, "frame": wire.as_dict(answer)})

        known = self.requests.pending.get((project_id, request_id))
        if known is not None and known.origin == origin and known.waiters:
            return  # a repeat of a request already relayed (its frames already go back)
        executer, key_id = body.get("executerId"), body.get("keyId")
        try:
            await self.local.request_from(
                origin, project_id, request_id, str(body["kml"]),
                executer_id=executer if isinstance(executer, str) else None,
                timeout=float(body["timeout"]), waiter=waiter,
                key_id=key_id if isinstance(key_id, str) else None,
            )  # fmt: skip
        except TunnelFailure as exc:  # another key's request has this id here
            await waiter(wire.ErrorFrame(exc.code, exc.message, request_id))

    async def _frame(self, body: dict[str, Any]) -> None:
        """A frame of a request this replica sent on, from the executer's replica."""
        project_id, request_id = str(body["project"]), str(body["requestId"])
        key = (project_id, request_id)
        pending = self.requests.pending.get(key)
        if body.get("moved"):  # the executer was no longer there: route again at the next tick
            self.cluster.forget_route(project_id)
            if pending is not None and pending.remote == body.get("via"):
                pending.lost = True
            return
        if pending is None or pending.remote != body.get("via"):
            return  # an answer from a route this request no longer takes (or never took)
        raw = body.get("frame") or {}
        frame = wire.from_dict(raw)
        if isinstance(frame, wire.KmlResult):
            await self.local.finish(project_id, frame, len(json.dumps(raw)))
        elif isinstance(frame, wire.KmlProgress):
            await deliver(pending.waiters, frame)
        elif isinstance(frame, wire.ErrorFrame):
            if frame.code == "executer_disconnected":
                pending.lost = True  # it may be on another replica now: route again
                return
            self.requests.pop(key)
            await deliver(pending.waiters, frame)

    async def _resolve(self, body: dict[str, Any]) -> None:
        project_id = str(body["project"])
        frame = wire.from_dict(body.get("frame") or {})
        if isinstance(frame, wire.Resolve):
            sink = ReplicaSink(self.cluster, str(body["origin"]), project_id)
            await self.local.resolve_for(sink, frame, project_id)

    async def _resolved(self, body: dict[str, Any]) -> None:
        frame = wire.from_dict(body.get("frame") or {})
        if isinstance(frame, wire.Resolved | wire.ErrorFrame):
            await self.local.answer_resolve(str(body["project"]), frame)
