"""Signing in to the dashboard: GitHub OAuth, one-time links, signing out.

* ``GET /api/auth`` starts GitHub's OAuth web flow (authlib's Starlette client; scope
  ``read:user``; PKCE), the callback is ``GET /api/auth/callback`` at ``KYRONIX_PUBLIC_URL`` (or
  the address the request came to). The flow's ``state`` lives in the signed session cookie and
  is spent by the callback, in the database (``kx_spent_states``), so a replay is refused by
  every replica: a forged, missing or replayed state, a refusal by GitHub or a failed
  code exchange is a 400 page that offers to try again; GitHub unreachable is a 502 page.
* ``GET /signin/<kxs_…>`` shows a button; only ``POST`` (with the page's CSRF token) spends the
  link, so a chat app's link preview or a browser's prefetch cannot use it up.
* ``POST /dashboard/signout`` ends the session on the server (``kx_web_sessions``): a copy of
  the cookie signs nobody in afterwards.

Signing in starts a fresh session (no fixation of a cookie set before); it remembers where to go
next (``?next=/dashboard/...``, never another site).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from kyronix.server.dashboard.web import (
    PageError,
    current_user,
    form_data,
    page,
    read,
    render,
    safe_next,
    sign_in,
    sign_out,
    state_of,
    write,
)
from kyronix.server.users import link_live, redeem_link, sign_in_github, spend_state

__all__ = ["router"]

router = APIRouter(include_in_schema=False)
log = logging.getLogger("kyronix.server")

NEXT_KEY = "signin_next"
"""The session's note of where to go after GitHub sends the browser back."""
_STATE_PREFIX = "_state_github_"
"""authlib's session keys for the flow in progress."""
_SPENT_TTL_MS = 3600 * 1000
"""How long a used OAuth state is remembered (a flow older than that fails at GitHub anyway)."""


def _github(request: Request) -> Any:
    """This app's authlib client for GitHub (made once, from the server's settings)."""
    holder = request.app.state
    client = getattr(holder, "kx_github", None)
    if client is None:
        from authlib.integrations.starlette_client import OAuth  # type: ignore[import-untyped]

        config = state_of(request).config
        web = config.github_url.rstrip("/")
        oauth = OAuth()
        client = oauth.register(
            "github",
            client_id=config.github_client_id,
            client_secret=config.github_client_secret,
            authorize_url=f"{web}/login/oauth/authorize",
            access_token_url=f"{web}/login/oauth/access_token",
            api_base_url=config.github_api + "/",
            client_kwargs={
                "scope": "read:user",
                "token_endpoint_auth_method": "client_secret_post",
                "code_challenge_method": "S256",
                "timeout": 15.0,
                "headers": {"user-agent": "kyronix"},
            },
        )
        holder.kx_github = client
    return client


def _base_url(request: Request) -> str:
    public = state_of(request).config.public_url
    return public.rstrip("/") if public else str(request.base_url).rstrip("/")


def _drop_flow(request: Request) -> None:
    for key in [k for k in request.session if k.startswith(_STATE_PREFIX)]:
        request.session.pop(key, None)


async def _signin_page(request: Request, *, status: int = 200) -> Response:
    config = state_of(request).config
    nxt = safe_next(request.query_params.get("next"))
    return await render(
        request,
        "signin.html",
        {
            "github": config.github_enabled,
            "next": nxt if nxt != "/dashboard" else None,
        },
        status=status,
    )


class SignInFailed(PageError):
    """A sign-in that did not happen: its page says why and offers to try again (after
    ``retry_after`` seconds, when throttled)."""

    retry_after: int | None = None


def _refused(message: str) -> SignInFailed:
    return SignInFailed(400, "Sign-in failed", message)


