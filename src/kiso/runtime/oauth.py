"""The ChatGPT subscription sign-in: OAuth 2.0 authorization code with PKCE, and its renewal.

``kiso login chatgpt`` (:mod:`kiso.cli.login_chatgpt`) sends the browser to the issuer's
``/oauth/authorize`` with a fresh PKCE challenge (S256) and a random ``state``, receives the code
on a loopback callback, and exchanges it here at ``/oauth/token`` (form-encoded,
``grant_type=authorization_code``). The tokens are stored under ``chatgpt`` in auth.json
(:class:`kiso.runtime.auth.OAuthCredential`).

Before each model request :class:`ChatGPTBearer` hands the adapter the access token, renewed
first when it expires within :data:`REFRESH_MARGIN_MS` (``grant_type=refresh_token``). The
renewal runs under the auth file's lock after reading the file again, so a token another process
renewed meanwhile is reused, never renewed twice. A refresh the issuer refuses (400/401
``invalid_grant``, or a revoked/expired/reused refresh token) is remembered in the file
(``refreshRejectedAt``) and is a loud error saying to sign in again: never a fall back to
``OPENAI_API_KEY``.

Configuration (environment; each has a default)::

    KISO_CHATGPT_ISSUER          https://auth.openai.com  (/oauth/authorize, /oauth/token)
    KISO_CHATGPT_CLIENT_ID       app_EMoamEEZ73f0CkXaXp7hrann  (the Codex CLI's public client)
    KISO_CHATGPT_ORIGIN          https://chatgpt.com  (the only origin the token is sent to)
    KISO_CHATGPT_CALLBACK_PORT   1455  (the port that client's redirect URI names; 0: any free)

The issuer, client id and origin a sign-in used are stored with it: a later change of these
variables never sends its tokens anywhere else. Plain ``http`` is accepted only for a loopback
host (a test's fake issuer).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from kiso.kernel import ascii_int
from kiso.providers.base import ProviderError
from kiso.runtime.auth import AuthError, AuthStore, OAuthCredential

__all__ = [
    "ACCOUNT_HEADER",
    "CHATGPT",
    "REFRESH_MARGIN_MS",
    "ChatGPTBearer",
    "ChatGPTSettings",
    "OAuthError",
    "Pkce",
    "RefreshRefused",
    "Tokens",
    "account_id_of",
    "authorize_url",
    "chatgpt_settings",
    "credential_from",
    "exchange_code",
    "new_pkce",
    "new_state",
    "refresh_tokens",
    "refused_message",
    "s256",
    "unverified_claims",
]

CHATGPT = "chatgpt"
"""The provider name the sign-in is stored under."""
DEFAULT_ISSUER = "https://auth.openai.com"
DEFAULT_CLIENT_ID = "app_EMoamEEZ73f0CkXaXp7hrann"
"""The public client id the official open-source Codex CLI registers for this flow."""
DEFAULT_ORIGIN = "https://chatgpt.com"
DEFAULT_PORT = 1455
CALLBACK_PATH = "/auth/callback"
SCOPE = "openid profile email offline_access"
REFRESH_MARGIN_MS = 60_000
"""An access token expiring sooner than this is renewed before the request."""
ACCOUNT_HEADER = "chatgpt-account-id"
_AUTH_CLAIM = "https://api.openai.com/auth"
_DEFAULT_LIFETIME_S = 3600
_REFUSED_CODES = frozenset(
    {
        "invalid_grant",
        "refresh_token_expired",
        "refresh_token_reused",
        "refresh_token_invalidated",
        "token_revoked",
    }
)
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


class OAuthError(AuthError):
    """The issuer could not be reached, or refused; ``retryable`` when trying again may work."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class RefreshRefused(OAuthError):
    """The issuer refused the refresh token: only a new sign-in helps."""


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True)
class ChatGPTSettings:
    issuer: str = DEFAULT_ISSUER
    client_id: str = DEFAULT_CLIENT_ID
    origin: str = DEFAULT_ORIGIN
    port: int = DEFAULT_PORT

    @property
    def authorize_endpoint(self) -> str:
        return f"{self.issuer}/oauth/authorize"

    @property
    def token_endpoint(self) -> str:
        return f"{self.issuer}/oauth/token"

    def example_base_url(self) -> str:
        return f"{self.origin}/backend-api"

    def of(self, credential: OAuthCredential) -> ChatGPTSettings:
        """These settings, with the issuer, client and origin the credential was obtained with."""
        return dataclasses.replace(
            self,
            issuer=credential.issuer or self.issuer,
            client_id=credential.client_id or self.client_id,
            origin=credential.origin or self.origin,
        )


