"""The ChatGPT sign-in in use: the bearer on the wire, renewal, refusal, origin binding.

A fake issuer (``oauth_server.FakeIssuer``) and a fake Responses endpoint (``SSEServer``
speaking the Responses streaming events of ``test_openai_responses``) run on 127.0.0.1; the
model requests go through the real ``openai-responses`` adapter and the official SDK, in this
process or in real ``kiso -p`` processes where the claim is about several processes.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiso.cli.picker import profile_rows
from kiso.providers import ProviderError
from kiso.runtime import Agent
from kiso.runtime.auth import AuthError, AuthStore, OAuthCredential
from kiso.runtime.config import load_config
from kiso.runtime.models import ResolvedModel, build_adapter, resolve_model
from kiso.runtime.oauth import ChatGPTBearer, ChatGPTSettings, Tokens, credential_from

from .oauth_server import ACCOUNT, CLIENT_ID, FakeIssuer, Issued
from .sse import Reply, SSEServer
from .test_openai_responses import text_reply

BIN = Path(sys.executable).parent / "kiso"
ENV_SECRET = "sk-env-SECRET-9999"
DROP = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_MODEL", "KISO_FAUX_SCRIPT")


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    with FakeIssuer() as fake:
        yield fake


@pytest.fixture
def backend() -> Iterator[SSEServer]:
    """The ChatGPT backend's stand-in: every request gets a short streamed answer."""
    with SSEServer(lambda _: text_reply("Hi", " there.")) as server:
        yield server


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def sign_in(home: Path, issuer: FakeIssuer, origin: str, expires_in: int = 3600) -> Issued:
    """What `kiso login chatgpt` leaves behind (tests/cli/test_login_chatgpt.py runs it)."""
    issued = issuer.issue(expires_in)
    settings = ChatGPTSettings(issuer.url, CLIENT_ID, origin, 0)
    expires = int(time.time() * 1000) + expires_in * 1000
    tokens = Tokens(issued.access, issued.refresh, expires, ACCOUNT)
    AuthStore(home).store_oauth(credential_from(tokens, settings))
    return issued


def use_profile(home: Path, base_url: str, **extra: Any) -> None:
    profile = {"kind": "openai-responses", "model": "gpt-5.5", "baseUrl": base_url, **extra}
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.json").write_text(
        json.dumps({"model": "chatgpt", "models": {"chatgpt": profile}})
    )


def kiso(ws: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), *args],
        cwd=ws,
        env={**_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in DROP}
    return {**base, "OPENAI_API_KEY": ENV_SECRET, "KISO_NO_BROWSER": "1"}


def chatgpt_entry(home: Path) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads((home / "auth.json").read_text())["credentials"]["chatgpt"]
    return entry


def everything_sent(server: SSEServer) -> str:
    return "\n".join(json.dumps(r.headers) + r.body.decode() for r in server.requests)


def run_in_process(home: Path, ws: Path) -> None:
    resolved = resolve_model(load_config(home, ws), home=home)
    assert resolved.key_source == "stored:chatgpt"
    agent = Agent(adapter=build_adapter(resolved), store=None, workspace=ws)
    with agent.session() as session:
        events = list(session.run_sync("hello"))
    assert events[-1].type == "terminal"
    assert events[-1].outcome.kind == "completed"  # type: ignore[union-attr]


# --------------------------------------------------------------------------- on the wire


def test_a_request_carries_the_bearer_and_the_account_to_the_profile_base_url(
    home: Path, ws: Path, issuer: FakeIssuer, backend: SSEServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_SECRET)
    issued = sign_in(home, issuer, backend.url)
    use_profile(home, backend.url + "/backend-api")
    run_in_process(home, ws)
    (request,) = backend.requests
    assert request.path == "/backend-api/responses"  # the Responses endpoint under baseUrl
    assert request.headers["authorization"] == f"Bearer {issued.access}"
    assert request.headers["chatgpt-account-id"] == ACCOUNT
    assert request.json["model"] == "gpt-5.5" and request.json["stream"] is True
    assert ENV_SECRET not in everything_sent(backend)  # the sign-in owns its origin
    assert issuer.refreshes == 0  # a fresh token is used as it is


