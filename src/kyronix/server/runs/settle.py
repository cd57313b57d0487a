"""Settling a run: its charge, its row, its session freed; or, cut short, recorded interrupted.

Every write that ends a run is **fenced** (:mod:`kyronix.server.runs.records`): it applies only
while the run is still ``running`` and still owned by this replica. A replica that lost a run
(it was paused past the replica timeout and another took the run over) finds its write refused
(:class:`RunLost`): its transaction rolls back, nothing is charged twice, and it stops working
on the run and says so in its log.

A successful run's charge is settled in the transaction of the batch that records its answer in
the session log (``SqlWriter.attach``), so the answer and its charge are durable together or not
at all; in a transaction of its own otherwise (a JSONL session store, a failed run).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from sqlalchemy import Connection

from kiso.kernel import (
    ModelRef,
    RunEnded,
    RunStarted,
    SessionLockedError,
    SessionNotFoundError,
    SessionStore,
    SessionWriter,
    SettingChanged,
    User,
    new_id,
    replay,
)
from kiso.kernel import (
    Outcome as RunOutcome,
)
from kiso.kernel.sql import SqlWriter
from kiso.runtime import Session
from kyronix.errors import KyronixError
from kyronix.server import billing, sessions
from kyronix.server.config import credits_text
from kyronix.server.db import Database
from kyronix.server.runs import records
from kyronix.server.runs.handle import RunHandle
from kyronix.server.runs.outcome import Outcome, interrupted_body, interrupted_record
from kyronix.server.runs.pool import SessionPool
from kyronix.server.sessions import RESULT_KEY

__all__ = ["RunLost", "Settlement", "end_open_run"]

log = logging.getLogger("kyronix.server")


class RunLost(KyronixError):
    """The run is no longer this replica's to finish (another took it over, or it ended)."""