def _url(name: str, value: str) -> str:
    parts = urlsplit(value.strip())
    host = (parts.hostname or "").lower()
    secure = parts.scheme == "https" or (parts.scheme == "http" and host in _LOOPBACK)
    if not secure or not host or parts.query or parts.fragment:
        raise AuthError(
            f"{name}={value!r}: must be an https URL (plain http only for 127.0.0.1 or "
            f"localhost), with no query"
        )
    return value.strip().rstrip("/")


def _origin(name: str, value: str) -> str:
    parts = urlsplit(_url(name, value))
    if parts.path not in ("", "/"):
        raise AuthError(f"{name}={value!r}: must be an origin (scheme://host[:port]), no path")
    return f"{parts.scheme}://{parts.netloc}".lower()


def chatgpt_settings(environ: Mapping[str, str] | None = None) -> ChatGPTSettings:
    """The sign-in's configuration from the environment (see the module docstring)."""
    env = os.environ if environ is None else environ
    issuer = _url("KISO_CHATGPT_ISSUER", env.get("KISO_CHATGPT_ISSUER") or DEFAULT_ISSUER)
    origin = _origin("KISO_CHATGPT_ORIGIN", env.get("KISO_CHATGPT_ORIGIN") or DEFAULT_ORIGIN)
    client_id = (env.get("KISO_CHATGPT_CLIENT_ID") or DEFAULT_CLIENT_ID).strip()
    if not client_id or any(ch.isspace() for ch in client_id):
        raise AuthError(f"KISO_CHATGPT_CLIENT_ID={client_id!r}: not a client id")
    raw_port = (env.get("KISO_CHATGPT_CALLBACK_PORT") or str(DEFAULT_PORT)).strip()
    port = ascii_int(raw_port)
    if port is None or port > 65535:
        raise AuthError(f"KISO_CHATGPT_CALLBACK_PORT={raw_port!r}: must be a port, 0 to 65535")
    return ChatGPTSettings(issuer, client_id, origin, port)


# --------------------------------------------------------------------------- the authorize step


@dataclass(frozen=True, slots=True)
class Pkce:
    verifier: str
    challenge: str


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def s256(verifier: str) -> str:
    """The S256 ``code_challenge`` of a verifier: base64url(sha256(verifier)), unpadded."""
    return _b64url(hashlib.sha256(verifier.encode("ascii")).digest())


def new_pkce() -> Pkce:
    """A fresh ``code_verifier`` (86 characters of 64 random bytes) and its S256 challenge."""
    verifier = _b64url(secrets.token_bytes(64))
    return Pkce(verifier, s256(verifier))


def new_state() -> str:
    return _b64url(secrets.token_bytes(32))


def authorize_url(
    settings: ChatGPTSettings, *, redirect_uri: str, challenge: str, state: str
) -> str:
    query = {
        "response_type": "code",
        "client_id": settings.client_id,
        "redirect_uri": redirect_uri,
        "scope": SCOPE,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "id_token_add_organizations": "true",
        "codex_cli_simplified_flow": "true",
        "state": state,
    }
    return f"{settings.authorize_endpoint}?{urlencode(query)}"


# --------------------------------------------------------------------------- the token endpoint


@dataclass(frozen=True, slots=True)
class Tokens:
    access: str
    refresh: str
    expires: int
    """Milliseconds since the epoch."""
    account_id: str | None


