"""Several replicas on one PostgreSQL database: who is alive, where executers are, the mailbox.

No cluster code of our own beyond this: the database is the coordination point (as in DBOS).

* **Replicas** (``kx_replicas``): each ``kyronix serve`` registers a row (host, pid, process
  identity) and renews its heartbeat every :attr:`Cluster.beat` seconds. A replica is **dead**
  when its heartbeat is older than ``timeout`` or, on this host, when its process is gone (a
  SIGKILLed replica is seen dead at the next heartbeat of another, not ``timeout`` later).
* **Presence** (``kx_presence``): which replica each connected executer (project, executer id)
  is connected to, with when it was last heard from. An executer not heard from for
  :data:`SILENT_S` seconds, or on a dead replica, is not there.
* **Mailbox** (``kx_mailbox``, :mod:`kyronix.server.mailbox`): frames for another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from kiso.kernel.sql import process_identity, this_process, writers
from kyronix import wire
from kyronix.server.db import Database, now_ms, presence, replicas
from kyronix.server.mailbox import (
    SWEEP_S,
    Handler,
    Mailbox,
    drop_mailboxes,
    drop_orphaned,
    post,
)

__all__ = ["SILENT_S", "SWEEP_S", "Cluster", "Where", "tell_every_replica"]

log = logging.getLogger("kyronix.server")

SILENT_S = wire.SILENT_S
"""An executer not heard from for this long is lost (it pings every 15 s)."""
LOCATE_CACHE_S = 0.5
"""How long where a project's executers are is remembered (a stale route is answered "moved"
by the replica it names, and the request is routed again)."""

Where = tuple[str, str]
"""(replica id, executer id): where an executer is connected."""


def tell_every_replica(conn: Connection, kind: str, body: dict[str, Any]) -> int:
    """Post a frame to every registered replica, in the caller's transaction (with NOTIFY on
    PostgreSQL; on SQLite no replica registers, and this posts nothing). How many."""
    targets = [r.id for r in conn.execute(select(replicas.c.id))]
    notify = conn.dialect.name == "postgresql"
    for target in targets:
        post(conn, target, kind, body, notify=notify)
    return len(targets)


class Cluster:
    """This replica's view of the others, on one database (PostgreSQL)."""

    def __init__(
        self, db: Database, replica_id: str, *, timeout: float = 15.0, notify: bool = True
    ) -> None:
        self.db = db
        self.id = replica_id
        self.timeout = timeout
        self.beat = max(0.2, timeout / 5)
        self.mailbox = Mailbox(db, replica_id, notify=notify)
        self._located: dict[str, tuple[float, list[Where]]] = {}
        """Where each project's executers were found, for :data:`LOCATE_CACHE_S` seconds."""
        self._host = socket.gethostname()

    # ------------------------------------------------------------------ the mailbox

    def on(self, kind: str, handler: Handler) -> None:
        """Handle the mailbox rows of ``kind`` sent to this replica with ``handler``."""
        self.mailbox.on(kind, handler)

    @property
    def handlers(self) -> dict[str, Handler]:
        return self.mailbox.handlers

    def post(self, target: str, kind: str, body: dict[str, Any]) -> int:
        """Queue a frame for replica ``target`` (:meth:`Mailbox.post`)."""
        return self.mailbox.post(target, kind, body)

    async def send(self, target: str, kind: str, body: dict[str, Any]) -> None:
        await self.mailbox.send(target, kind, body)

    def pending(self) -> int:
        """Rows waiting in this replica's mailbox (not yet handled)."""
        return self.mailbox.pending()

    @property
    def delivered(self) -> int:
        return self.mailbox.delivered

    @property
    def swept(self) -> int:
        return self.mailbox.swept

    async def listen_forever(self) -> None:
        await self.mailbox.listen_forever()

    async def sweep_forever(self, every: float = SWEEP_S) -> None:
        await self.mailbox.sweep_forever(every)

    # ------------------------------------------------------------------ replicas

    def register(self) -> None:
        pid, host, process = this_process()
        at = now_ms()
        self.db.write(
            lambda c: c.execute(
                insert(replicas).values(
                    id=self.id, host=host, pid=pid, process=process, started_at=at, heartbeat_at=at
                )
            )
        )

    def heartbeat(self) -> None:
        """Renew this replica's heartbeat (registered again if another replica declared it dead
        and removed it: its runs were taken over; it goes on with what it still holds)."""
        renewed = self.db.write(
            lambda c: (
                c.execute(
                    update(replicas).where(replicas.c.id == self.id).values(heartbeat_at=now_ms())
                ).rowcount
            )
        )
        if renewed == 0:
            log.warning("replica %s had been declared dead by another; registering again", self.id)
            self.register()

    async def heartbeat_forever(self) -> None:
        """Renew this replica's heartbeat, and drop the mailbox rows of replicas gone; each
        beat."""
        while True:
            await asyncio.sleep(self.beat)
            try:
                await asyncio.to_thread(self.heartbeat)
                await asyncio.to_thread(self.prune)
            except Exception:
                log.exception("the replica heartbeat failed; it runs again in %gs", self.beat)

    def unregister(self) -> None:
        def tx(conn: Connection) -> None:
            conn.execute(delete(presence).where(presence.c.replica_id == self.id))
            drop_mailboxes(conn, [self.id])
            conn.execute(delete(replicas).where(replicas.c.id == self.id))

        with contextlib.suppress(Exception):
            self.db.write(tx)

    def _dead(self, row: Any, now: int) -> bool:
        if row.id == self.id:
            return False
        if now - row.heartbeat_at > self.timeout * 1000:
            return True
        if row.host == self._host:  # this host: its process tells at once
            identity = process_identity(row.pid)
            return identity is None or bool(identity and row.process and identity != row.process)
        return False

    def liveness(self) -> tuple[set[str], list[str]]:
        """(the live replicas' ids, this one included; the dead ones' ids)."""
        rows = self.db.read(lambda c: list(c.execute(select(replicas))))
        now = now_ms()
        dead = [r.id for r in rows if self._dead(r, now)]
        live = {r.id for r in rows if r.id not in dead} | {self.id}
        return live, dead

    def alive_query(self, dead: Iterable[str]) -> Any:
        """The ids of the replicas alive now, as a subquery (for a statement that must see the
        replicas as they are when it runs: one that claims a dead replica's runs)."""
        fresh = now_ms() - int(self.timeout * 1000)
        return select(replicas.c.id).where(
            (replicas.c.heartbeat_at > fresh) & replicas.c.id.not_in(list(dead))
        )

    def forget(self, dead: Iterable[str]) -> None:
        """Remove dead replicas: their rows, their executers' presence, their mailboxes, and the
        session writer leases their processes held (the kernel frees a lease of a dead process
        on its own host only; a replica is dead here by its heartbeat, on any host). A replica
        that was only slow finds its leases gone: its next batch is refused (fenced)."""
        ids = list(dead)
        if not ids:
            return

        def tx(conn: Connection) -> None:
            gone = conn.execute(
                select(replicas.c.host, replicas.c.pid).where(replicas.c.id.in_(ids))
            ).all()
            for host, pid in gone:
                conn.execute(
                    delete(writers).where((writers.c.host == host) & (writers.c.pid == pid))
                )
            conn.execute(delete(presence).where(presence.c.replica_id.in_(ids)))
            drop_mailboxes(conn, ids)
            conn.execute(delete(replicas).where(replicas.c.id.in_(ids)))

        self.db.write(tx)

    def prune(self, older_than: float = 60.0) -> int:
        """Drop mailbox rows for replicas that no longer exist (sent after they died)."""
        cutoff = now_ms() - int(older_than * 1000)
        return self.db.write(lambda c: drop_orphaned(c, select(replicas.c.id), cutoff))

    def lease_holder(self, session_id: str) -> str | None:
        """The live replica whose process holds the session's writer lease (not this one)."""

        def load(conn: Connection) -> Any:
            return conn.execute(
                select(replicas.c.id)
                .join(
                    writers, (writers.c.host == replicas.c.host) & (writers.c.pid == replicas.c.pid)
                )
                .where(writers.c.session_id == session_id)
            ).first()

        row = self.db.read(load)
        return None if row is None or row.id == self.id else str(row.id)

    # ------------------------------------------------------------------ presence

    def announce(self, project_id: str, executer_id: str) -> None:
        """This replica now has the executer (it connected here)."""
        at = now_ms()

        def tx(conn: Connection) -> None:
            moved = conn.execute(
                update(presence)
                .where(
                    (presence.c.project_id == project_id) & (presence.c.executer_id == executer_id)
                )
                .values(replica_id=self.id, connected_at=at, seen_at=at)
            ).rowcount
            if moved == 0:
                conn.execute(
                    insert(presence).values(
                        project_id=project_id,
                        executer_id=executer_id,
                        replica_id=self.id,
                        connected_at=at,
                        seen_at=at,
                    )
                )

        self.db.write(tx)

    def claim(
        self, project_id: str, executer_id: str, key_id: str | None
    ) -> tuple[bool, str | None]:
        """Make this replica the executer's (it connected here with ``key_id``), unless a live
        connection of another key holds the id on another live replica: then ``(False, None)``.
        Taken: ``(True, replica)``, where ``replica`` is the other replica that held it for the
        same key (its old connection is to be closed: 4000), or None. One transaction, the row
        locked: two replicas claiming at once take turns."""
        at = now_ms()
        fresh_seen = at - int(SILENT_S * 1000)
        fresh_beat = at - int(self.timeout * 1000)
        where = (presence.c.project_id == project_id) & (presence.c.executer_id == executer_id)

        def tx(conn: Connection) -> tuple[bool, str | None]:
            query = select(presence).where(where)
            if not self.db.is_sqlite:
                query = query.with_for_update()
            row = conn.execute(query).first()
            if row is None:
                conn.execute(
                    insert(presence).values(
                        project_id=project_id, executer_id=executer_id, replica_id=self.id,
                        key_id=key_id, connected_at=at, seen_at=at,
                    )
                )  # fmt: skip
                return True, None
            if row.key_id not in (None, key_id) and row.replica_id != self.id:
                holder = conn.execute(
                    select(replicas.c.heartbeat_at).where(replicas.c.id == row.replica_id)
                ).first()
                alive = holder is not None and holder.heartbeat_at > fresh_beat
                if alive and row.seen_at > fresh_seen:
                    return False, None
            conn.execute(
                update(presence)
                .where(where)
                .values(replica_id=self.id, key_id=key_id, connected_at=at, seen_at=at)
            )
            return True, row.replica_id if row.replica_id != self.id else None

        try:
            return self.db.write(tx)
        except IntegrityError:  # another replica inserted the row first: judge by it
            return self.db.write(tx)

    def withdraw(self, project_id: str, executer_id: str) -> None:
        """The executer left this replica (a row another replica has since taken is kept)."""
        self.db.write(
            lambda c: c.execute(
                delete(presence).where(
                    (presence.c.project_id == project_id)
                    & (presence.c.executer_id == executer_id)
                    & (presence.c.replica_id == self.id)
                )
            )
        )

    def seen(self, heard: dict[tuple[str, str], int]) -> None:
        """Record when each of this replica's executers was last heard from (unix ms)."""
        if not heard:
            return

        def tx(conn: Connection) -> None:
            for (project_id, executer_id), at in heard.items():
                conn.execute(
                    update(presence)
                    .where(
                        (presence.c.project_id == project_id)
                        & (presence.c.executer_id == executer_id)
                        & (presence.c.replica_id == self.id)
                    )
                    .values(seen_at=at)
                )

        self.db.write(tx)

    def _present(self, conn: Connection, projects: Iterable[str]) -> list[Any]:
        """The executers of these projects connected to a live replica, most recent last."""
        now = now_ms()
        fresh = now - int(self.timeout * 1000)
        rows = conn.execute(
            select(presence, replicas.c.host, replicas.c.pid, replicas.c.process,
                   replicas.c.heartbeat_at, replicas.c.id)
            .join(replicas, replicas.c.id == presence.c.replica_id)
            .where(
                presence.c.project_id.in_(list(projects))
                & (presence.c.seen_at > now - int(SILENT_S * 1000))
                & (replicas.c.heartbeat_at > fresh)
            )
            .order_by(presence.c.connected_at)
        ).all()  # fmt: skip
        return [r for r in rows if not self._dead(r, now)]

    def locate(self, project_id: str, executer_id: str | None) -> Where | None:
        """Where the project's executer is connected on another replica (the one named; else
        ``default``, else the one connected longest), or None."""
        cached = self._located.get(project_id)
        if cached is not None and cached[0] > time.monotonic():
            found = cached[1]
        else:
            found = self.routes([project_id]).get(project_id, [])
            if found:  # "none" is never remembered: one may connect any moment
                self._located[project_id] = (time.monotonic() + LOCATE_CACHE_S, found)
            while len(self._located) > 10_000:
                self._located.pop(next(iter(self._located)))
        if executer_id is not None:
            found = [w for w in found if w[1] == executer_id]
        if not found:
            return None
        for where in found:
            if where[1] == "default":
                return where
        return found[0]

    def forget_route(self, project_id: str) -> None:
        """Look the project's executers up again next time (a route turned out stale)."""
        self._located.pop(project_id, None)

    def routes(self, projects: Iterable[str]) -> dict[str, list[Where]]:
        """Each project's executers on other live replicas: ``{project: [(replica, executer)]}``."""
        wanted = sorted(set(projects))
        if not wanted:
            return {}
        rows = self.db.read(lambda c: self._present(c, wanted))
        out: dict[str, list[Where]] = {}
        for row in rows:
            if row.replica_id != self.id:
                out.setdefault(row.project_id, []).append((row.replica_id, row.executer_id))
        return out

    def count(self, project_id: str) -> int:
        """How many executers of the project are connected anywhere in the cluster."""
        return len(self.db.read(lambda c: self._present(c, [project_id])))
