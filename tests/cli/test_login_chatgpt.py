"""`kiso login chatgpt` as a real process, against a fake issuer on 127.0.0.1.

The test plays the browser: it reads the authorize URL the process prints, follows it to the
fake issuer's ``/oauth/authorize``, which redirects to the process's own callback server (or the
test pastes the redirected address on the process's stdin instead).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from tests.providers.oauth_server import ACCOUNT, CLIENT_ID, FakeIssuer

BIN = Path(sys.executable).parent / "kiso"
ORIGIN = "http://127.0.0.1:9"  # the backend the sign-in is bound to; never contacted here
DROP = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_MODEL")


@dataclass
class Login:
    proc: subprocess.Popen[str]
    url: str
    printed: str

    @property
    def query(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(urlsplit(self.url).query).items()}

    def finish(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, self.printed + out, err


def start(issuer: FakeIssuer, **env: str) -> Login:
    base = {k: v for k, v in os.environ.items() if k not in DROP}
    proc = subprocess.Popen(
        [str(BIN), "login", "chatgpt"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **base,
            "KISO_NO_BROWSER": "1",
            "KISO_CHATGPT_ISSUER": issuer.url,
            "KISO_CHATGPT_CLIENT_ID": CLIENT_ID,
            "KISO_CHATGPT_ORIGIN": ORIGIN,
            "KISO_CHATGPT_CALLBACK_PORT": "0",
            **env,
        },
    )
    assert proc.stdout is not None
    printed = ""
    for line in proc.stdout:
        printed += line
        if line.strip().startswith(issuer.url + "/oauth/authorize?"):
            return Login(proc, line.strip(), printed)
    proc.wait(timeout=60)
    raise AssertionError(f"no authorize URL printed: {printed!r} {proc.stderr.read()!r}")  # type: ignore[union-attr]


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    with FakeIssuer() as fake:
        yield fake


_NO_PROXY = urllib.request.ProxyHandler({})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def browse(url: str, *, follow: bool = True) -> tuple[int, str, dict[str, str]]:
    """GET ``url`` the way the browser would: status, body, headers (redirects followed)."""
    handlers: list[Any] = [_NO_PROXY] if follow else [_NO_PROXY, _NoRedirect()]
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=30) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def stored(home: Path) -> dict[str, Any]:
    path = home / "auth.json"
    return json.loads(path.read_text())["credentials"] if path.exists() else {}


def test_the_browser_round_trip_stores_the_tokens_privately(home: Path, issuer: FakeIssuer) -> None:
    login = start(issuer)
    query = login.query
    assert query["client_id"] == CLIENT_ID  # the configured client, not the default
    assert query["response_type"] == "code"
    assert query["code_challenge_method"] == "S256"
    assert set(query["scope"].split()) >= {"openid", "offline_access"}
    redirect = urlsplit(query["redirect_uri"])
    assert (redirect.scheme, redirect.hostname, redirect.path) == (
        "http",
        "localhost",
        "/auth/callback",
    )
    assert len(query["state"]) >= 32 and len(query["code_challenge"]) == 43

    status, page, _ = browse(login.url)  # the issuer redirects to the callback
    code, out, err = login.finish()
    assert (status, code) == (200, 0), err
    assert "You are signed in" in page
    assert "signed in to ChatGPT" in out and "mode 0600" in out
    json.loads(out[out.index("{") :])  # the example profile is plain JSON

    (exchange,) = issuer.token_requests
    form = exchange.form
    assert exchange.content_type.startswith("application/x-www-form-urlencoded")
    assert form["grant_type"] == "authorization_code"
    assert form["redirect_uri"] == query["redirect_uri"] and form["client_id"] == CLIENT_ID
    digest = hashlib.sha256(form["code_verifier"].encode()).digest()
    assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == query["code_challenge"]

    auth = home / "auth.json"
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600
    entry = stored(home)["chatgpt"]
    (issued,) = issuer.issued
    assert entry["type"] == "oauth"
    assert (entry["access"], entry["refresh"]) == (issued.access, issued.refresh)
    assert entry["accountId"] == ACCOUNT  # read from the id token's claims
    assert isinstance(entry["expires"], int) and entry["expires"] > entry["savedAt"]
    assert (entry["issuer"], entry["clientId"], entry["origin"]) == (issuer.url, CLIENT_ID, ORIGIN)
    assert issued.access not in out + err and issued.refresh not in out + err

    again = start(issuer)  # every sign-in has its own verifier and state
    assert again.query["state"] != query["state"]
    assert again.query["code_challenge"] != query["code_challenge"]
    browse(again.url)
    assert again.finish()[0] == 0
    assert stored(home)["chatgpt"]["access"] == issuer.issued[-1].access


@pytest.mark.parametrize("state", ["forged-state", None])
def test_a_callback_with_a_wrong_or_missing_state_is_refused(
    home: Path, issuer: FakeIssuer, state: str | None
) -> None:
    login = start(issuer)
    # a redirect this sign-in did not start, sent straight to the callback
    params = {"code": "code-from-elsewhere", **({"state": state} if state else {})}
    status, page, _ = browse(f"{login.query['redirect_uri']}?{urlencode(params)}")
    code, _, err = login.finish()
    assert (status, code) == (400, 1)
    what = "has the wrong state" if state else "has no state"
    assert what in err and "nothing was stored" in err and "kiso login chatgpt" in err
    assert what in page
    assert issuer.token_requests == []  # the code was never exchanged
    assert "chatgpt" not in stored(home)


def test_an_error_callback_is_refused(home: Path, issuer: FakeIssuer) -> None:
    issuer.authorize_error = "access_denied"
    login = start(issuer)
    status, _, _ = browse(login.url)
    code, _, err = login.finish()
    assert (status, code) == (400, 1)
    assert "refused by" in err and "access_denied" in err and "The user said no" in err
    assert "nothing was stored" in err
    assert issuer.token_requests == [] and "chatgpt" not in stored(home)


def test_a_failed_token_exchange_stores_nothing(home: Path, issuer: FakeIssuer) -> None:
    issuer.fail_exchange = True
    login = start(issuer)
    status, page, _ = browse(login.url)
    code, _, err = login.finish()
    assert (status, code) == (400, 1)
    assert "token exchange" in err and "HTTP 400" in err and "invalid_grant" in err
    assert "The authorization code has expired" in page
    assert "nothing was stored" in err and "chatgpt" not in stored(home)


@pytest.mark.parametrize("paste", ["url", "code"])
def test_the_redirected_address_or_the_code_can_be_pasted(
    home: Path, issuer: FakeIssuer, paste: str
) -> None:
    login = start(issuer)
    # the browser is on another machine: the redirect never reaches the callback server
    status, _, headers = browse(login.url, follow=False)
    assert status == 302
    location = headers["location"] if "location" in headers else headers["Location"]
    line = location if paste == "url" else parse_qs(urlsplit(location).query)["code"][0]
    assert login.proc.stdin is not None
    login.proc.stdin.write(line + "\n")
    login.proc.stdin.flush()
    code, out, err = login.finish()
    assert code == 0, err
    assert "signed in to ChatGPT" in out
    assert stored(home)["chatgpt"]["access"] == issuer.issued[-1].access


def test_a_pasted_address_with_the_wrong_state_is_refused(home: Path, issuer: FakeIssuer) -> None:
    login = start(issuer)
    _, _, headers = browse(login.url, follow=False)
    location = headers.get("location") or headers["Location"]
    forged = location.replace(f"state={login.query['state']}", "state=forged")
    assert login.proc.stdin is not None
    login.proc.stdin.write(forged + "\n")
    login.proc.stdin.flush()
    code, _, err = login.finish()
    assert code == 1 and "has the wrong state" in err
    assert issuer.token_requests == [] and "chatgpt" not in stored(home)


def test_no_sign_in_before_the_timeout_is_a_clear_error(home: Path, issuer: FakeIssuer) -> None:
    login = start(issuer, KISO_CHATGPT_LOGIN_TIMEOUT="0.5")
    code, _, err = login.finish()
    assert code == 1
    assert "no sign-in arrived within 0.5 s" in err and "nothing was stored" in err
    assert "chatgpt" not in stored(home)


def test_an_http_issuer_that_is_not_loopback_is_refused(home: Path) -> None:
    out = subprocess.run(
        [str(BIN), "login", "chatgpt"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "KISO_NO_BROWSER": "1", "KISO_CHATGPT_ISSUER": "http://auth.example"},
    )
    assert out.returncode == 2 and "must be an https URL" in out.stderr
    assert not (home / "auth.json").exists()