def _failures(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """Show a :class:`SignInFailed` as the sign-in failure page (inside ``@page``)."""

    @functools.wraps(fn)
    async def wrapped(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return await fn(request, *args, **kwargs)
        except SignInFailed as exc:
            _drop_flow(request)
            github = state_of(request).config.github_enabled
            page = await render(
                request,
                "signin_failed.html",
                {
                    "title": exc.title,
                    "message": exc.message,
                    "status": exc.status,
                    "github": github,
                },
                status=exc.status,
            )
            if exc.retry_after is not None:
                page.headers["Retry-After"] = str(exc.retry_after)
            return page

    return wrapped


@router.get("/dashboard/signin")
@page
async def signin_page(request: Request) -> Response:
    """The sign-in page: "Sign in with GitHub", or how this server's one-time links work."""
    if await current_user(request) is not None:
        return RedirectResponse(safe_next(request.query_params.get("next")), status_code=303)
    return await _signin_page(request)


@router.get("/api/auth")
@page
async def github_start(request: Request) -> Response:
    """Send the browser to GitHub to approve this server (the docs' "/api/auth")."""
    if not state_of(request).config.github_enabled:
        return await _signin_page(request, status=404)
    client = _github(request)
    request.session[NEXT_KEY] = safe_next(request.query_params.get("next"))
    redirect_uri = f"{_base_url(request)}/api/auth/callback"
    response: Response = await client.authorize_redirect(request, redirect_uri)
    return response


@router.get("/api/auth/callback")
@page
@_failures
async def github_callback(request: Request) -> Response:
    """GitHub sent the browser back: trade the code, ask who it is, sign them in."""
    from authlib.integrations.base_client import (  # type: ignore[import-untyped]
        MismatchingStateError,
        OAuthError,
    )

    config = state_of(request).config
    if not config.github_enabled:
        raise PageError(404, "Not found", "this server does not sign in with GitHub")
    client = _github(request)
    params = request.query_params
    state = params.get("state") or ""
    error = params.get("error")
    if error:
        if error == "access_denied":
            raise _refused("GitHub did not let this server see your account (access was denied)")
        said = params.get("error_description") or error
        raise _refused(f"GitHub refused the sign-in: {said}")
    if not state or not params.get("code"):
        raise _refused("GitHub's answer was incomplete (no state or no code)")
    if f"{_STATE_PREFIX}{state}" in request.session:  # a real flow's state: spent, once
        first = await write(request, lambda conn: spend_state(conn, state, _SPENT_TTL_MS))
        if not first:
            raise _refused("this sign-in was already completed once (the state was used)")
    try:
        token = await client.authorize_access_token(request)
    except MismatchingStateError:
        raise _refused(
            "this answer from GitHub does not belong to a sign-in started in this browser, or "
            "that sign-in was already completed (the state does not match)"
        ) from None
    except OAuthError as exc:
        raise _refused(
            f"GitHub would not finish the sign-in ({exc.error}: {exc.description})"
        ) from None
    except (httpx2.HTTPError, ValueError, OSError) as exc:
        log.warning("GitHub token exchange failed: %s", type(exc).__name__)
        raise SignInFailed(
            502, "GitHub unreachable", "this server could not reach GitHub to finish the sign-in"
        ) from None
    who = await _github_user(client, token)
    nxt = safe_next(request.session.get(NEXT_KEY))
    github_id, login, name = who
    user, _ = await write(
        request, lambda conn: sign_in_github(conn, github_id, login, name, config.initial_credits)
    )
    await sign_in(request, user)
    return RedirectResponse(nxt, status_code=303)


async def _github_user(client: Any, token: dict[str, Any]) -> tuple[str, str, str | None]:
    unreachable = SignInFailed(502, "GitHub unreachable", "GitHub did not say who you are")
    try:
        resp = await client.get(
            "user", token=token, headers={"accept": "application/vnd.github+json"}
        )
        data = resp.json() if resp.status_code == 200 else None
    except (httpx2.HTTPError, ValueError, OSError) as exc:
        log.warning("GitHub /user failed: %s", type(exc).__name__)
        raise unreachable from None
    if not isinstance(data, dict):
        log.warning("GitHub /user answered HTTP %s", resp.status_code)
        raise unreachable
    gid, login, name = data.get("id"), data.get("login"), data.get("name")
    if isinstance(gid, bool) or not isinstance(gid, int | str) or not isinstance(login, str):
        raise unreachable
    if not login or len(login) > 128:
        raise unreachable
    return str(gid), login, name if isinstance(name, str) and name else None


def _used_link() -> SignInFailed:
    return SignInFailed(
        400,
        "Sign-in link not valid",
        "this sign-in link was already used or has expired; ask for a new one (kyronix users "
        "invite NAME on the server, or restart kyronix serve for the owner's link)",
    )


def _throttle(request: Request) -> None:
    """An address that failed too many sign-ins (links, keys) waits before it may try again."""
    client = request.client.host if request.client is not None else None
    wait = state_of(request).keys.failures.wait(client)
    if wait:
        seconds = max(1, math.ceil(wait))
        refused = SignInFailed(
            429,
            "Too many attempts",
            f"too many failed sign-ins from this address; try again in {seconds} s",
        )
        refused.retry_after = seconds
        raise refused


def _failed_link(request: Request) -> SignInFailed:
    client = request.client.host if request.client is not None else None
    state_of(request).keys.failures.failed(client)
    return _used_link()


@router.get("/signin/{token}")
@page
@_failures
async def link_page(request: Request, token: str) -> Response:
    """A one-time link's page: a button, so that fetching the link does not spend it."""
    _throttle(request)
    if not token.startswith("kxs_") or len(token) > 64:
        raise _failed_link(request)
    secret = state_of(request).secret
    if not await read(request, lambda conn: link_live(conn, secret, token)):
        raise _failed_link(request)
    return await render(request, "link.html", {"token": token})


@router.post("/signin/{token}")
@page
@_failures
async def link_redeem(request: Request, token: str) -> Response:
    """Spend the link and sign in as its user."""
    await form_data(request)  # the CSRF token of the page's session
    _throttle(request)
    if not token.startswith("kxs_") or len(token) > 64:
        raise _failed_link(request)
    state = state_of(request)
    secret, initial = state.secret, state.config.initial_credits
    found = await write(request, lambda conn: redeem_link(conn, secret, token, initial))
    if found is None:
        raise _failed_link(request)
    await sign_in(request, found[0])
    return RedirectResponse("/dashboard", status_code=303)


@router.post("/dashboard/signout")
@page
async def signout(request: Request) -> Response:
    await form_data(request)
    await sign_out(request)
    return RedirectResponse("/dashboard/signin", status_code=303)
