"""Runs nobody is running any more: taken over, and settled or resumed.

At start (:meth:`Recovery.at_start`) and, with several replicas, at every heartbeat
(:meth:`Recovery.watch_replicas_forever`), this replica claims every ``running`` run whose
server is not alive, in one statement (a run goes to exactly one replica). Then:

* a plan run is recorded **interrupted** (its hold released, its idempotency key freed: the
  client never got an answer, so a retry runs it);
* a server-driven run (``"execute": "tunnel"``) is **resumed** from its session log: it sends
  its tool requests again with the same ids, and the executer's receipts answer them.

Holds never settled (a run that died with its task) expire and :meth:`Recovery.sweep_forever`
settles them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kyronix.server import billing, custom_agents
from kyronix.server.config import ServerConfig
from kyronix.server.db import Database, now_ms
from kyronix.server.errors import ApiError
from kyronix.server.runs import records
from kyronix.server.runs.drive import Driver
from kyronix.server.runs.handle import LiveRuns, RunHandle, RunRequest
from kyronix.server.runs.settle import Settlement

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster

__all__ = ["Recovery"]

log = logging.getLogger("kyronix.server")


class Recovery:
    def __init__(
        self,
        config: ServerConfig,
        db: Database,
        *,
        owner: str,
        settlement: Settlement,
        driver: Driver,
        live: LiveRuns,
        cluster: Cluster | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.owner = owner
        self.settlement = settlement
        self.driver = driver
        self.live = live
        self.cluster = cluster

    def at_start(self) -> tuple[int, list[Any]]:
        """At start: take over the runs no live server runs (with one server, every run still
        ``running``: its server was killed). Returns (interrupted, to resume)."""
        stale, resumable = self.take_over(why="server restart")
        self.sweep_holds(live={r.id for r in resumable})
        return stale, resumable

    def take_over(self, *, why: str = "its server stopped") -> tuple[int, list[Any]]:
        """Claim every ``running`` run whose server is not alive, then interrupt the plan runs;
        the server-driven ones are returned, to be resumed. Returns (interrupted, to resume)."""
        live: Any
        dead: list[str] = []
        if self.cluster is None:
            live = {self.owner}
        else:
            _, dead = self.cluster.liveness()
            live = self.cluster.alive_query(dead)  # a replica registers before its first run
        claimed = self.db.write(lambda c: records.claim_orphans(c, self.owner, live))
        if self.cluster is not None and dead:
            self.cluster.forget(dead)
        resumable = [r for r in claimed if r.mode == "tunnel"]
        for row in claimed:
            if row not in resumable:
                self._interrupt(row.id, why)
        if claimed:
            log.info("took over %d run(s) left by a stopped server (%s)", len(claimed), why)
        return len(claimed) - len(resumable), resumable

    async def resume(self, rows: list[Any]) -> None:
        """Carry on the server-driven runs a stopped server left running: each resumes from its
        session's log and sends its tool requests again, with the same ids. One that cannot be
        resumed (its custom agent was deleted meanwhile) is recorded interrupted: it never holds
        up the others, nor the server's start."""
        for row in rows:
            try:
                persona = await asyncio.to_thread(
                    self.db.read,
                    lambda c, r=row: custom_agents.persona_of(
                        c, r.project_id, r.agent, r.custom_agent_id
                    ),
                )
            except ApiError as exc:
                log.warning("run %s cannot be resumed: %s", row.id, exc.message)
                await asyncio.to_thread(self._interrupt, row.id, exc.message)
                continue
            req = RunRequest(
                project_id=row.project_id, agent=row.agent, input=row.input or "",
                session_id=row.session_id, custom_agent_id=row.custom_agent_id,
                execute="tunnel",
            )  # fmt: skip
            handle = RunHandle(row.id, row.session_id, row.project_id)
            self.driver.launch(handle, persona, req, resume=True)
            log.info("run %s resumed from its session log (server-driven)", handle.id)

    async def watch_replicas_forever(self) -> None:
        """With several replicas: take over the runs of any that died; each beat."""
        assert self.cluster is not None
        beat = self.cluster.beat
        while True:
            await asyncio.sleep(beat)
            try:
                _, resumable = await asyncio.to_thread(self.take_over, why="replica lost")
                if resumable:
                    await self.resume(resumable)
            except Exception:
                log.exception("taking over a lost replica's runs failed; again in %gs", beat)

    def sweep_holds(self, live: set[str]) -> int:
        """Settle the holds that expired: their runs are interrupted (unless running here, or
        on another replica: theirs to sweep)."""
        expired = self.db.read(lambda c: billing.expired_holds(c, now_ms()))
        if self.cluster is not None and expired:
            live = live | self.db.read(lambda c: records.running_elsewhere(c, expired, self.owner))
        count = 0
        for run_id in expired:
            if run_id in live:
                continue
            if self._interrupt(run_id, "hold expired"):
                self.settlement.release_expired(run_id)
                count += 1
        return count

    def _interrupt(self, run_id: str, why: str) -> bool:
        """Record the run interrupted; a failure is logged (the next sweep tries again), never
        in the way of the other runs or of the server's start."""
        try:
            self.settlement.interrupt(run_id, why)
        except Exception as exc:
            log.warning("run %s could not be recorded interrupted yet (%s)", run_id,
                        type(exc).__name__)  # fmt: skip
            return False
        return True

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            try:
                await asyncio.to_thread(self.sweep_holds, self.live.running_ids())
            except Exception:
                log.exception("the hold sweep failed; it runs again later")
