"""The Kyronix dashboard, served by ``kyronix serve`` on the same data as the API and the CLI.

Server-rendered pages (Jinja2; htmx vendored as a static file; no build step) under
``/dashboard``, GitHub sign-in at ``/api/auth`` (callback ``/api/auth/callback``), one-time
sign-in links at ``/signin/<token>``. docs/dashboard.md is the user's account.

It is an application of its own (:func:`create_app`), attached to the server's at
:data:`PATHS`: its own middleware (the signed session cookie, a body limit answered with a page)
and its own error handlers, so every answer it gives is a page, and nothing of the API's JSON
errors reaches a browser.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from kyronix.server.state import AppState

__all__ = ["PATHS", "create_app"]

PATHS = (
    "/dashboard",
    "/dashboard/{rest:path}",
    "/signin/{token}",
    "/api/auth",
    "/api/auth/callback",
)
"""Where the server hands a request to the dashboard (the paths unchanged)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def create_app(state: AppState) -> FastAPI:
    """The dashboard: its static files, the session cookie, the sign-in routes and the pages,
    with pages for its errors."""
    from fastapi import FastAPI, Request
    from starlette.exceptions import HTTPException
    from starlette.middleware.sessions import SessionMiddleware
    from starlette.responses import Response
    from starlette.staticfiles import StaticFiles

    from kyronix.server.dashboard import auth, pages
    from kyronix.server.dashboard.web import HERE, error_page, failure_page, session_settings

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.state.kx = state
    app.mount("/dashboard/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")
    app.include_router(auth.router)
    app.include_router(pages.router)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        titles = {404: "Not found", 405: "Not allowed"}
        said = "there is no such page" if exc.status_code == 404 else str(exc.detail)
        return error_page(request, exc.status_code, titles.get(exc.status_code, "Refused"), said)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        return failure_page(request, exc)

    from sqlalchemy.exc import OperationalError

    from kiso.kernel import StoreError

    for kind in (OperationalError, StoreError, OSError):  # by type: no traceback re-raised
        app.add_exception_handler(kind, _bug)

    app.add_middleware(SessionMiddleware, **session_settings(state.secret, state.config.public_url))
    app.add_middleware(_BodyLimit, limit=state.config.max_body)
    return app


class _BodyLimit:
    """A form over ``limit`` bytes is a 413 page, before anything reads it (whether or not a
    Content-Length was sent)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH", "DELETE"):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._too_large(send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._too_large(send)
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

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        from kyronix.server.dashboard.web import PAGE_HEADERS, error_html

        said = f"the request body is over the limit of {self.limit} bytes; nothing was changed"
        payload = error_html(413, "Too large", said).encode()
        headers = [(k.encode(), v.encode()) for k, v in PAGE_HEADERS.items()]
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"text/html; charset=utf-8"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
