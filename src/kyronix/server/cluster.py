"""Several replicas on one PostgreSQL database: who is alive, where executers are, the mailbox.

No cluster code of our own beyond this: the database is the coordination point (as in DBOS).

* **Replicas** (``kx_replicas``): each ``kyronix serve`` registers a row (host, pid, process
  identity) and renews its heartbeat every :attr:`Cluster.beat` seconds. A replica is **dead**
  when its heartbeat is older than ``timeout`` or, on this host, when its process is gone (a
  SIGKILLed replica is seen dead at the next heartbeat of another, not ``timeout`` later).
* **Presence** (``kx_presence``): which replica each connected executer (project, executer id)
  is connected to, with when it was last heard from. An executer not heard from for
  :data:`SILENT_S` seconds, or on a dead replica, is not there.
* **Mailbox** (``kx_mailbox``): a frame for another replica is a durable row plus
  ``NOTIFY kx_<replica>`` carrying the row's id, in one statement. NOTIFY payloads are capped
  at 8000 bytes and KML is larger, so the row is the frame; one that fits (under
  :data:`INLINE_MAX`) also rides in the notification, and the target handles it without
  reading the row. Each replica has one dedicated LISTEN connection (outside the pool: psycopg
  deadlocks a connection that is iterating ``notifies()`` if you query on it) and a sweep every
  :data:`SWEEP_S` seconds that delivers whatever a missed notification left. A row is deleted
  after its handler ran (by the next sweep, off the delivery path): delivery is **at least
  once**, and the receivers make a repeat harmless (the executer's receipts, keyed by
  ``executionId``).

``notify=False`` (``KYRONIX_NOTIFY=0``) delivers by the sweep alone: for a pooler in transaction
mode (PgBouncer), where LISTEN does not work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, text, update

from kiso.kernel.sql import process_identity, this_process, writers
from kyronix.server.db import Database, mailbox, now_ms, presence, replicas

__all__ = ["SILENT_S", "SWEEP_S", "Cluster", "Handler", "Where"]

log = logging.getLogger("kyronix.server")

SWEEP_S = 1.0
"""Seconds between two sweeps of a replica's mailbox (what a missed NOTIFY left is late by at
most this)."""
SILENT_S = 45.0
"""An executer not heard from for this long is lost (it pings every 15 s)."""
BATCH = 200
LOCATE_CACHE_S = 0.5
"""How long where a project's executers are is remembered (a stale route is answered "moved"
by the replica it names, and the request is routed again)."""
"""Mailbox rows read at a time."""

_POST = text(
    "WITH posted AS (INSERT INTO kx_mailbox (target, kind, body, created_at) "
    "VALUES (:target, :kind, :body, :created_at) RETURNING id) "
    "SELECT id, pg_notify(:channel, id::text || :inline) FROM posted"
)
"""The row and its notification in one round trip (PostgreSQL)."""
INLINE_MAX = 7900
"""A frame this small also rides in its notification (payloads must stay under 8000 bytes):
the target handles it without reading the row; the row is there for the sweep either way."""

Handler = Callable[[dict[str, Any]], Awaitable[None]]
Where = tuple[str, str]
"""(replica id, executer id): where an executer is connected."""


class Cluster:
    """This replica's view of the others, on one database (PostgreSQL)."""

    def __init__(
        self, db: Database, replica_id: str, *, timeout: float = 15.0, notify: bool = True
    ) -> None:
        self.db = db
        self.id = replica_id
        self.timeout = timeout
        self.beat = max(0.2, timeout / 5)
        self.notify = notify and not db.is_sqlite
        self.channel = f"kx_{replica_id}"
        self.handlers: dict[str, Handler] = {}
        self.delivered = 0
        """Mailbox rows handled by this replica (by notification or by the sweep)."""
        self.swept = 0
        """Of those, rows the sweep found (their notification was missed or never sent)."""
        self._drain_lock = asyncio.Lock()
        self._located: dict[str, tuple[float, list[Where]]] = {}
        """Where each project's executers were found, for :data:`LOCATE_CACHE_S` seconds."""
        self._handled: set[int] = set()
        """Rows handled and not yet deleted (the next sweep deletes them)."""
        self._host = socket.gethostname()

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

    def unregister(self) -> None:
        def tx(conn: Connection) -> None:
            conn.execute(delete(presence).where(presence.c.replica_id == self.id))
            conn.execute(delete(mailbox).where(mailbox.c.target == self.id))
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
            conn.execute(delete(mailbox).where(mailbox.c.target.in_(ids)))
            conn.execute(delete(replicas).where(replicas.c.id.in_(ids)))

        self.db.write(tx)

    def prune(self, older_than: float = 60.0) -> int:
        """Drop mailbox rows for replicas that no longer exist (sent after they died)."""
        cutoff = now_ms() - int(older_than * 1000)
        return int(
            self.db.write(
                lambda c: (
                    c.execute(
                        delete(mailbox).where(
                            (mailbox.c.created_at < cutoff)
                            & mailbox.c.target.not_in(select(replicas.c.id))
                        )
                    ).rowcount
                )
            )
        )

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
        ``default``, else the most recently connected), or None."""
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
        return found[-1]

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

    # ------------------------------------------------------------------ the mailbox

    def post(self, target: str, kind: str, body: dict[str, Any]) -> int:
        """Queue a frame for replica ``target``: a row plus ``NOTIFY kx_<target>`` (its id), in
        one statement and one transaction: the notification goes out at commit, when the row is
        there to read."""
        payload = json.dumps(body, separators=(",", ":"))
        values = {"target": target, "kind": kind, "body": payload, "created_at": now_ms()}

        def tx(conn: Connection) -> int:
            if not self.notify:
                return int(
                    conn.execute(
                        insert(mailbox).values(values).returning(mailbox.c.id)
                    ).scalar_one()
                )
            inline = f" {kind} {payload}"
            if len(inline.encode()) > INLINE_MAX:
                inline = ""  # too large: the notification names the row only
            row_id = conn.execute(
                _POST, {**values, "channel": f"kx_{target}", "inline": inline}
            ).scalar_one()  # fmt: skip
            return int(row_id)

        return self.db.write(tx)

    async def send(self, target: str, kind: str, body: dict[str, Any]) -> None:
        await asyncio.to_thread(self.post, target, kind, body)

    def _take(self, skip: list[int]) -> list[Any]:
        query = (
            select(mailbox.c.id, mailbox.c.kind, mailbox.c.body)
            .where(mailbox.c.target == self.id)
            .order_by(mailbox.c.id)
            .limit(BATCH)
        )
        if skip:
            query = query.where(mailbox.c.id.not_in(skip))
        return self.db.read(lambda c: list(c.execute(query)))

    def _done(self, ids: list[int]) -> None:
        self.db.write(lambda c: c.execute(delete(mailbox).where(mailbox.c.id.in_(ids))))

    async def drain(self, *, sweeping: bool = False) -> int:
        """Handle every row waiting for this replica, oldest first. A handled row is deleted by
        the next sweep (off the delivery path) and skipped until then; one that a crash left
        undeleted is handed over again (at least once), or pruned with its dead replica."""
        handled = 0
        async with self._drain_lock:
            if sweeping and self._handled:
                done = sorted(self._handled)
                await asyncio.to_thread(self._done, done)
                self._handled.difference_update(done)
            while True:
                rows = await asyncio.to_thread(self._take, sorted(self._handled))
                if not rows:
                    return handled
                for row in rows:
                    await self._handle(row.id, row.kind, row.body)
                handled += len(rows)
                self.delivered += len(rows)
                if sweeping:
                    self.swept += len(rows)
                if len(self._handled) >= BATCH:
                    done = sorted(self._handled)
                    await asyncio.to_thread(self._done, done)
                    self._handled.difference_update(done)
                if len(rows) < BATCH:
                    return handled

    async def _handle(self, row_id: int, kind: str, raw: str) -> None:
        handler = self.handlers.get(kind)
        try:
            body = json.loads(raw)
            if handler is None:
                log.warning("mailbox row %s: no handler for %r", row_id, kind)
            else:
                await handler(body)
        except Exception:
            log.exception("mailbox row %s (%s) failed; dropped", row_id, kind)
        self._handled.add(row_id)

    async def notified(self, payload: str) -> None:
        """A notification: ``"<row id>"``, or ``"<row id> <kind> <body>"`` for a frame small
        enough to ride in it (handled at once, unless the sweep got to its row first)."""
        head, _, rest = payload.partition(" ")
        kind, _, raw = rest.partition(" ")
        if not raw or not (head.isascii() and head.isdigit()):
            await self.drain()
            return
        async with self._drain_lock:
            row_id = int(head)
            if row_id in self._handled:
                return
            await self._handle(row_id, kind, raw)
            self.delivered += 1

    def pending(self) -> int:
        """Rows waiting in this replica's mailbox (not yet handled)."""
        query = select(func.count()).select_from(mailbox).where(mailbox.c.target == self.id)
        if self._handled:
            query = query.where(mailbox.c.id.not_in(sorted(self._handled)))
        return int(self.db.read(lambda c: c.execute(query).scalar_one()))

    # ------------------------------------------------------------------ background

    async def sweep_forever(self, every: float = SWEEP_S) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.drain(sweeping=True)
            except Exception:
                log.exception("the mailbox sweep failed; it runs again in %gs", every)

    async def listen_forever(self) -> None:
        """The replica's one LISTEN connection; on any failure, connect again (and drain: what
        was notified while it was down is in the rows)."""
        if not self.notify:
            return
        import psycopg

        conninfo = self.db.engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    conninfo, autocommit=True, application_name=f"kyronix-listen-{self.id}"
                )
                async with conn:
                    await conn.execute(f'LISTEN "{self.channel}"'.encode())
                    await self.drain()  # what came before LISTEN took effect
                    async for note in conn.notifies():
                        await self.notified(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "replica %s: the LISTEN connection failed (%s); connecting again",
                    self.id,
                    type(exc).__name__,
                )
            await asyncio.sleep(0.5)