def unverified_claims(token: str | None) -> dict[str, Any]:
    """A JWT's payload, decoded WITHOUT verifying its signature: only to read the account id
    and the expiry the issuer put there. Nothing here trusts it for anything else (the backend
    verifies the token it receives). Not a JWT: ``{}``."""
    if not token or token.count(".") != 2:
        return {}
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, TypeError):
        return {}
    return claims if isinstance(claims, dict) else {}


def account_id_of(*tokens: str | None) -> str | None:
    """The ChatGPT account id (``https://api.openai.com/auth`` → ``chatgpt_account_id``) of the
    first token that names one."""
    for token in tokens:
        auth = unverified_claims(token).get(_AUTH_CLAIM)
        account = auth.get("chatgpt_account_id") if isinstance(auth, dict) else None
        if isinstance(account, str) and account:
            return account
    return None


def _post(settings: ChatGPTSettings, form: dict[str, str], what: str) -> tuple[int, Any]:
    import httpx2

    try:
        response = httpx2.post(
            settings.token_endpoint,
            data=form,
            headers={"Accept": "application/json"},
            timeout=30.0,
        )
    except httpx2.HTTPError as exc:
        raise OAuthError(
            f"{what}: cannot reach {settings.token_endpoint} ({type(exc).__name__}: {exc})",
            retryable=True,
        ) from None
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text[:200]
    return response.status_code, body


def _error_of(body: Any) -> tuple[str | None, str]:
    """The OAuth error code and a readable description from an error body (either shape)."""
    if not isinstance(body, dict):
        return None, str(body or "no details")
    error = body.get("error")
    if isinstance(error, dict):  # {"error": {"code", "message", "type"}}
        code = error.get("code") or error.get("type")
        return (str(code) if code else None), str(error.get("message") or code or "no details")
    description = body.get("error_description") or body.get("message") or error
    return (str(error) if error else None), str(description or "no details")


def _tokens(
    body: Any, previous: OAuthCredential | None, now_ms: int, settings: ChatGPTSettings
) -> Tokens:
    access = body.get("access_token") if isinstance(body, dict) else None
    refresh = body.get("refresh_token") if isinstance(body, dict) else None
    if refresh is None and previous is not None:
        refresh = previous.refresh  # the issuer kept the refresh token as it was
    if not (isinstance(access, str) and access and isinstance(refresh, str) and refresh):
        raise OAuthError(
            f"{settings.token_endpoint} answered without an access token and a refresh token"
        )
    lifetime = body.get("expires_in")
    exp = unverified_claims(access).get("exp")
    if isinstance(lifetime, int | float) and not isinstance(lifetime, bool) and lifetime > 0:
        expires = now_ms + int(lifetime * 1000)
    elif isinstance(exp, int | float) and not isinstance(exp, bool) and exp > 0:
        expires = int(exp * 1000)
    else:  # no expiry given anywhere: assume an hour (a 401 later just means sign in again)
        expires = now_ms + _DEFAULT_LIFETIME_S * 1000
    id_token = body.get("id_token")
    account = account_id_of(id_token if isinstance(id_token, str) else None, access)
    if account is None and previous is not None:
        account = previous.account_id
    return Tokens(access, refresh, expires, account)


def exchange_code(
    settings: ChatGPTSettings, *, code: str, verifier: str, redirect_uri: str
) -> Tokens:
    """The tokens for an authorization code (``grant_type=authorization_code``)."""
    now = _now_ms()
    status, body = _post(
        settings,
        {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "client_id": settings.client_id,
            "code_verifier": verifier,
        },
        "the token exchange",
    )
    if status != 200:
        code_name, description = _error_of(body)
        raise OAuthError(
            f"the token exchange at {settings.token_endpoint} failed (HTTP {status}"
            f"{', ' + code_name if code_name else ''}: {description})",
            retryable=status >= 500,
        )
    return _tokens(body, None, now, settings)


