"""The runs of one server: wiring over the steps of a run (docs/server.md has the floor plan).

=================  ====================================================================
:mod:`.admit`      one write transaction: idempotency, session, persona, hold, the row
:mod:`.drive`      one driver over the run's event stream; :mod:`.plan` or :mod:`.tunnel`
:mod:`.settle`     the charge, the row, the session freed (fenced); or interrupted
:mod:`.recover`    runs of stopped servers taken over; expired holds swept
:mod:`.results`    an executer's answer recorded in the session that issued the plan
:mod:`.pool`       kiso sessions kept open between their runs
:mod:`.follow`     a run another replica runs, followed to its end
:mod:`.records`    the ``kx_runs`` and ``kx_executions`` rows
=================  ====================================================================

A run's input goes into a **kiso session** (the Kyronix session's id is the kiso session's
id), and the session's run produces the answer. Runs live outside requests: the HTTP request or
the SSE stream only watches a :class:`~.handle.RunHandle`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING, Any

from kiso.kernel import SessionStore
from kiso.kernel.sql import SqlSessionStore
from kyronix.server.config import ServerConfig
from kyronix.server.db import Database
from kyronix.server.errors import ApiError, not_found
from kyronix.server.models import ModelChoice
from kyronix.server.relay import Relay
from kyronix.server.runs import records
from kyronix.server.runs.admit import Admission, RunningElsewhere
from kyronix.server.runs.drive import Driver
from kyronix.server.runs.follow import Follower
from kyronix.server.runs.handle import LiveRuns, RunHandle, RunRequest
from kyronix.server.runs.plan import PlanMode
from kyronix.server.runs.pool import IDLE_S, SessionPool
from kyronix.server.runs.recover import Recovery
from kyronix.server.runs.results import ResultsRecorder
from kyronix.server.runs.settle import Settlement
from kyronix.server.runs.tunnel import TunnelMode

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster

__all__ = ["Runs"]

log = logging.getLogger("kyronix.server")


class Runs:
    def __init__(
        self,
        config: ServerConfig,
        db: Database,
        store: SessionStore,
        models: ModelChoice,
        *,
        relay: Relay,
        pool: SessionPool,
        recorder: ResultsRecorder,
        id_key: bytes,
        cluster: Cluster | None = None,
        owner: str | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.models = models
        self.relay = relay
        self.pool = pool
        self.recorder = recorder
        self.cluster = cluster
        """Several replicas on one database (PostgreSQL): runs of a dead one are taken over."""
        self.owner = cluster.id if cluster is not None else owner or f"srv_{secrets.token_hex(6)}"
        in_tx = isinstance(store, SqlSessionStore) and store.engine is db.engine
        workspace = config.sessions_dir
        self.live = LiveRuns()
        self.settlement = Settlement(db, store, pool, self.owner, in_tx=in_tx)
        self.follower = Follower(db, self.live)
        modes: dict[str, Any] = {"store": store, "workspace": workspace}
        self.driver = Driver(
            config,
            pool=pool,
            settlement=self.settlement,
            recorder=recorder,
            live=self.live,
            follower=self.follower,
            plan=PlanMode(config, models, settlement=self.settlement, id_key=id_key, **modes),
            tunnel=TunnelMode(config, models, relay=relay, id_key=id_key, **modes),
        )
        hold = config.minimum_charge if models.scripted else config.hold
        self.admission = Admission(
            config, db, store, owner=self.owner, hold=hold, live=self.live,
            workspace=workspace, in_tx=in_tx,
        )  # fmt: skip
        self.recovery = Recovery(
            config, db, owner=self.owner, settlement=self.settlement, driver=self.driver,
            live=self.live, cluster=cluster,
        )  # fmt: skip

    async def start(self, req: RunRequest) -> tuple[RunHandle, bool]:
        """Admit the run and start it in the background; (handle, True if new). A tunnel run
        needs an executer connected, unless it is a keyed retry of a run that exists: that one
        answers (or waits for) the run it names, connected or not."""
        if (
            req.execute == "tunnel"
            and not await self._is_retry(req)
            and await self.relay.reachable(req.project_id) == 0
        ):
            raise ApiError(
                409,
                "no_executer",
                "no executer of this project is connected to the tunnel; start one with "
                "`kyronix executer --ws URL --base DIR` (a key of this project), then send again",
            )
        try:
            handle, persona, new = await asyncio.to_thread(self.admission.admit, req)
        except RunningElsewhere as elsewhere:  # a keyed retry: wait for the run where it runs
            return self.follower.watch(elsewhere.row), False
        if new:
            assert persona is not None
            self.driver.launch(handle, persona, req)
            log.info("run %s started (project %s, agent %s)", handle.id, req.project_id, req.agent)
        return handle, new

    async def _is_retry(self, req: RunRequest) -> bool:
        if req.idem_key is None:
            return False
        key = req.idem_key
        row = await asyncio.to_thread(
            self.db.read, lambda c: records.by_idempotency_key(c, req.project_id, key)
        )
        return row is not None

    async def handle_of(self, project_id: str, run_id: str) -> RunHandle:
        """The run's handle (live here, followed on another replica, or finished): 404 for a run
        of another project."""
        live = self.live.get(run_id)
        if live is not None and live.project_id == project_id:
            return live
        row = await asyncio.to_thread(self.db.read, lambda c: records.get(c, run_id, project_id))
        if row is not None and row.status == "running" and self.cluster is not None:
            return self.follower.watch(row)  # running on another replica: follow it
        if row is None or row.status == "running":
            raise not_found("run", run_id)
        return RunHandle.from_row(row)

    @property
    def running(self) -> int:
        return self.live.running

    # -- the server's life -----------------------------------------------------------------

    async def startup(self) -> list[asyncio.Task[Any]]:
        """At start: the runs a stopped server left are taken over (settled or resumed); then
        the background loops (returned, for the caller to cancel at shutdown)."""
        stale, resumable = await asyncio.to_thread(self.recovery.at_start)
        if stale:
            log.info("start sweep: %d run(s) left by a stopped server recorded interrupted", stale)
        await self.recovery.resume(resumable)
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self.recovery.sweep_forever()),
            loop.create_task(self._tidy_forever()),
        ]
        if self.cluster is not None:
            tasks.append(loop.create_task(self.recovery.watch_replicas_forever()))
        return tasks

    async def _tidy_forever(self) -> None:
        """Close the kiso sessions idle too long; forget the handles of runs done long ago."""
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            try:
                await asyncio.to_thread(self.pool.close_idle, IDLE_S)
                self.live.forget_old()
            except Exception:
                log.exception("closing idle sessions failed; it runs again later")

    async def shutdown(self, timeout: float) -> None:
        """Let running runs finish for up to ``timeout`` seconds; the rest are interrupted."""
        if self.live.running:
            log.info("draining: waiting up to %gs for %d run(s)", timeout, self.live.running)
        await self.live.drain(timeout)
        await self.driver.close()
        await self.follower.close()

    def close_idle(self) -> int:
        """Close every kiso session kept open between runs (at shutdown)."""
        return self.pool.close_idle()
