"""The Kyronix dashboard, served by ``kyronix serve`` on the same data as the API and the CLI.

Server-rendered pages (Jinja2; htmx vendored as a static file; no build step) under
``/dashboard``, GitHub sign-in at ``/api/auth`` (callback ``/api/auth/callback``), one-time
sign-in links at ``/signin/<token>``. docs/dashboard.md is the user's account.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from kyronix.server.app import AppState

__all__ = ["install"]


def install(app: FastAPI, state: AppState) -> None:
    """Mount the dashboard: its static files, the session cookie, the sign-in routes and the
    pages."""
    from starlette.middleware.sessions import SessionMiddleware
    from starlette.staticfiles import StaticFiles

    from kyronix.server.dashboard import auth, pages
    from kyronix.server.dashboard.web import HERE, session_settings

    app.mount("/dashboard/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")
    app.add_middleware(SessionMiddleware, **session_settings(state.secret, state.config.public_url))
    app.include_router(auth.router)
    app.include_router(pages.router)
