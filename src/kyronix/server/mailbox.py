"""The cluster's mailbox (``kx_mailbox``): frames for another replica, through the database.

A frame for another replica is a durable row plus ``NOTIFY kx_<replica>`` carrying the row's id,
in one statement. NOTIFY payloads are capped at 8000 bytes and KML is larger, so the row is the
frame; one that fits (under :data:`INLINE_MAX`) also rides in the notification, and the target
handles it without reading the row. Each replica has one dedicated LISTEN connection (outside the
pool: psycopg deadlocks a connection that is iterating ``notifies()`` if you query on it) and a
sweep every :data:`SWEEP_S` seconds that delivers whatever a missed notification left. A row is
deleted after its handler ran (by the next sweep, off the delivery path): delivery is **at least
once**, and the receivers make a repeat harmless (the executer's receipts, keyed by
``executionId``).

``notify=False`` (``KYRONIX_NOTIFY=0``) delivers by the sweep alone: for a pooler in transaction
mode (PgBouncer), where LISTEN does not work.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, text

from kyronix.errors import KyronixUsageError
from kyronix.server.db import Database, mailbox, now_ms

__all__ = [
    "BATCH",
    "INLINE_MAX",
    "SWEEP_S",
    "Handler",
    "Mailbox",
    "drop_mailboxes",
    "drop_orphaned",
    "post",
]

log = logging.getLogger("kyronix.server")

SWEEP_S = 1.0
"""Seconds between two sweeps of a replica's mailbox (what a missed NOTIFY left is late by at
most this)."""
BATCH = 200
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


def post(conn: Connection, target: str, kind: str, body: dict[str, Any], *, notify: bool) -> int:
    """Queue a frame for replica ``target`` in the caller's transaction (with its NOTIFY when
    ``notify``, on PostgreSQL): the row's id."""
    payload = json.dumps(body, separators=(",", ":"))
    values = {"target": target, "kind": kind, "body": payload, "created_at": now_ms()}
    if not notify:
        return int(
            conn.execute(insert(mailbox).values(values).returning(mailbox.c.id)).scalar_one()
        )
    inline = f" {kind} {payload}"
    if len(inline.encode()) > INLINE_MAX:
        inline = ""  # too large: the notification names the row only
    row_id = conn.execute(_POST, {**values, "channel": f"kx_{target}", "inline": inline})
    return int(row_id.scalar_one())


def drop_mailboxes(conn: Connection, targets: list[str]) -> None:
    """Delete every row for these replicas (they stopped, or died)."""
    conn.execute(delete(mailbox).where(mailbox.c.target.in_(targets)))


def drop_orphaned(conn: Connection, live: Any, before: int) -> int:
    """Delete the rows older than ``before`` (unix ms) for replicas not in ``live`` (a subquery
    of replica ids): frames sent to a replica after it died. How many."""
    gone = conn.execute(
        delete(mailbox).where((mailbox.c.created_at < before) & mailbox.c.target.not_in(live))
    )
    return int(gone.rowcount)


class Mailbox:
    """One replica's mailbox: what it posts to others, and what others posted to it."""

    def __init__(self, db: Database, replica_id: str, *, notify: bool = True) -> None:
        self.db = db
        self.id = replica_id
        self.notify = notify and not db.is_sqlite
        self.channel = f"kx_{replica_id}"
        self.handlers: dict[str, Handler] = {}
        self.delivered = 0
        """Rows handled by this replica (by notification or by the sweep)."""
        self.swept = 0
        """Of those, rows the sweep found (their notification was missed or never sent)."""
        self._drain_lock = asyncio.Lock()
        self._handled: set[int] = set()
        """Rows handled and not yet deleted (the next sweep deletes them)."""

    def on(self, kind: str, handler: Handler) -> None:
        """Handle the rows of ``kind`` with ``handler`` (one handler a kind)."""
        if kind in self.handlers:
            raise KyronixUsageError(f"the mailbox kind {kind!r} already has a handler")
        self.handlers[kind] = handler

    def post(self, target: str, kind: str, body: dict[str, Any]) -> int:
        """Queue a frame for replica ``target``: a row plus ``NOTIFY kx_<target>`` (its id), in
        one statement and one transaction: the notification goes out at commit, when the row is
        there to read."""
        return self.db.write(lambda conn: post(conn, target, kind, body, notify=self.notify))

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
