"""``create_app(config)``: the application, composed. Nothing imports this module but the entry
points (``kyronix serve``, tests, benchmarks).

The parts, bottom up (docs/server.md has the floor plan): the database and its migrations, the
session store, the model, the cluster (PostgreSQL: several replicas), the kiso session pool, the
results recorder, the relay, the runs, the key check; then the routes: the API (``/api``,
FastAPI, every route a :class:`~kyronix.server.state.GuardedRoute`), the tunnel (``/ws``) and
the dashboard, a sub-application of its own (HTML pages, its own error handlers and middleware)
attached at its paths.

At start (the lifespan): migrations (refusing a newer database), the runs a stopped server left
(taken over: settled or resumed), the periodic sweeps. At shutdown: running runs get until the
drain deadline to finish; the rest are recorded interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.routing import Route

from kiso.kernel import SessionStore
from kyronix.server import accounts, api, dashboard, ws
from kyronix.server.config import ServerConfig, ensure_home
from kyronix.server.db import Database
from kyronix.server.ratelimit import FailureThrottle, RateLimiter
from kyronix.server.relay import Relay, watch
from kyronix.server.runs.pool import SessionPool
from kyronix.server.runs.results import ResultsRecorder
from kyronix.server.runs.service import Runs
from kyronix.server.state import AppState, install_errors
from kyronix.server.tasks import Background

__all__ = ["create_app", "make_session_store"]

log = logging.getLogger("kyronix.server")


def make_session_store(db: Database) -> SessionStore:
    """Where Kyronix sessions' kiso logs go: the server's own database, through the kernel's
    SQL store (``JsonlSessionStore(config.sessions_dir)`` is the file-based alternative)."""
    from kiso.kernel.sql import SqlSessionStore

    return SqlSessionStore(db.engine)


def create_app(
    config: ServerConfig,
    *,
    store: SessionStore | None = None,
    migrate: bool = True,
) -> FastAPI:
    """The application. Opening the database and migrating happen here, not at import."""
    from kyronix.server.migrations import migrate as run_migrations
    from kyronix.server.models import choose_model

    ensure_home(config.home)
    db = Database(config.database_url)
    if migrate:
        run_migrations(db)
    config.sessions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    sessions = store if store is not None else make_session_store(db)
    secret = accounts.load_secret(config.home, config.key_secret)
    cluster = None
    if not db.is_sqlite:  # PostgreSQL: any number of replicas on the one database
        from kyronix.server.cluster import Cluster

        cluster = Cluster(
            db, f"srv_{secrets.token_hex(6)}", timeout=config.replica_timeout, notify=config.notify
        )
    pool = SessionPool(sessions, config.sessions_dir, cluster=cluster)
    id_key = hmac.new(secret, b"kyronix tunnel ids", hashlib.sha256).digest()
    recorder = ResultsRecorder(db, pool, id_key=id_key, cluster=cluster)
    relay = Relay(
        on_results=recorder.record, cluster=cluster, limits=config.tunnel,
        revoked=lambda keys: db.read(lambda c: accounts.revoked_among(c, keys)),
    )  # fmt: skip
    runs = Runs(
        config, db, sessions, choose_model(config), relay=relay, pool=pool, recorder=recorder,
        id_key=id_key, cluster=cluster,
    )  # fmt: skip
    background = Background("a background write")
    limiter = RateLimiter(config.rate_per_minute, config.rate_burst)
    failures = FailureThrottle(config.auth_failures_per_minute, config.auth_failure_burst)
    keys = accounts.KeyCheck(db, secret, limiter, failures, background.in_thread)
    state = AppState(
        config=config, db=db, store=sessions, runs=runs, relay=relay, keys=keys, secret=secret,
        background=background,
    )  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[Any]] = []
        if cluster is not None:  # registered before the first run: nobody takes its runs
            await asyncio.to_thread(cluster.register)
            tasks.append(loop.create_task(cluster.listen_forever()))
            tasks.append(loop.create_task(cluster.sweep_forever()))
            tasks.append(loop.create_task(cluster.heartbeat_forever()))
            tasks.append(loop.create_task(watch.replicas_forever(relay)))
            log.info("replica %s of the database's servers", cluster.id)
        tasks += await runs.startup()
        tasks.append(loop.create_task(watch.heartbeats_forever(relay)))
        tasks.append(loop.create_task(watch.revocations_forever(relay)))
        try:
            yield
        finally:
            state.begin_drain()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            left = max(0.0, (state.drain_deadline or time.monotonic()) - time.monotonic())
            await runs.shutdown(left)
            await relay.close()
            await asyncio.to_thread(runs.close_idle)
            await state.background.close()
            if cluster is not None:  # a clean stop: nothing of this replica is left to take over
                await asyncio.to_thread(cluster.unregister)
            db.close()

    app = FastAPI(
        title="Kyronix",
        version="1",
        summary="The Kyronix platform API: agents, custom agents, sessions, streaming runs.",
        lifespan=lifespan,
    )
    app.state.kx = state
    install_errors(app)
    pages = dashboard.create_app(state)
    for path in dashboard.PATHS:  # the dashboard's own paths go to it, whole
        app.router.routes.append(Route(path, pages, include_in_schema=False))
    app.include_router(api.router)
    api.install_health(app)
    app.add_api_websocket_route("/ws", ws.websocket_endpoint)
    if config.cors:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors),
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"],
        )
    return app
