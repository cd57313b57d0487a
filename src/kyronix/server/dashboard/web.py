"""What every dashboard page shares: the signed session cookie, who is signed in, the CSRF token,
rendering a template, and the HTML error page.

* The session is Starlette's signed cookie (``kyronix_session``: itsdangerous, HttpOnly,
  ``SameSite=Lax``, ``Secure`` when ``KYRONIX_PUBLIC_URL`` is https), signed with a key derived
  from the server's secret (never the key that hashes API keys itself). It holds the user's id
  and the session's CSRF token, nothing else.
* Every form carries the CSRF token (``<input name="csrf">``; htmx requests send it as the
  ``X-CSRF-Token`` header); a POST without the session's token is a 403 page and changes
  nothing. The API (``/api/...`` with a Bearer key) never reads the cookie.
* An error is a page that says what went wrong and what to do, with the right status; never a
  stack trace.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from kyronix.errors import KyronixError
from kyronix.server.accounts import Project
from kyronix.server.users import User, get_user, project_for, projects_of

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from kyronix.server.app import AppState

__all__ = [
    "SESSION_COOKIE",
    "Denied",
    "NotSignedIn",
    "PageError",
    "check_csrf",
    "csrf_token",
    "current_user",
    "error_page",
    "form_data",
    "read",
    "render",
    "require_project",
    "require_user",
    "session_settings",
    "sign_in",
    "sign_out",
    "state_of",
    "write",
]

T = TypeVar("T")
SESSION_COOKIE = "kyronix_session"
SESSION_DAYS = 14
HERE = Path(__file__).parent

_env = Environment(
    loader=FileSystemLoader(str(HERE / "templates")),
    autoescape=select_autoescape(["html", "svg"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(ms: int | None) -> str:
    if not ms:
        return "never"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _credits(milli: int | None) -> str:
    return f"{(milli or 0) / 1000:,.3f}".rstrip("0").rstrip(".")


_env.filters["when"] = _when
_env.filters["credits"] = _credits


class PageError(KyronixError):
    """Shown as an error page with ``status``."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


class NotSignedIn(KyronixError):
    """The page needs a signed-in user: the browser is sent to the sign-in page."""


class Denied(PageError):
    def __init__(self, message: str) -> None:
        super().__init__(403, "Refused", message)


def state_of(request: Request) -> AppState:
    state: AppState = request.app.state.kx
    return state


def session_settings(secret: bytes, public_url: str | None) -> dict[str, Any]:
    """The ``SessionMiddleware`` arguments: a key of its own, the cookie's attributes."""
    key = hmac.new(secret, b"kyronix dashboard session", hashlib.sha256).hexdigest()
    return {
        "secret_key": key,
        "session_cookie": SESSION_COOKIE,
        "max_age": SESSION_DAYS * 24 * 3600,
        "same_site": "lax",
        "https_only": bool(public_url and public_url.startswith("https://")),
    }


async def read(request: Request, fn: Callable[[Connection], T]) -> T:
    return await asyncio.to_thread(state_of(request).db.read, fn)


async def write(request: Request, fn: Callable[[Connection], T]) -> T:
    return await asyncio.to_thread(state_of(request).db.write, fn)


def csrf_token(request: Request) -> str:
    token = request.session.get("csrf")
    if not isinstance(token, str) or len(token) < 32:
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


def check_csrf(request: Request, sent: object) -> None:
    """Refuse (403) a state-changing request without this session's token."""
    expected = request.session.get("csrf")
    if not isinstance(sent, str) or not sent:
        sent = request.headers.get("x-csrf-token", "")
    if (
        not isinstance(expected, str)
        or not expected
        or not hmac.compare_digest(str(sent).encode(), expected.encode())
    ):
        raise Denied(
            "this form was not sent from this session's page (its CSRF token is missing or "
            "wrong), so nothing was changed; reload the page and try again"
        )


async def form_data(request: Request) -> dict[str, str]:
    """The posted form (text fields only), its CSRF token checked first."""
    form = await request.form()
    fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
    check_csrf(request, fields.get("csrf"))
    return fields


def sign_in(request: Request, user: User) -> None:
    request.session.clear()  # a fresh session: no fixation of a cookie set before sign-in
    request.session["uid"] = user.id
    csrf_token(request)


def sign_out(request: Request) -> None:
    request.session.clear()


async def current_user(request: Request) -> User | None:
    uid = request.session.get("uid")
    if not isinstance(uid, str):
        return None
    return await read(request, lambda conn: get_user(conn, uid))


async def require_user(request: Request) -> User:
    user = await current_user(request)
    if user is None:
        raise NotSignedIn
    return user


async def require_project(request: Request, user: User, project_id: str) -> Project:
    """The project, if this user may see it; otherwise a 404 page (the same as no project, so
    a URL guessed for another user's project tells nothing)."""
    project = await read(request, lambda conn: project_for(conn, user.id, project_id))
    if project is None:
        raise PageError(404, "Not found", "there is no such project among yours")
    return project


async def render(
    request: Request,
    template: str,
    context: Mapping[str, Any] | None = None,
    *,
    status: int = 200,
    user: User | None = None,
    project: Project | None = None,
) -> HTMLResponse:
    """A page: the template with the signed-in user, their projects, the current project and
    the CSRF token."""
    projects: list[Project] = []
    if user is not None:
        uid = user.id
        projects = await read(request, lambda conn: projects_of(conn, uid))
    html = _env.get_template(template).render(
        request=request,
        user=user,
        projects=projects,
        project=project,
        csrf=csrf_token(request),
        **(context or {}),
    )
    return HTMLResponse(html, status_code=status, headers=_HEADERS)


_HEADERS = {
    "cache-control": "no-store",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
}


def error_page(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    """The error page (no database access: it must work when nothing else does)."""
    html = _env.get_template("error.html").render(
        request=request, user=None, projects=[], project=None, csrf="", status=status,
        title=title, message=message,
    )  # fmt: skip
    return HTMLResponse(html, status_code=status, headers=_HEADERS)


def to_signin(request: Request) -> Response:
    target = request.url.path
    if request.url.query:
        target += "?" + request.url.query
    return RedirectResponse(f"/dashboard/signin?next={_safe_next(target)}", status_code=303)


def _safe_next(path: str) -> str:
    """Only a path of this dashboard (never another origin: ``//evil``, ``/\\evil``)."""
    from urllib.parse import quote

    if not path.startswith("/dashboard") or path.startswith(("//", "/\\")):
        return "/dashboard"
    return quote(path, safe="/?=&")


def safe_next(value: str | None) -> str:
    if not value or not value.startswith("/dashboard") or "//" in value or "\\" in value:
        return "/dashboard"
    return value


Handler = Callable[..., Any]


def page(fn: Handler) -> Handler:
    """A dashboard route: a signed-out visitor is sent to sign in, a :class:`PageError` is its
    page, and anything unexpected is a 500 page that names nothing of the code."""
    import functools
    import logging

    @functools.wraps(fn)
    async def wrapped(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            response: Response = await fn(request, *args, **kwargs)
            return response
        except NotSignedIn:
            return to_signin(request)
        except PageError as exc:
            return error_page(request, exc.status, exc.title, exc.message)
        except Exception as exc:
            logging.getLogger("kyronix.server").error(
                "unexpected %s on a dashboard page", type(exc).__name__
            )
            return error_page(
                request, 500, "Something failed", "the server failed on this page; this is a bug"
            )

    return wrapped
