"""``create_app(config)``: the FastAPI application, its state, its guards.

The ASGI stack, outermost first: the drain guard (503 ``draining`` once shutdown began), the body
limit (413 past ``maxBody``, 1 MiB by default, whether or not a Content-Length was sent), CORS
(only when origins are configured), then FastAPI: its validation errors and HTTP errors are
reshaped into the one error body (400 for malformed JSON or wrong types, never a 500), and an
unexpected exception is a 500 ``internal_error`` whose body names no file, line or value.

At start (the lifespan): migrations (refusing a newer database), the start sweep (every run left
``running`` by a dead server is recorded interrupted and its hold released), and the periodic
hold sweep. At shutdown: running runs get until the drain deadline to finish; the rest are
recorded interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from kiso.kernel import SessionStore
from kyronix.server import tunnel
from kyronix.server.accounts import load_secret
from kyronix.server.config import ServerConfig, ensure_home
from kyronix.server.db import Database
from kyronix.server.errors import ApiError, error_body
from kyronix.server.ratelimit import RateLimiter
from kyronix.server.runs import RunManager
from kyronix.server.tunnel import Relay

__all__ = ["AppState", "create_app", "make_session_store"]

log = logging.getLogger("kyronix.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def make_session_store(config: ServerConfig, db: Database) -> SessionStore:
    """Where Kyronix sessions' kiso logs go: the server's own database, through the kernel's
    SQL store (``JsonlSessionStore(config.sessions_dir)`` is the file-based alternative)."""
    from kiso.kernel.sql import SqlSessionStore

    return SqlSessionStore(db.engine)


@dataclass
class AppState:
    config: ServerConfig
    db: Database
    store: SessionStore
    manager: RunManager
    secret: bytes
    limiter: RateLimiter
    draining: bool = False
    drain_deadline: float | None = None
    key_touched: dict[str, int] = field(default_factory=dict)
    relay: Relay = field(default_factory=Relay)
    background: set[asyncio.Task[Any]] = field(default_factory=set)

    def begin_drain(self) -> None:
        if not self.draining:
            self.draining = True
            self.drain_deadline = time.monotonic() + self.config.drain_timeout
            log.info(
                "draining: new requests get 503; running turns get %gs", self.config.drain_timeout
            )

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def _guards(app: ASGIApp, state_of: Callable[[], AppState | None], max_body: int) -> ASGIApp:
    """The drain guard and the body limit, as one pure ASGI middleware."""

    async def send_error(send: Send, status: int, body: dict[str, Any], path: str = "") -> None:
        import json

        kind = b"application/json"
        payload = json.dumps(body).encode()
        extra: list[tuple[bytes, bytes]] = []
        if _is_page(path):  # a browser's form: the error as a page
            from kyronix.server.dashboard.web import PAGE_HEADERS, error_html

            kind = b"text/html; charset=utf-8"
            said = body["error"]["message"]
            payload = error_html(status, "Too large", f"{said}; nothing was changed").encode()
            extra = [(k.encode(), v.encode()) for k, v in PAGE_HEADERS.items()]
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", kind),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        state = state_of()
        if state is not None and state.draining and scope["path"].startswith("/api"):
            await send_error(
                send,
                503,
                error_body(
                    "draining", "the server is shutting down; retry on another server or shortly"
                ),
            )
            return
        too_large = error_body(
            "payload_too_large",
            f"the request body is over the limit of {max_body} bytes",
            {"limit": max_body},
        )
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > max_body:
                    await send_error(send, 413, too_large, scope["path"])
                    return
        if scope.get("method") in ("POST", "PUT", "PATCH", "DELETE"):
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body = message.get("body", b"")
                size += len(body)
                if size > max_body:
                    await send_error(send, 413, too_large, scope["path"])
                    return
                chunks.append(body)
                if not message.get("more_body", False):
                    break
            buffered = b"".join(chunks)
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": buffered, "more_body": False}
                return await receive()

            await app(scope, replay, send)
            return
        await app(scope, receive, send)

    return guarded


_PAGES = ("/dashboard", "/signin", "/api/auth")


def _is_page(path: str) -> bool:
    return path.startswith(_PAGES)


def create_app(
    config: ServerConfig,
    *,
    store: SessionStore | None = None,
    migrate: bool = True,
) -> FastAPI:
    """The application. Opening the database and migrating happen here, not at import."""
    from kyronix.server import api
    from kyronix.server.migrations import migrate as run_migrations
    from kyronix.server.models import choose_model

    ensure_home(config.home)
    db = Database(config.database_url)
    if migrate:
        run_migrations(db)
    config.sessions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    sessions = store if store is not None else make_session_store(config, db)
    models = choose_model(config)
    cluster = None
    if not db.is_sqlite:  # PostgreSQL: any number of replicas on the one database
        from kyronix.server.cluster import Cluster

        cluster = Cluster(
            db,
            f"srv_{secrets.token_hex(6)}",
            timeout=config.replica_timeout,
            notify=config.notify,
        )
    state = AppState(
        config=config,
        db=db,
        store=sessions,
        manager=RunManager(config, db, sessions, models, cluster=cluster),
        secret=load_secret(config.home, config.key_secret),
        limiter=RateLimiter(config.rate_per_minute, config.rate_burst),
    )
    state.relay = tunnel.Relay(on_results=state.manager.record_results, cluster=cluster)
    state.manager.relay = state.relay
    if cluster is not None:
        cluster.handlers["record"] = state.manager._remote_record
        cluster.handlers["release"] = state.manager._remote_release

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[Any]] = []
        if cluster is not None:  # registered before the first run: nobody takes its runs
            await asyncio.to_thread(cluster.register)
            tasks.append(loop.create_task(cluster.listen_forever()))
            tasks.append(loop.create_task(cluster.sweep_forever()))
            log.info("replica %s of the database's servers", cluster.id)
        stale, resumable = await asyncio.to_thread(state.manager.sweep_at_start)
        if stale:
            log.info("start sweep: %d run(s) left by a stopped server recorded interrupted", stale)
        await state.manager.resume_tunnel_runs(resumable)
        tasks.append(loop.create_task(state.manager.sweep_forever()))
        tasks.append(loop.create_task(tunnel.heartbeat_forever(state.relay)))
        if cluster is not None:
            tasks.append(loop.create_task(state.manager.watch_replicas_forever()))
        try:
            yield
        finally:
            state.begin_drain()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            left = max(0.0, (state.drain_deadline or time.monotonic()) - time.monotonic())
            await state.manager.drain(left)
            await state.relay.close()
            await asyncio.to_thread(state.manager.close_idle)
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

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _json(exc.status, exc.body, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for err in exc.errors()[:20]:
            errors.append(
                {
                    "loc": [str(p) for p in err.get("loc", ())],
                    "msg": str(err.get("msg", "")),
                    "type": str(err.get("type", "")),
                }
            )
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(first["loc"]) or "the request"
        return _json(
            400,
            error_body("invalid_request", f"{where}: {first['msg']}", {"errors": errors}),
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if _is_page(request.url.path):  # a browser's page: an HTML page, not a JSON body
            from kyronix.server.dashboard.web import error_page

            titles = {404: "Not found", 405: "Not allowed"}
            title = titles.get(exc.status_code, "Refused")
            said = "there is no such page" if exc.status_code == 404 else str(exc.detail)
            return error_page(request, exc.status_code, title, said)
        codes = {404: "not_found", 405: "method_not_allowed"}
        code = codes.get(exc.status_code, "http_error")
        message = str(exc.detail) if exc.detail else code
        return _json(exc.status_code, error_body(code, message), dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        log.error("unexpected %s while serving a request", type(exc).__name__)
        if _is_page(request.url.path):
            from kyronix.server.dashboard.web import error_page

            return error_page(request, 500, "Something failed", "the server failed; a bug")
        return _json(500, error_body("internal_error", "the server failed; this is a bug"))

    api.install(app)
    from kyronix.server import dashboard

    dashboard.install(app, state)
    app.add_api_websocket_route("/ws", tunnel.websocket_endpoint)
    if config.cors:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors),
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"],
        )
    inner = app.build_middleware_stack

    def build() -> Any:
        return _guards(inner(), lambda: state, config.max_body)

    app.build_middleware_stack = build  # type: ignore[method-assign]
    return app
