"""A fake OAuth 2.0 issuer on 127.0.0.1: ``/oauth/authorize`` and ``/oauth/token``, PKCE checked.

It behaves the way the sign-in depends on, and refuses what a real issuer refuses::

    with FakeIssuer() as issuer:
        issuer.url                       # http://127.0.0.1:<port>, the KISO_CHATGPT_ISSUER
        issuer.issue(expires_in=30)      # tokens as if a sign-in had just happened
        issuer.refreshes                 # refresh_token grants received (refused ones too)

* ``GET /oauth/authorize`` plays the user who signs in: it answers 302 to the ``redirect_uri``
  with a fresh one-time ``code`` and the request's ``state`` (or, with ``authorize_error``, with
  ``error=...`` instead of a code). It refuses (400) an unknown ``client_id``, a
  ``response_type`` other than ``code`` and a challenge method other than ``S256``.
* ``POST /oauth/token`` takes form-encoded grants. ``authorization_code``: the code must be one
  it issued, unused, for the same ``redirect_uri`` and client, and base64url(sha256(
  ``code_verifier``)) must equal the ``code_challenge`` it was issued for. ``refresh_token``:
  the token must be current; each refresh rotates it, so a refresh token used twice is
  ``invalid_grant`` (what a second process renewing at the same time would hit). Failures are
  ``{"error": ..., "error_description": ...}`` with status 400.
* Access tokens are unsigned JWTs whose payload has ``exp`` and the account claim
  (``https://api.openai.com/auth`` → ``chatgpt_account_id``); the id token carries the claim too.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

ACCOUNT = "acct-7f3c9a2e-5b1d-4e8f-9c6a-0d2b4f6e8a1c"
CLIENT_ID = "app_kiso_test_client"


def jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


@dataclass
class Issued:
    access: str
    refresh: str
    expires_in: int
    id_token: str


@dataclass
class TokenRequest:
    form: dict[str, str]
    content_type: str


@dataclass
class _Pending:
    challenge: str
    redirect_uri: str
    client_id: str


@dataclass
class FakeIssuer:
    client_id: str = CLIENT_ID
    expires_in: int = 3600
    authorize_error: str | None = None
    """Answer the authorize step with ``error=<this>`` instead of a code."""
    fail_exchange: bool = False
    refuse_refresh: bool = False
    refresh_delay: float = 0.0
    """Seconds a refresh takes (so two processes renewing at once overlap)."""
    authorize_requests: list[dict[str, str]] = field(default_factory=list)
    token_requests: list[TokenRequest] = field(default_factory=list)
    refreshes: int = 0
    issued: list[Issued] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._codes: dict[str, _Pending] = {}
        self._refresh_tokens: set[str] = set()
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeIssuer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()

    # ------------------------------------------------------------------ the issuer's state

    def issue(self, expires_in: int | None = None) -> Issued:
        """A fresh token set whose refresh token this issuer will accept (once)."""
        with self._lock:
            n = next(self._counter)
            lifetime = self.expires_in if expires_in is None else expires_in
            auth = {"chatgpt_account_id": ACCOUNT, "chatgpt_plan_type": "plus"}
            access = jwt(
                {
                    "exp": int(time.time()) + lifetime,
                    "https://api.openai.com/auth": auth,
                    "n": n,
                }
            )
            id_token = jwt({"email": "user@example.com", "https://api.openai.com/auth": auth})
            issued = Issued(access, f"rt-{n}-refresh-secret", lifetime, id_token)
            self._refresh_tokens.add(issued.refresh)
            self.issued.append(issued)
            return issued

    def authorize(self, query: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            self.authorize_requests.append(query)
        if query.get("client_id") != self.client_id:
            return 400, {}, {"error": "invalid_client"}
        if query.get("response_type") != "code" or query.get("code_challenge_method") != "S256":
            return 400, {}, {"error": "invalid_request"}
        redirect = query["redirect_uri"]
        if self.authorize_error:
            answer = {"error": self.authorize_error, "error_description": "The user said no"}
        else:
            code = f"code-{next(self._counter)}"
            with self._lock:
                self._codes[code] = _Pending(query["code_challenge"], redirect, query["client_id"])
            answer = {"code": code}
        answer["state"] = query.get("state", "")
        return 302, {"location": f"{redirect}?{urlencode(answer)}"}, None

    def token(self, form: dict[str, str], content_type: str) -> tuple[int, Any]:
        with self._lock:
            self.token_requests.append(TokenRequest(form, content_type))
        if not content_type.startswith("application/x-www-form-urlencoded"):
            return 400, _error("invalid_request", "the body must be form-encoded")
        if form.get("client_id") != self.client_id:
            return 401, _error("invalid_client", "unknown client")
        grant = form.get("grant_type")
        if grant == "authorization_code":
            return self._exchange(form)
        if grant == "refresh_token":
            return self._refresh(form)
        return 400, _error("unsupported_grant_type", str(grant))

    def _exchange(self, form: dict[str, str]) -> tuple[int, Any]:
        if self.fail_exchange:
            return 400, _error("invalid_grant", "The authorization code has expired")
        with self._lock:
            pending = self._codes.pop(form.get("code", ""), None)
        if pending is None:
            return 400, _error("invalid_grant", "unknown or used code")
        if pending.redirect_uri != form.get("redirect_uri"):
            return 400, _error("invalid_grant", "redirect_uri differs from the authorize step")
        verifier = form.get("code_verifier", "")
        digest = hashlib.sha256(verifier.encode()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != pending.challenge:
            return 400, _error("invalid_grant", "PKCE verification failed")
        return 200, self._answer(self.issue())

    def _refresh(self, form: dict[str, str]) -> tuple[int, Any]:
        with self._lock:
            self.refreshes += 1
        if self.refresh_delay:
            time.sleep(self.refresh_delay)
        token = form.get("refresh_token", "")
        with self._lock:
            current = token in self._refresh_tokens
            self._refresh_tokens.discard(token)  # rotated: never accepted again
        if self.refuse_refresh or not current:
            return 400, _error("invalid_grant", "The refresh token is invalid or was used")
        return 200, self._answer(self.issue())

    @staticmethod
    def _answer(issued: Issued) -> dict[str, Any]:
        return {
            "access_token": issued.access,
            "refresh_token": issued.refresh,
            "id_token": issued.id_token,
            "token_type": "Bearer",
            "expires_in": issued.expires_in,
        }


def _error(code: str, description: str) -> dict[str, str]:
    return {"error": code, "error_description": description}


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True

    def __init__(self, owner: FakeIssuer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path != "/oauth/authorize":
            self._send(404, {}, {"error": "not_found"})
            return
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        self._send(*self.server.owner.authorize(query))

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode()
        if urlsplit(self.path).path != "/oauth/token":
            self._send(404, {}, {"error": "not_found"})
            return
        form = {k: v[0] for k, v in parse_qs(body).items()}
        status, answer = self.server.owner.token(form, self.headers.get("content-type", ""))
        self._send(status, {}, answer)

    def _send(self, status: int, headers: dict[str, str], body: Any) -> None:
        payload = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"content-type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
