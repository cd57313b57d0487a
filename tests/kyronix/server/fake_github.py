"""A fake GitHub for sign-in tests: a real HTTP server on 127.0.0.1, in a thread.

It plays the three parts of GitHub's OAuth web flow that a Kyronix server talks to:

* ``GET /login/oauth/authorize`` — a user who approves at once: a 302 straight back to
  ``redirect_uri`` with a fresh ``code`` and the ``state`` it was given (or, after
  :meth:`FakeGitHub.deny`, with ``error=access_denied``);
* ``POST /login/oauth/access_token`` — trades a code (single use, bound to the client, the
  ``redirect_uri`` and the PKCE challenge) for a token; a bad one gets GitHub's 200
  ``{"error": "bad_verification_code"}``;
* ``GET /user`` and ``GET /api/v3/user`` (GitHub Enterprise's path) — the signed-in user.

Use::

    with FakeGitHub() as gh:
        gh.sign_in_as("octocat", id=583231, name="The Octocat")
        config = config.with_(**gh.config())        # in-process apps
        env = {**os.environ, **gh.env()}             # a `kyronix serve` child process
        ...
        assert gh.paths() == ["/login/oauth/authorize", "/login/oauth/access_token", ...]

``gh.url`` is the web origin (``KYRONIX_GITHUB_URL``); its API is ``gh.url + "/api/v3"`` (what
Kyronix assumes for a non-github.com origin) or ``gh.url`` itself (``KYRONIX_GITHUB_API_URL``).
Every request is recorded in ``gh.requests`` (:class:`Recorded`).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from base64 import urlsafe_b64encode
from dataclasses import dataclass, field
from hashlib import sha256
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

__all__ = ["CLIENT_ID", "CLIENT_SECRET", "FakeGitHub", "GitHubUser", "Recorded"]

CLIENT_ID = "Iv1.fakeclientid"
CLIENT_SECRET = "fake-client-secret"


@dataclass(frozen=True)
class GitHubUser:
    id: int
    login: str
    name: str | None = None

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "login": self.login, "name": self.name, "type": "User"}


@dataclass(frozen=True)
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    query: dict[str, str]
    form: dict[str, str]
    headers: dict[str, str]  # lower-cased names


@dataclass
class _Code:
    user: GitHubUser
    client_id: str
    redirect_uri: str
    challenge: str | None
    expires: float
    used: bool = False


@dataclass
class _State:
    users: dict[int, GitHubUser] = field(default_factory=dict)
    current: GitHubUser = field(default_factory=lambda: GitHubUser(1001, "octocat", "Octo Cat"))
    denied: bool = False
    token_error: str | None = None
    codes: dict[str, _Code] = field(default_factory=dict)
    tokens: dict[str, GitHubUser] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)


class FakeGitHub:
    """The fake; start it with ``with`` (or :meth:`start`), stop it with :meth:`stop`."""

    def __init__(self, client_id: str = CLIENT_ID, client_secret: str = CLIENT_SECRET) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self._state = _State()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- running ---------------------------------------------------------------------------

    def start(self) -> FakeGitHub:
        fake = self

        class Handler(_Handler):
            github = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering (connections are refused from now on: "GitHub is down")."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the test controls ------------------------------------------------------------

    def sign_in_as(
        self, login: str, *, id: int | None = None, name: str | None = None
    ) -> GitHubUser:
        """The GitHub user who approves from now on (the same ``id`` is the same account)."""
        with self._lock:
            if id is None:
                known = [u for u in self._state.users.values() if u.login == login]
                id = known[0].id if known else 1000 + len(self._state.users) + 1
            user = GitHubUser(id, login, name)
            self._state.users[id] = user
            self._state.current = user
            return user

    def deny(self, denied: bool = True) -> None:
        """The next authorizations are refused by the user (``error=access_denied``)."""
        with self._lock:
            self._state.denied = denied

    def fail_token_exchange(self, error: str | None = "bad_verification_code") -> None:
        """The token endpoint refuses every code with ``error`` (None: back to normal)."""
        with self._lock:
            self._state.token_error = error

    def config(self, *, enterprise_api: bool = True) -> dict[str, Any]:
        """``ServerConfig`` changes that point a server at this fake."""
        return {
            "github_client_id": self.client_id,
            "github_client_secret": self.client_secret,
            "github_url": self.url,
            "github_api_url": None if enterprise_api else self.url,
        }

    def env(self, *, enterprise_api: bool = True) -> dict[str, str]:
        """The environment variables that point a ``kyronix serve`` process at this fake."""
        env = {
            "KYRONIX_GITHUB_CLIENT_ID": self.client_id,
            "KYRONIX_GITHUB_CLIENT_SECRET": self.client_secret,
            "KYRONIX_GITHUB_URL": self.url,
        }
        if not enterprise_api:
            env["KYRONIX_GITHUB_API_URL"] = self.url
        return env

    # -- what the test reads ---------------------------------------------------------------

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._state.requests)

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def clear(self) -> None:
        with self._lock:
            self._state.requests.clear()

    # -- the handlers' side ----------------------------------------------------------------

    def _record(self, rec: Recorded) -> None:
        with self._lock:
            self._state.requests.append(rec)

    def _authorize(self, q: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        redirect_uri = q.get("redirect_uri", "")
        if q.get("client_id") != self.client_id or not redirect_uri.startswith("http"):
            return 404, {"content-type": "text/plain"}, b"no such OAuth application\n"
        back: dict[str, str] = {}
        with self._lock:
            if self._state.denied:
                back["error"] = "access_denied"
                back["error_description"] = "The user has denied your application access."
            else:
                code = secrets.token_hex(10)
                challenge = q.get("code_challenge")
                if challenge and q.get("code_challenge_method", "plain") != "S256":
                    return 400, {"content-type": "text/plain"}, b"unsupported PKCE method\n"
                self._state.codes[code] = _Code(
                    self._state.current, self.client_id, redirect_uri, challenge, time.time() + 600
                )
                back["code"] = code
        if "state" in q:
            back["state"] = q["state"]
        sep = "&" if "?" in redirect_uri else "?"
        return 302, {"location": redirect_uri + sep + urlencode(back)}, b""

    def _access_token(self, form: dict[str, str], auth: str) -> dict[str, Any]:
        client_id, client_secret = form.get("client_id"), form.get("client_secret")
        if auth.lower().startswith("basic "):
            import base64

            decoded = base64.b64decode(auth[6:]).decode()
            client_id, _, client_secret = decoded.partition(":")
        if client_id != self.client_id or client_secret != self.client_secret:
            return {"error": "incorrect_client_credentials", "error_description": "bad client"}
        with self._lock:
            if self._state.token_error:
                return {"error": self._state.token_error, "error_description": "refused"}
            code = self._state.codes.get(form.get("code", ""))
            bad = {
                "error": "bad_verification_code",
                "error_description": "The code passed is incorrect or expired.",
            }
            if code is None or code.used or code.expires < time.time():
                return bad
            code.used = True  # a code is spent by its first exchange, right or wrong
            if form.get("redirect_uri") not in (None, code.redirect_uri):
                return {"error": "redirect_uri_mismatch", "error_description": "wrong uri"}
            if code.challenge is not None:
                verifier = form.get("code_verifier", "")
                digest = urlsafe_b64encode(sha256(verifier.encode()).digest()).rstrip(b"=")
                if digest.decode() != code.challenge:
                    return bad
            token = "gho_" + secrets.token_hex(18)
            self._state.tokens[token] = code.user
        return {"access_token": token, "token_type": "bearer", "scope": "read:user"}

    def _user(self, auth: str) -> tuple[int, dict[str, Any]]:
        scheme, _, token = auth.partition(" ")
        with self._lock:
            user = self._state.tokens.get(token) if scheme.lower() in ("bearer", "token") else None
        if user is None:
            return 401, {"message": "Bad credentials"}
        return 200, user.json()


class _Handler(BaseHTTPRequestHandler):
    github: FakeGitHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def _request(self) -> tuple[str, dict[str, str], dict[str, str]]:
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query))
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        form = dict(parse_qsl(body)) if body else {}
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.github._record(Recorded(self.command, parts.path, query, form, headers))
        return parts.path, query, form

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: dict[str, Any]) -> None:
        self._send(status, {"content-type": "application/json"}, json.dumps(data).encode())

    def do_GET(self) -> None:
        path, query, _ = self._request()
        if path == "/login/oauth/authorize":
            self._send(*self.github._authorize(query))
        elif path in ("/user", "/api/v3/user"):
            self._json(*self.github._user(self.headers.get("authorization", "")))
        else:
            self._json(404, {"message": "Not Found"})

    def do_POST(self) -> None:
        path, _, form = self._request()
        if path != "/login/oauth/access_token":
            self._json(404, {"message": "Not Found"})
            return
        answer = self.github._access_token(form, self.headers.get("authorization", ""))
        if "json" in self.headers.get("accept", ""):
            self._json(200, answer)
        else:  # GitHub's default answer is form-encoded
            body = urlencode({k: str(v) for k, v in answer.items()}).encode()
            self._send(200, {"content-type": "application/x-www-form-urlencoded"}, body)
