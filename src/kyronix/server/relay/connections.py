"""Who is connected: every authenticated connection, and the executers by (project, executer
id), here and (through the cluster's presence table) on other replicas.

An executer id belongs to the key that claimed it while its connection lives (:meth:`claim`):
another key's connection is refused; the same key's new connection replaces the old one (after
a dropped TCP connection the server may not have noticed yet that the old one is dead). With
several replicas the claim is one locked row of ``kx_presence``, so two replicas never hand the
same id to two keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from kyronix import wire
from kyronix.server.relay.peer import Peer
from kyronix.server.relay.pending import TunnelFailure
from kyronix.server.tasks import Background

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster, Where

__all__ = ["Connections", "claimed_message", "no_executer_message"]


class Connections:
    def __init__(self, cluster: Cluster | None = None) -> None:
        self.cluster = cluster
        self.peers: set[Peer] = set()
        """Every connection authenticated now (runtime clients and executers)."""
        self.executers: dict[tuple[str, str], Peer] = {}
        self._arrived: dict[str, asyncio.Event] = {}  # project -> set when an executer connects
        self._presence: dict[tuple[str, str], asyncio.Lock] = {}
        self._tasks = Background("withdrawing an executer's presence")

    def connect(self, peer: Peer) -> None:
        self.peers.add(peer)

    async def claim(self, peer: Peer) -> str | None:
        """May ``peer`` be its project's executer ``executer_id``? None if so, else why not (a
        live connection of another key holds the id, here or on another replica)."""
        assert peer.executer_id is not None
        key = (peer.project_id, peer.executer_id)
        held = self.executers.get(key)
        if held is not None and not held.closed and held.key_id != peer.key_id:
            return claimed_message(peer.executer_id)
        if self.cluster is not None:
            async with self._presence_lock(key):
                taken, previous = await asyncio.to_thread(
                    self.cluster.claim, peer.project_id, peer.executer_id, peer.key_id
                )
            if not taken:
                return claimed_message(peer.executer_id)
            if previous is not None:  # its old connection there (perhaps half-dead) closes
                body = {"project": peer.project_id, "executerId": peer.executer_id,
                        "keyId": peer.key_id}  # fmt: skip
                await self.cluster.send(previous, "replaced", body)
        return None

    async def put_executer(self, peer: Peer) -> Peer | None:
        """``peer`` is the executer of its id now; the connection it replaces, if any."""
        assert peer.executer_id is not None
        key = (peer.project_id, peer.executer_id)
        old = self.executers.get(key)
        self.executers[key] = peer
        arrived = self._arrived.pop(peer.project_id, None)
        if arrived is not None:
            arrived.set()
        return old if old is not None and old is not peer else None

    def remove(self, peer: Peer) -> bool:
        """The connection went away; True if it was the executer of its id."""
        self.peers.discard(peer)
        if peer.role != "executer" or peer.executer_id is None:
            return False
        key = (peer.project_id, peer.executer_id)
        if self.executers.get(key) is not peer:
            return False
        del self.executers[key]
        if self.cluster is not None:
            self._tasks.spawn(self._withdraw(key))
        return True

    def of_key(self, key_id: str) -> list[Peer]:
        return [p for p in self.peers if p.key_id == key_id]

    def key_ids(self) -> set[str]:
        return {p.key_id for p in self.peers if p.key_id is not None}

    def project_ids(self) -> set[str]:
        return {p.project_id for p in self.peers}

    def here(self, project_id: str, executer_id: str) -> bool:
        return (project_id, executer_id) in self.executers

    def executers_here(self) -> list[Peer]:
        return list(self.executers.values())

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

    # -- routing -----------------------------------------------------------------------------

    def choose(self, project_id: str, executer_id: str | None) -> Peer | None:
        """The executer connected here: the one named; else ``default``, else the one connected
        longest (an executer that connects later never takes over the requests naming none)."""
        if executer_id is not None:
            return self.executers.get((project_id, executer_id))
        default = self.executers.get((project_id, wire.DEFAULT_EXECUTER))
        if default is not None:
            return default
        return next((p for (proj, _), p in self.executers.items() if proj == project_id), None)

    async def route(self, project_id: str, executer_id: str | None) -> Peer | Where | None:
        """The executer to send to: connected here, else on another replica, else None."""
        peer = self.choose(project_id, executer_id)
        if peer is not None or self.cluster is None:
            return peer
        return await asyncio.to_thread(self.cluster.locate, project_id, executer_id)

    async def wait_for(
        self, project_id: str, executer_id: str | None, until: float
    ) -> Peer | Where:
        while True:
            route = await self.route(project_id, executer_id)
            if route is not None:
                return route
            left = until - time.monotonic()
            if left <= 0:
                raise TunnelFailure("no_executer", no_executer_message(project_id, executer_id))
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

    def silent(self, now: float, after: float) -> list[Peer]:
        return [p for p in self.executers.values() if now - p.seen > after]

    def heard(self) -> dict[tuple[str, str], int]:
        """When each executer connected here was last heard from (unix ms)."""
        offset = time.time() - time.monotonic()
        return {key: int((peer.seen + offset) * 1000) for key, peer in self.executers.items()}

    async def close(self) -> None:
        await self._tasks.close()


def claimed_message(executer_id: str) -> str:
    return (
        f"the executer id {executer_id!r} of this project is held by a live connection of "
        f"another key; connect with that key, or give this executer another id (--executer-id)"
    )


def no_executer_message(project_id: str, executer_id: str | None) -> str:
    which = f"executer {executer_id!r}" if executer_id else "executer"
    return (
        f"no {which} of project {project_id} is connected; start one with `kyronix executer "
        f"--ws URL --base DIR` (or KyronixExecuter(ws_url=...)) using a key of this project"
    )
