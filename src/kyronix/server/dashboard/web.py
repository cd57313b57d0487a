"""What every dashboard page shares: the signed session cookie, who is signed in, the CSRF token,
rendering a template, and the HTML error page.

* The session is Starlette's signed cookie (``kyronix_session``: itsdangerous, HttpOnly,
  ``SameSite=Lax``, ``Secure`` when ``KYRONIX_PUBLIC_URL`` is https), signed with a key derived
  from the server's secret (never the key that hashes API keys itself). It holds the user's id,
  the token of the session's row in ``kx_web_sessions`` and the session's CSRF token, nothing
  else. A cookie signs in only while that row exists: *Sign out* deletes it, so a copied cookie
  is dead too, on every replica.
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
import logging
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from kyronix.errors import KyronixError
from kyronix.server.accounts import Project
from kyronix.server.config import credits_text
from kyronix.server.errors import is_storage_failure
from kyronix.server.users import (
    User,
    close_web_session,
    open_web_session,
    project_for,
    projects_of,
    web_session_user,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from kyronix.server.state import AppState

__all__ = [
    "SESSION_COOKIE",
    "Denied",
    "NotSignedIn",
    "PageError",
    "check_csrf",
    "csrf_token",
    "current_user",
    "error_html",
    "error_page",
    "failure_page",
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
DAY_MS = 24 * 3600 * 1000
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


_env.filters["when"] = _when
_env.filters["credits"] = credits_text


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


FORM_MAX_FIELDS = 1000
"""Fields a dashboard form may post (the largest, an agent of 64 tools, has ~200)."""


async def form_data(request: Request) -> dict[str, str]:
    """The posted form (text fields only), its CSRF token checked first. A body that is not a
    form this server can read (too many fields, a multipart body without its boundary, bad
    encoding) is a 400 page saying so."""
    try:
        form = await request.form(max_files=0, max_fields=FORM_MAX_FIELDS)
    except (HTTPException, MultiPartException) as exc:
        detail = exc.detail if isinstance(exc, HTTPException) else exc.message
        raise PageError(
            400,
            "Bad form",
            f"this form could not be read ({detail}); reload the page and send it again",
        ) from None
    fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
    check_csrf(request, fields.get("csrf"))
    return fields


async def sign_in(request: Request, user: User) -> None:
    """Start a server-side session for ``user`` and put its token in a fresh cookie."""
    uid = user.id
    token = await write(request, lambda conn: open_web_session(conn, uid, SESSION_DAYS * DAY_MS))
    request.session.clear()  # a fresh session: no fixation of a cookie set before sign-in
    request.session["uid"] = uid
    request.session["sid"] = token
    csrf_token(request)


async def sign_out(request: Request) -> None:
    """End the session on the server (a copy of the cookie stops working too), then clear it."""
    token = request.session.get("sid")
    if isinstance(token, str) and token:
        await write(request, lambda conn: close_web_session(conn, token))
    request.session.clear()


async def current_user(request: Request) -> User | None:
    """The user whose live server-side session this cookie carries (None when signed out)."""
    uid, token = request.session.get("uid"), request.session.get("sid")
    if not isinstance(uid, str) or not isinstance(token, str) or not token:
        return None
    return await read(request, lambda conn: web_session_user(conn, uid, token))


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


def error_html(status: int, title: str, message: str) -> str:
    """The error page's HTML (no request, no database: it must work when nothing else does)."""
    return _env.get_template("error.html").render(
        request=None, user=None, projects=[], project=None, csrf="", status=status,
        title=title, message=message,
    )  # fmt: skip


def error_page(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    """The error page as a response."""
    return HTMLResponse(error_html(status, title, message), status_code=status, headers=_HEADERS)


PAGE_HEADERS = _HEADERS


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
    page, and anything unexpected is :func:`failure_page`."""
    import functools

    @functools.wraps(fn)
    async def wrapped(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            response: Response = await fn(request, *args, **kwargs)
            return response
        except NotSignedIn:
            return to_signin(request)
        except PageError as exc:
            return error_page(request, exc.status, exc.title, exc.message)
        except HTTPException as exc:  # raised by Starlette itself (a body it cannot read)
            return error_page(request, exc.status_code, "Refused", str(exc.detail))
        except Exception as exc:
            return failure_page(request, exc)

    return wrapped


def failure_page(request: Request, exc: Exception) -> Response:
    """The page for what a dashboard route raised unexpectedly: the storage failing is a 503
    that says so (logged in one line, no traceback); anything else a 500 that names nothing of
    the code (logged with its traceback: a bug)."""
    log = logging.getLogger("kyronix.server")
    if is_storage_failure(exc):
        log.error(
            "dashboard %s %s: the database cannot write (%s)",
            request.method, request.url.path, type(exc).__name__,
        )  # fmt: skip
        said = "the server cannot write to its database right now (disk full or failing)"
        return error_page(request, 503, "Unavailable", f"{said}; nothing was changed")
    log.error(
        "unexpected %s on a dashboard page %s %s",
        type(exc).__name__, request.method, request.url.path, exc_info=exc,
    )  # fmt: skip
    return error_page(
        request, 500, "Something failed", "the server failed on this page; this is a bug"
    )