def refresh_tokens(settings: ChatGPTSettings, previous: OAuthCredential) -> Tokens:
    """New tokens for a sign-in (``grant_type=refresh_token``); :class:`RefreshRefused` when the
    issuer will not renew it."""
    now = _now_ms()
    status, body = _post(
        settings,
        {
            "grant_type": "refresh_token",
            "refresh_token": previous.refresh,
            "client_id": settings.client_id,
            "scope": "openid profile email",
        },
        "renewing the ChatGPT sign-in",
    )
    if status == 200:
        return _tokens(body, previous, now, settings)
    code, description = _error_of(body)
    detail = f"HTTP {status}{', ' + code if code else ''}: {description}"
    if status == 401 or (status == 400 and code in _REFUSED_CODES):
        raise RefreshRefused(
            f"the ChatGPT sign-in has expired and {settings.issuer} refused to renew it "
            f"({detail}); run `kiso login chatgpt` again"
        )
    raise OAuthError(
        f"renewing the ChatGPT sign-in at {settings.token_endpoint} failed ({detail})",
        retryable=status >= 500 or status == 429,
    )


def credential_from(tokens: Tokens, settings: ChatGPTSettings) -> OAuthCredential:
    """What auth.json stores for fresh tokens, bound to the settings that obtained them."""
    return OAuthCredential(
        CHATGPT,
        tokens.access,
        tokens.refresh,
        tokens.expires,
        account_id=tokens.account_id,
        saved_at=_now_ms(),
        issuer=settings.issuer,
        client_id=settings.client_id,
        origin=settings.origin,
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


# --------------------------------------------------------------------------- renewal on use


def refused_message(credential: OAuthCredential) -> str:
    """What to say about a sign-in whose refresh the issuer refused."""
    rejected = (credential.refresh_rejected_at or 0) / 1000
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(rejected))
    return (
        f"the ChatGPT sign-in can no longer be renewed: its refresh was refused at {when}; run "
        f"`kiso login chatgpt` again (or `kiso logout chatgpt` to stop using it)"
    )


class ChatGPTBearer:
    """The adapter's bearer source: ``()`` → (access token, extra headers), renewed first when
    it is about to expire. Blocking (a lock, maybe an HTTP request): call it off the event loop.
    Failures are :class:`ProviderError` ``auth`` (refused: not retried) or, when the issuer
    could not be reached, retryable."""

    def __init__(
        self,
        store: AuthStore,
        settings: ChatGPTSettings,
        *,
        margin_ms: int = REFRESH_MARGIN_MS,
    ) -> None:
        self._store = store
        self._settings = settings
        self._margin_ms = margin_ms

    def _fresh(self, credential: OAuthCredential) -> bool:
        return credential.expires - _now_ms() > self._margin_ms

    def __call__(self) -> tuple[str, dict[str, str]]:
        try:
            credential = self._store.get_oauth(CHATGPT)
            if credential is None:
                raise AuthError(
                    "the ChatGPT sign-in was removed (kiso logout chatgpt); run "
                    "`kiso login chatgpt` again"
                )
            if credential.refresh_rejected_at is None and not self._fresh(credential):
                credential = self._renew()
        except OAuthError as exc:
            raise ProviderError(
                str(exc),
                code="auth" if not exc.retryable else "network",
                retryable=exc.retryable,
            ) from None
        except AuthError as exc:
            raise ProviderError(str(exc), code="auth", retryable=False) from None
        if credential.refresh_rejected_at is not None:
            raise ProviderError(refused_message(credential), code="auth", retryable=False)
        headers = {ACCOUNT_HEADER: credential.account_id} if credential.account_id else {}
        return credential.access, headers

    def _renew(self) -> OAuthCredential:
        refused: RefreshRefused | None = None

        def renew(current: OAuthCredential) -> OAuthCredential:
            nonlocal refused
            if current.refresh_rejected_at is not None or self._fresh(current):
                return current  # refused before, or another process renewed it meanwhile
            try:
                tokens = refresh_tokens(self._settings.of(current), current)
            except RefreshRefused as exc:
                refused = exc
                return dataclasses.replace(current, refresh_rejected_at=_now_ms())
            return dataclasses.replace(
                current,
                access=tokens.access,
                refresh=tokens.refresh,
                expires=tokens.expires,
                account_id=tokens.account_id,
                saved_at=_now_ms(),
            )

        renewed = self._store.renew(CHATGPT, renew)
        if refused is not None:
            raise refused
        return renewed
