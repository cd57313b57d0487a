"""The application's state, and what the routes depend on (like a FastAPI app's ``deps``).

:class:`AppState` holds the server's parts, made once by :func:`kyronix.server.app.create_app`:
the database, the session store, the runs, the relay, the key check. A route reaches it through
:func:`app_state`; an API route takes its caller through :data:`Auth` (the one key check,
:func:`kyronix.server.accounts.authenticate`), and every API route is a :class:`GuardedRoute`:
``503 draining`` once shutdown began, ``413 payload_too_large`` past ``maxBody`` (whether or not
a Content-Length was sent), before anything else reads the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from kiso.kernel import SessionStore
from kyronix.server import accounts
from kyronix.server.config import ServerConfig
from kyronix.server.db import Database
from kyronix.server.errors import ApiError, error_body
from kyronix.server.ratelimit import retry_after
from kyronix.server.relay import Relay
from kyronix.server.runs.service import Runs

__all__ = ["AppState", "Auth", "GuardedRoute", "Principal", "app_state", "principal"]

log = logging.getLogger("kyronix.server")


@dataclass
class AppState:
    config: ServerConfig
    db: Database
    store: SessionStore
    runs: Runs
    relay: Relay
    keys: accounts.KeyCheck
    secret: bytes
    draining: bool = False
    drain_deadline: float | None = None
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


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.kx
    return state


# --------------------------------------------------------------------------- the caller


@dataclass(frozen=True)
class Principal:
    project_id: str
    key_id: str


async def principal(
    request: Request,
    authorization: Annotated[
        str | None, Header(description="Bearer kyr_… (the project's API key)")
    ] = None,
) -> Principal:
    client = request.client.host if request.client is not None else None
    try:
        info = accounts.authenticate(
            app_state(request).keys, accounts.bearer(authorization), client
        )
    except accounts.KeyRefused as exc:
        if exc.retry_after is not None:
            raise ApiError(
                exc.status, exc.code, exc.message, {"retryAfter": float(f"{exc.retry_after:.3f}")},
                headers={"Retry-After": retry_after(exc.retry_after)},
            ) from None  # fmt: skip
        raise ApiError(
            exc.status, exc.code, exc.message, headers={"WWW-Authenticate": "Bearer"}
        ) from None
    return Principal(info.project_id, info.id)


Auth = Annotated[Principal, Depends(principal)]


# --------------------------------------------------------------------------- the guards


class GuardedRoute(APIRoute):
    """An API route behind the drain guard and the body limit (JSON errors)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            state = app_state(request)
            if state.draining:
                return _error(
                    503,
                    "draining",
                    "the server is shutting down; retry on another server or shortly",
                )
            if request.method in ("POST", "PUT", "PATCH", "DELETE"):
                limit = state.config.max_body
                too_large = _error(
                    413,
                    "payload_too_large",
                    f"the request body is over the limit of {limit} bytes",
                    {"limit": limit},
                )
                declared = request.headers.get("content-length", "")
                if declared.isascii() and declared.isdigit() and int(declared) > limit:
                    return too_large
                body = bytearray()
                try:
                    async for chunk in request.stream():
                        body += chunk
                        if len(body) > limit:
                            return too_large
                except ClientDisconnect:  # nobody is left to answer
                    return _error(400, "invalid_request", "the client went away mid-request")
                request._body = bytes(body)  # read once, within the limit (FastAPI's own cache)
            return await handler(request)

        return guarded


def _error(
    status: int, code: str, message: str, details: dict[str, Any] | None = None
) -> JSONResponse:
    return JSONResponse(
        error_body(code, message, details), status_code=status, headers={"connection": "close"}
    )
