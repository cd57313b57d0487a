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
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from kiso.kernel import SessionStore, StoreError
from kyronix.server import accounts, api, dashboard, ws
from kyronix.server.config import ServerConfig, ensure_home
from kyronix.server.db import Database
from kyronix.server.errors import ApiError, error_body, is_storage_failure, storage_unavailable
from kyronix.server.ratelimit import FailureThrottle, RateLimiter
from kyronix.server.relay import Relay
from kyronix.server.runs.pool import SessionPool
from kyronix.server.runs.results import ResultsRecorder
from kyronix.server.runs.service import Runs
from kyronix.server.state import AppState

__all__ = ["create_app", "make_session_store"]

log = logging.getLogger("kyronix.server")


def make_session_store(config: ServerConfig, db: Database) -> SessionStore:
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
    sessions = store if store is not None else make_session_store(config, db)
    secret = accounts.load_secret(config.home, config.key_secret)
    cluster = None
    if not db.is_sqlite:  # PostgreSQL: any number of replicas on the one database
        from kyronix.server.cluster import Cluster

        cluster = Cluster(
            db, f"srv_{secrets.token_hex(6)}", timeout=config.replica_timeout, notify=config.notify
        )
    pool = SessionPool(sessions, config.sessions_dir, cluster=cluster)
    recorder = ResultsRecorder(db, pool, cluster=cluster)
    relay = Relay(on_results=recorder.record, cluster=cluster, limits=config.tunnel)
    runs = Runs(
        config, db, sessions, choose_model(config), relay=relay, pool=pool, recorder=recorder,
        id_key=hmac.new(secret, b"kyronix tunnel ids", hashlib.sha256).digest(), cluster=cluster,
    )  # fmt: skip
    background: set[asyncio.Task[Any]] = set()

    def in_background(fn: Callable[[], object]) -> None:
        def quietly() -> None:  # best effort (a key's last use): never an unretrieved error
            try:
                fn()
            except Exception as exc:
                log.warning("a background write failed (%s)", type(exc).__name__)

        task = asyncio.ensure_future(asyncio.to_thread(quietly))
        background.add(task)
        task.add_done_callback(background.discard)

    limiter = RateLimiter(config.rate_per_minute, config.rate_burst)
    failures = FailureThrottle(config.auth_failures_per_minute, config.auth_failure_burst)
    keys = accounts.KeyCheck(db, secret, limiter, failures, in_background)
    if cluster is not None:  # a key revoked anywhere: its connections here close at once

        async def revoked(body: dict[str, Any]) -> None:
            await relay.close_key(str(body["keyId"]), "the API key was revoked")

        cluster.on("revoked", revoked)
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
            log.info("replica %s of the database's servers", cluster.id)
        tasks += await runs.startup()
        tasks.append(loop.create_task(relay.heartbeat_forever()))
        tasks.append(loop.create_task(ws.watch_revocations(state)))
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
            if state.background:
                await asyncio.gather(*state.background, return_exceptions=True)
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
    _api_errors(app)
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


def _api_errors(app: FastAPI) -> None:
    """The API's errors as the one error body: 400 for malformed input (never a 500), the
    route's own :class:`ApiError`, and a bug as a 500 whose body names no file, line or
    value."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "loc": [str(p) for p in err.get("loc", ())],
                "msg": str(err.get("msg", "")),
                "type": str(err.get("type", "")),
            }
            for err in exc.errors()[:20]
        ]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(first["loc"]) or "the request"
        body = error_body("invalid_request", f"{where}: {first['msg']}", {"errors": errors})
        return JSONResponse(body, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> Response:
        codes = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}
        code = codes.get(exc.status_code, "http_error")
        message = str(exc.detail) if exc.detail else code
        return JSONResponse(
            error_body(code, message), status_code=exc.status_code, headers=dict(exc.headers or {})
        )

    async def _storage(request: Request, exc: Exception) -> Response:
        """A database that cannot write (its disk full or failing): the one clear 503, no
        traceback. (Handled here, by type: Starlette's catch-all would log a traceback.)"""
        if not is_storage_failure(exc):
            return await _bug(request, exc)
        log.error(
            "%s %s: the database cannot write (%s)", request.method, request.url.path,
            type(exc).__name__,
        )  # fmt: skip
        failed = storage_unavailable()
        return JSONResponse(failed.body, status_code=failed.status, headers=failed.headers)

    for kind in (OperationalError, StoreError, OSError):
        app.add_exception_handler(kind, _storage)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        log.error(
            "unexpected %s while serving %s %s",
            type(exc).__name__,
            request.method,
            request.url.path,
            exc_info=exc,
        )
        return JSONResponse(
            error_body("internal_error", "the server failed; this is a bug"), status_code=500
        )
