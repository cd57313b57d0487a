"""The application's state, and what the API's routes depend on (like a FastAPI app's
``deps``): the caller, the guards, the errors.

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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from kiso.kernel import SessionStore, StoreError
from kyronix.server import accounts
from kyronix.server.config import ServerConfig
from kyronix.server.db import Database
from kyronix.server.errors import ApiError, error_body, is_storage_failure, storage_unavailable
from kyronix.server.ratelimit import retry_after
from kyronix.server.relay import Relay
from kyronix.server.runs.service import Runs
from kyronix.server.tasks import Background

__all__ = [
    "AppState",
    "Auth",
    "GuardedRoute",
    "Principal",
    "app_state",
    "install_errors",
    "principal",
]

log = logging.getLogger("kyronix.server")

ANSWER_MARGIN_S = 1.0
"""Of the drain, what is kept for answering the clients of the runs it interrupts."""


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
    background: Background = field(default_factory=Background)

    def begin_drain(self) -> None:
        """Stop taking work: new requests get 503, the running runs get ``drainTimeout``
        seconds, less :data:`ANSWER_MARGIN_S`, then are interrupted. That margin is for their
        waiting clients to get the answer (503 ``run_interrupted``) while the HTTP server still
        waits for them: past ``drainTimeout`` it cancels what is left mid-answer."""
        if self.draining:
            return
        self.draining = True
        self.drain_deadline = time.monotonic() + self.config.drain_timeout
        log.info("draining: new requests get 503; running turns get %gs", self.config.drain_timeout)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # called off the loop: the lifespan's shutdown drains the runs
            return
        budget = max(0.0, self.config.drain_timeout - ANSWER_MARGIN_S)
        self.background.spawn(self.runs.live.drain(budget))


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
    known = getattr(request.state, "principal", None)
    if isinstance(known, Principal):  # checked already, before the body was read
        return known
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


def _needs_key(dependant: Dependant) -> bool:
    return any(d.call is principal or _needs_key(d) for d in dependant.dependencies)


class GuardedRoute(APIRoute):
    """An API route behind the drain guard, the key check and the body limit (JSON errors). A
    route that takes an API key checks it before it reads the body: nobody without a key makes
    the server read a byte of one."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        keyed = _needs_key(self.dependant)

        async def guarded(request: Request) -> Response:
            state = app_state(request)
            if state.draining:
                return _error(
                    503,
                    "draining",
                    "the server is shutting down; retry on another server or shortly",
                )
            if request.method in ("POST", "PUT", "PATCH", "DELETE"):
                if keyed:
                    try:
                        request.state.principal = await principal(
                            request, request.headers.get("authorization")
                        )
                    except ApiError as exc:
                        headers = {**exc.headers, "connection": "close"}  # the body is unread
                        return JSONResponse(exc.body, status_code=exc.status, headers=headers)
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


# --------------------------------------------------------------------------- the errors


def install_errors(app: FastAPI) -> None:
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
        first = errors[0] if errors else {"loc": [], "msg": "invalid request", "type": ""}
        if first["type"] == "json_invalid":  # say what is wrong, not where pydantic put it
            raw = exc.errors()[0]
            why = str((raw.get("ctx") or {}).get("error", "malformed"))
            at = raw.get("loc", ("body", 0))[-1]
            message = f"the body is not valid JSON ({why} at character {at}): send a JSON object"
        else:
            where = ".".join(first["loc"]) or "the request"
            message = f"{where}: {first['msg']}"
        body = error_body("invalid_request", message, {"errors": errors})
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
