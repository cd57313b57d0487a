"""Admitting a run: one write transaction, before anything is called.

In it: the idempotency key (the same key and body answer the first run's result; another body is
422), the session (created when the request names none; ``session_busy`` when it has an active
run), the persona, the credit hold (``insufficient_credits`` before the model is called), the
``running`` row owned by this replica and, for a new session on the SQL store, the kiso log's
header and writer lease (``SqlSessionStore.create(connection=...)``): one transaction, not two
(docs/adr/0017-a-run-in-two-transactions.md).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from sqlalchemy import Connection

from kiso.kernel import SessionStore
from kyronix.errors import KyronixError
from kyronix.server import billing, custom_agents, sessions
from kyronix.server.agents import Persona
from kyronix.server.config import ServerConfig, to_credits
from kyronix.server.db import Database
from kyronix.server.errors import ApiError, not_found
from kyronix.server.runs import records
from kyronix.server.runs.handle import LiveRuns, RunHandle, RunRequest

__all__ = ["Admission", "Admitted", "RunningElsewhere"]

Admitted = tuple[RunHandle, Persona | None, bool]
"""(the run's handle, the persona to run it with, True if it is new)."""


class RunningElsewhere(KyronixError):
    """A keyed retry names a run another replica is running: follow it there."""

    def __init__(self, row: Any) -> None:
        super().__init__(row.id)
        self.row = row


class Admission:
    def __init__(
        self,
        config: ServerConfig,
        db: Database,
        store: SessionStore,
        *,
        owner: str,
        hold: int,
        live: LiveRuns,
        workspace: Path,
        in_tx: bool,
    ) -> None:
        self.config = config
        self.db = db
        self.store = store
        self.owner = owner
        self.hold = hold
        """Millicredits held while a run goes."""
        self.live = live
        self.workspace = workspace
        self.in_tx = in_tx
        """New kiso sessions are created in the admission's transaction."""

    def admit(self, req: RunRequest) -> Admitted:
        made: list[RunHandle] = []

        def tx(conn: Connection) -> Admitted:
            out = self._admit(conn, req)
            made.append(out[0])
            return out

        try:
            return self.db.write(tx)
        except BaseException:
            for handle in made:  # the transaction rolled back: so did the session's creation
                if handle.writer is not None:
                    handle.writer.close()
            raise

    def _admit(self, conn: Connection, req: RunRequest) -> Admitted:
        if req.idem_key is not None:
            row = records.by_idempotency_key(conn, req.project_id, req.idem_key)
            if row is not None:
                if row.request_hash != req.request_hash:
                    raise ApiError(
                        422,
                        "idempotency_key_reused",
                        "this Idempotency-Key was used with a different request; use a new key "
                        "for a new request",
                        {"runId": row.id},
                    )
                return self._existing(row), None, False
        custom = req.custom_agent_id
        new_session = req.session_id is None
        if req.session_id is not None:
            srow = sessions.find(conn, req.project_id, req.session_id)
            if srow is None:
                raise not_found("session", req.session_id)
            if srow.active_run is not None:
                raise ApiError(
                    409,
                    "session_busy",
                    f"session {srow.id} is already running a request; wait for it to finish "
                    f"(or stream it) and send again",
                    {"sessionId": srow.id, "runId": srow.active_run},
                )
            if custom is None:
                custom = srow.custom_agent_id
        persona = custom_agents.persona_of(conn, req.project_id, req.agent, custom)
        run_id = f"run_{secrets.token_hex(12)}"
        self._reserve(conn, req.project_id, run_id)
        if new_session:
            session_id = sessions.create(conn, req.project_id, req.agent, custom, active_run=run_id)
        else:
            assert req.session_id is not None
            session_id = req.session_id
            if not sessions.claim(conn, session_id, run_id):
                raise ApiError(409, "session_busy", f"session {session_id} is busy")
        records.insert(
            conn, id=run_id, project_id=req.project_id, session_id=session_id, agent=req.agent,
            custom_agent_id=custom, idem_key=req.idem_key, request_hash=req.request_hash,
            owner=self.owner, input=req.input, mode=req.execute,
        )  # fmt: skip
        handle = RunHandle(run_id, session_id, req.project_id)
        if new_session and self.in_tx:
            # the kiso session commits with the admission: one transaction, not two
            handle.writer = self.store.create(  # type: ignore[call-arg]
                str(self.workspace), session_id=session_id, project=req.project_id,
                connection=conn,
            )  # fmt: skip
        return handle, persona, True

    def _reserve(self, conn: Connection, project_id: str, run_id: str) -> None:
        try:
            billing.reserve(conn, project_id, run_id, self.hold, int(self.config.hold_ttl * 1000))
        except billing.InsufficientCredits as exc:
            in_flight = exc.held > 0 and exc.available + exc.held >= exc.required
            message = (
                "not enough credits right now: the rest are held by runs in flight; retry when "
                "they finish"
                if in_flight
                else "this project is out of credits; grant more with `kyronix credits grant`"
            )
            raise ApiError(
                402,
                "insufficient_credits",
                message,
                {
                    "required": to_credits(exc.required),
                    "available": to_credits(exc.available),
                    "held": to_credits(exc.held),
                },
            ) from None

    def _existing(self, row: Any) -> RunHandle:
        """The run a keyed retry names: live here, or finished; :class:`RunningElsewhere` when
        another replica runs it (the caller follows it there)."""
        live = self.live.get(row.id)
        if live is not None:
            return live
        if row.status == "running":
            raise RunningElsewhere(row)
        return RunHandle.from_row(row)