def test_an_expiring_token_is_renewed_first_and_the_next_process_reuses_it(
    home: Path, ws: Path, issuer: FakeIssuer, backend: SSEServer
) -> None:
    first = sign_in(home, issuer, backend.url, expires_in=30)  # inside the 60 s margin
    use_profile(home, backend.url + "/backend-api")
    out = kiso(ws, "-p", "hello")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Hi there."
    assert issuer.refreshes == 1
    renewed = issuer.issued[-1]
    assert renewed.access != first.access
    assert backend.requests[0].credential == renewed.access  # renewed BEFORE the request
    entry = chatgpt_entry(home)
    assert (entry["access"], entry["refresh"]) == (renewed.access, renewed.refresh)
    assert entry["accountId"] == ACCOUNT and "refreshRejectedAt" not in entry
    assert stat.S_IMODE((home / "auth.json").stat().st_mode) == 0o600

    again = kiso(ws, "-p", "hello again")
    assert again.returncode == 0, again.stderr
    assert issuer.refreshes == 1  # still fresh: not renewed a second time
    assert backend.requests[1].credential == renewed.access


def test_two_processes_renewing_at_once_spend_the_refresh_token_once(
    home: Path, ws: Path, issuer: FakeIssuer, backend: SSEServer
) -> None:
    sign_in(home, issuer, backend.url, expires_in=30)
    use_profile(home, backend.url + "/backend-api")
    issuer.refresh_delay = 0.5  # the renewals would overlap; the issuer rotates refresh tokens
    procs = [
        subprocess.Popen(
            [str(BIN), "-p", f"hello {i}"],
            cwd=ws,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    results = [(p, *p.communicate(timeout=60)) for p in procs]
    for proc, _, err in results:
        assert proc.returncode == 0, err
    assert issuer.refreshes == 1
    renewed = issuer.issued[-1]
    assert [r.credential for r in backend.requests] == [renewed.access, renewed.access]
    assert chatgpt_entry(home)["access"] == renewed.access


def test_a_refused_refresh_is_remembered_and_loud_and_never_falls_back(
    home: Path, ws: Path, issuer: FakeIssuer, backend: SSEServer
) -> None:
    sign_in(home, issuer, backend.url, expires_in=30)
    use_profile(home, backend.url + "/backend-api")
    issuer.refuse_refresh = True
    out = kiso(ws, "-p", "hello")
    assert out.returncode == 1
    assert "refused to renew" in out.stderr and "invalid_grant" in out.stderr
    assert "kiso login chatgpt" in out.stderr
    assert backend.requests == []  # nothing was sent: not the old token, not OPENAI_API_KEY
    entry = chatgpt_entry(home)
    assert isinstance(entry["refreshRejectedAt"], int)
    assert stat.S_IMODE((home / "auth.json").stat().st_mode) == 0o600

    later = kiso(ws, "-p", "hello")  # remembered: refused at once, the issuer is not asked again
    assert later.returncode == 1
    assert "refresh was refused" in later.stderr and "kiso login chatgpt" in later.stderr
    assert issuer.refreshes == 1 and backend.requests == []

    shown = kiso(ws, "auth")
    assert "refresh refused" in shown.stdout and "run kiso login chatgpt" in shown.stdout
    config = load_config(home, ws)
    rows = profile_rows(config, ResolvedModel(None, None, "none"), home)  # what /model lists
    (row,) = [r for r in rows if r.profile == "chatgpt"]
    assert not row.available and "refresh was refused" in row.state


def test_an_issuer_that_cannot_answer_now_is_retried_later_not_remembered(
    home: Path, ws: Path
) -> None:
    renewed = {"access_token": "at-new", "refresh_token": "rt-new", "expires_in": 3600}
    with SSEServer([Reply(503, {"error": "temporarily_unavailable"}), Reply(200, renewed)]) as fake:
        settings = ChatGPTSettings(fake.url, CLIENT_ID, "https://chatgpt.com", 0)
        expiring = Tokens("at-old", "rt-old", int(time.time() * 1000) + 5_000, ACCOUNT)
        AuthStore(home).store_oauth(credential_from(expiring, settings))
        bearer = ChatGPTBearer(AuthStore(home), settings)
        with pytest.raises(ProviderError) as failed:
            bearer()
        assert failed.value.retryable and "HTTP 503" in failed.value.message
        assert "refreshRejectedAt" not in chatgpt_entry(home)
        assert bearer() == ("at-new", {"chatgpt-account-id": ACCOUNT})  # the next try renews
        forms = [r.body.decode() for r in fake.requests]
    assert all(r.path == "/oauth/token" for r in fake.requests) and len(forms) == 2
    assert "grant_type=refresh_token" in forms[1] and "refresh_token=rt-old" in forms[1]
    entry = chatgpt_entry(home)
    assert (entry["access"], entry["refresh"], entry["accountId"]) == ("at-new", "rt-new", ACCOUNT)


# --------------------------------------------------------------------------- origin binding


def test_the_sign_in_is_never_sent_to_another_origin(
    home: Path, ws: Path, issuer: FakeIssuer, backend: SSEServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = sign_in(home, issuer, backend.url)
    with SSEServer(lambda _: text_reply("elsewhere")) as other:
        use_profile(home, other.url + "/backend-api")
        with pytest.raises(AuthError, match="only ever sent to") as refused:
            resolve_model(load_config(home, ws), home=home, environ={})
        assert backend.url in str(refused.value) and other.url in str(refused.value)
        out = kiso(ws, "-p", "hello")
        assert out.returncode == 1 and "only ever sent to" in out.stderr

        monkeypatch.setenv("OTHER_KEY", "other-key-1234")
        use_profile(home, other.url + "/v1", apiKeyEnv="OTHER_KEY")
        resolved = resolve_model(load_config(home, ws), home=home)
        assert resolved.key_source == "env:OTHER_KEY"
        agent = Agent(adapter=build_adapter(resolved), store=None, workspace=ws)
        with agent.session() as session:
            assert list(session.run_sync("hi"))[-1].type == "terminal"
        sent = everything_sent(other)
    assert other.requests[-1].credential == "other-key-1234"
    assert issued.access not in sent and ACCOUNT not in sent and issued.refresh not in sent
    assert backend.requests == []


def test_at_its_origin_the_sign_in_wins_and_speaks_only_the_responses_api(
    home: Path, ws: Path, issuer: FakeIssuer, backend: SSEServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = sign_in(home, issuer, backend.url)
    monkeypatch.setenv("SOME_KEY", "some-key-1234")
    use_profile(home, backend.url + "/backend-api", apiKeyEnv="SOME_KEY")
    run_in_process(home, ws)  # a stored credential owns its origin, whatever apiKeyEnv says
    assert backend.requests[-1].credential == issued.access
    compat = {"kind": "openai-compat", "model": "gpt-5.5", "baseUrl": backend.url + "/v1"}
    (home / "config.json").write_text(json.dumps({"model": "c", "models": {"c": compat}}))
    with pytest.raises(AuthError, match="speaks only the Responses API"):
        resolve_model(load_config(home, ws), home=home)


# --------------------------------------------------------------------------- logout, auth


def test_logout_removes_the_sign_in_and_the_environment_does_not_take_its_place(
    home: Path, ws: Path, issuer: FakeIssuer, backend: SSEServer
) -> None:
    sign_in(home, issuer, backend.url)
    AuthStore(home).store("deepseek", "sk-deep-1234567890")
    use_profile(home, backend.url + "/backend-api")
    out = kiso(ws, "logout", "chatgpt")
    assert out.returncode == 0 and "removed the ChatGPT sign-in" in out.stdout
    credentials = json.loads((home / "auth.json").read_text())["credentials"]
    assert set(credentials) == {"deepseek"}
    assert kiso(ws, "logout", "chatgpt").stdout.strip() == "no key was stored for chatgpt"
    run = kiso(ws, "-p", "hello", KISO_CHATGPT_ORIGIN=backend.url)
    assert run.returncode == 1 and "run `kiso login chatgpt`" in run.stderr
    assert backend.requests == []


def test_kiso_auth_shows_the_sign_in_masked_with_its_expiry(
    home: Path, ws: Path, issuer: FakeIssuer
) -> None:
    issued = sign_in(home, issuer, "https://chatgpt.com")
    out = kiso(ws, "auth")
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.strip().startswith("chatgpt")]
    assert "signed in" in line and "expires" in line and "UTC" in line
    assert f"{issued.access[:3]}…{issued.access[-4:]}" in line
    assert f"{ACCOUNT[:3]}…{ACCOUNT[-4:]}" in line
    for secret in (issued.access, issued.refresh, ACCOUNT):
        assert secret not in out.stdout
    entry = chatgpt_entry(home)
    entry["expires"] = 1_000_000_000_000  # long gone: renewed on the next request
    data = {"version": 1, "credentials": {"chatgpt": entry}}
    (home / "auth.json").write_text(json.dumps(data))
    expired = kiso(ws, "auth").stdout
    assert "expired 2001-09-09 01:46 UTC (renewed on next use)" in expired


# --------------------------------------------------------------------------- the stored file


def test_auth_files_of_earlier_shapes_keep_loading(home: Path, ws: Path) -> None:
    # the TypeScript original's shapes: "api-key" with savedAt; oauth without issuer/origin
    home.mkdir(parents=True, exist_ok=True)
    (home / "auth.json").write_text(
        json.dumps(
            {
                "version": 1,
                "credentials": {
                    "openai": {"type": "api-key", "key": "sk-old-12345678", "savedAt": 17},
                    "deepseek": {"type": "api_key", "key": "sk-d-12345678", "created": 18},
                    "chatgpt": {
                        "type": "oauth",
                        "access": "at-old",
                        "refresh": "rt-old",
                        "expires": 4_000_000_000_000,
                        "accountId": "acct-1",
                        "savedAt": 19,
                    },
                },
            }
        )
    )
    store = AuthStore(home)
    assert store.get("openai") is not None and store.get("openai").key == "sk-old-12345678"  # type: ignore[union-attr]
    assert [c.provider for c in store.all()] == ["chatgpt", "deepseek", "openai"]
    chatgpt = store.get_oauth("chatgpt")
    assert isinstance(chatgpt, OAuthCredential) and chatgpt.origin is None
    use_profile(home, "https://chatgpt.com/backend-api")  # the default origin
    resolved = resolve_model(load_config(home, ws), home=home, environ={})
    assert resolved.key_source == "stored:chatgpt" and resolved.bearer is not None
    assert resolved.bearer() == ("at-old", {"chatgpt-account-id": "acct-1"})


def test_an_unusable_sign_in_is_an_error_only_where_it_would_be_used(home: Path, ws: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    broken = {"type": "oauth", "access": "at", "expires": 5}  # no refresh token
    (home / "auth.json").write_text(json.dumps({"version": 1, "credentials": {"chatgpt": broken}}))
    use_profile(home, "https://chatgpt.com/backend-api")
    with pytest.raises(AuthError, match=r"unusable.*kiso login chatgpt"):
        resolve_model(load_config(home, ws), home=home, environ={"OPENAI_API_KEY": "sk-env"})
    claude = {"kind": "anthropic", "model": "claude-sonnet-4-5"}
    (home / "config.json").write_text(json.dumps({"model": "c", "models": {"c": claude}}))
    other = resolve_model(load_config(home, ws), home=home, environ={"ANTHROPIC_API_KEY": "k"})
    assert other.key_source == "env:ANTHROPIC_API_KEY"