class Settlement:
    def __init__(
        self, db: Database, store: SessionStore, pool: SessionPool, owner: str, *, in_tx: bool
    ) -> None:
        self.db = db
        self.store = store
        self.pool = pool
        self.owner = owner
        self.in_tx = in_tx
        """The session store is this database: a run's charge is settled in the transaction of
        the batch that records its answer."""

    # -- an outcome into the log -----------------------------------------------------------

    def stage(
        self, session: Session, outcome: Outcome, project_id: str, *, run: str | None = None
    ) -> None:
        """Stage the outcome's record in the run's kiso session (durable with the session's next
        batch: the turn's ``run_ended``, when ``run`` is that turn's run) and, on the SQL store,
        settle the run in that batch's transaction: the answer and its charge are durable
        together, or neither is."""
        record = outcome.record()
        if record is None:
            return
        value = (
            SettingChanged(key=RESULT_KEY, value=record, run=run)
            if run
            else SettingChanged(key=RESULT_KEY, value=record)
        )
        (staged,) = session.stage(value)
        outcome.staged = True
        writer = session.writer
        if self.in_tx and isinstance(writer, SqlWriter):
            writer.attach(functools.partial(self.settle_tx, outcome, project_id), seq=staged.seq)
            outcome.settle_seq = staged.seq

    def committed(self, session: Session, outcome: Outcome) -> None:
        """After the session's batches: whether the settle attached to one committed with it."""
        if outcome.settle_seq is not None:
            outcome.settled = session.writer.durable_seq >= outcome.settle_seq

    # -- an answer -------------------------------------------------------------------------

    def settle_tx(self, outcome: Outcome, project_id: str, conn: Connection) -> None:
        """The run's end in one transaction (the caller's): the charge or the release of its
        hold, its row (fenced: :class:`RunLost` rolls everything back), the session freed, and
        the plan's tool ids remembered as this session's."""
        left: int | None = None
        if outcome.cost is not None:
            left = billing.settle(conn, outcome.run_id, outcome.cost)
        else:
            note = outcome.error[0] if outcome.error is not None else None
            billing.release(conn, outcome.run_id, note=note)
        if outcome.ok:
            if left is None:  # settled before (a retry of this transaction)
                left = billing.balance(conn, project_id)
            outcome.credits_remaining = left
        done = records.finish(
            conn, outcome.run_id, self.owner,
            status="completed" if outcome.ok else "failed", http_status=outcome.http_status,
            body=outcome.body(), transcript=outcome.texts, cost=outcome.cost or 0,
            usage=outcome.usage,
        )  # fmt: skip
        if not done:
            raise RunLost(f"run {outcome.run_id} is no longer running on {self.owner}")
        sessions.free(conn, outcome.session_id, outcome.run_id)
        if outcome.ok and outcome.issues_ids:  # where the tunnel records their results
            records.record_issued(
                conn, outcome.execution_ids, project_id, outcome.session_id, outcome.run_id,
                key_id=outcome.key_id,
            )  # fmt: skip

    async def settle(self, handle: RunHandle, outcome: Outcome) -> None:
        """Settle the run (unless the batch that recorded its answer already did) and answer
        whoever watches it. Raises :class:`RunLost`."""
        if not outcome.settled:
            await asyncio.to_thread(
                self.db.write, functools.partial(self.settle_tx, outcome, handle.project_id)
            )
        handle.finish(outcome.http_status, outcome.body())
        cost = "nothing" if outcome.cost is None else f"{credits_text(outcome.cost)} credits"
        log.info("run %s finished %s (charged %s)", handle.id, outcome.http_status, cost)

    # -- cut short -------------------------------------------------------------------------

    def interrupt(self, run_id: str, why: str) -> bool:
        """Record a run as interrupted: its session log, its hold, its row (idempotent; fenced).
        False if it was not running here."""
        row = self.db.read(lambda c: records.get(c, run_id))
        if row is None or row.status != "running" or row.owner != self.owner:
            return False
        self._record_in_log(row.session_id, run_id, why, row.input or "")
        body = interrupted_body(run_id, why)

        def tx(conn: Connection) -> bool:
            if not records.interrupt(conn, run_id, self.owner, body):
                return False
            billing.release(conn, run_id, note=f"interrupted: {why}")
            sessions.free(conn, row.session_id, run_id)
            return True

        if not self.db.write(tx):
            return False
        log.info("run %s interrupted (%s); its hold was released", run_id, why)
        return True

    async def interrupt_handle(self, handle: RunHandle, why: str) -> None:
        """Interrupt the run and answer its watchers: 503 ``run_interrupted``, or, when it had
        finished first, what it answered."""
        cut = await asyncio.to_thread(self.interrupt, handle.id, why)
        if cut:
            handle.finish(503, interrupted_body(handle.id, why))
            return
        row = await asyncio.to_thread(self.db.read, lambda c: records.get(c, handle.id))
        if row is not None and row.status != "running":
            done = RunHandle.from_row(row)
            handle.finish(done.status or 500, done.body or {})

    def release_expired(self, run_id: str) -> bool:
        return bool(self.db.write(lambda c: billing.release(c, run_id, note="hold expired")))

    def _record_in_log(self, session_id: str, run_id: str, why: str, asked: str) -> None:
        """End the run's open kiso run (``error: interrupted``) and record the outcome. A run
        whose input never became durable (it is written with the model's turn) gets it back
        from its row, so the log shows what was asked and that it was interrupted."""

        def record(writer: SessionWriter) -> None:
            for ev in writer.events:
                if (
                    isinstance(ev, SettingChanged)
                    and ev.key == RESULT_KEY
                    and isinstance(ev.value, dict)
                    and ev.value.get("runId") == run_id
                ):
                    return
            if replay(writer.events).open_run is None and asked:
                kiso_run = new_id()
                writer.stage(
                    RunStarted(
                        run=kiso_run, trigger="api", model=ModelRef("kyronix", "none"),
                        mode="default",
                    ),
                    User(run=kiso_run, content=asked),
                )  # fmt: skip
            end_open_run(writer, run_id, f"the server stopped ({why})")
            writer.append(SettingChanged(key=RESULT_KEY, value=interrupted_record(run_id)))

        try:
            self.pool.write_closed(session_id, record)
        except SessionNotFoundError:
            return  # the run never reached its session: nothing to record there
        except SessionLockedError:
            log.warning(
                "could not open session %s to record run %s as interrupted", session_id, run_id
            )


def end_open_run(writer: Any, run_id: str, why: str) -> None:
    """Append ``run_ended`` (``error``, ``interrupted``) to the log's open kiso run, if any."""
    open_run = replay(writer.events).open_run
    if open_run is not None:
        writer.append(
            RunEnded(
                run=open_run,
                outcome=RunOutcome.error(
                    "interrupted", f"{why}; Kyronix run {run_id}", retryable=True
                ),
            )
        )
