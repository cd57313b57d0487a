"""The sign-in's pure parts: PKCE, the authorize URL, token claims, the configuration."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest

from kiso.runtime.auth import AuthError
from kiso.runtime.oauth import (
    ChatGPTSettings,
    account_id_of,
    authorize_url,
    chatgpt_settings,
    new_pkce,
    new_state,
    s256,
    unverified_claims,
)
from tests.providers.oauth_server import ACCOUNT, jwt


def test_s256_is_the_rfc_7636_transform() -> None:
    # RFC 7636, appendix B
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert s256(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_every_pkce_pair_and_state_is_fresh_and_well_formed() -> None:
    pairs = [new_pkce() for _ in range(20)]
    assert len({p.verifier for p in pairs}) == 20 and len({new_state() for _ in range(20)}) == 20
    for pair in pairs:
        assert re.fullmatch(r"[A-Za-z0-9._~-]{43,128}", pair.verifier)  # RFC 7636 §4.1
        assert pair.challenge == s256(pair.verifier)


def test_the_authorize_url_asks_for_a_code_with_an_s256_challenge() -> None:
    settings = ChatGPTSettings("https://issuer.example", "client-1", "https://chatgpt.com", 1455)
    url = authorize_url(
        settings, redirect_uri="http://localhost:1455/auth/callback", challenge="ch", state="st"
    )
    parts = urlsplit(url)
    assert (
        f"{parts.scheme}://{parts.netloc}{parts.path}" == "https://issuer.example/oauth/authorize"
    )
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert query["response_type"] == "code" and query["client_id"] == "client-1"
    assert query["redirect_uri"] == "http://localhost:1455/auth/callback"
    assert (query["code_challenge"], query["code_challenge_method"]) == ("ch", "S256")
    assert query["state"] == "st" and "offline_access" in query["scope"].split()


def test_the_account_id_is_read_from_the_token_claims() -> None:
    id_token = jwt({"https://api.openai.com/auth": {"chatgpt_account_id": ACCOUNT}})
    assert unverified_claims(id_token)["https://api.openai.com/auth"] == {
        "chatgpt_account_id": ACCOUNT
    }
    assert account_id_of(id_token) == ACCOUNT
    assert account_id_of(None, "opaque-token", id_token) == ACCOUNT  # the first that names one
    assert account_id_of("a.b.c", "not-a-jwt", jwt({"sub": "x"})) is None
    assert unverified_claims("a.!!!.c") == {}


def test_the_defaults_are_openai_and_the_codex_client() -> None:
    settings = chatgpt_settings({})
    assert settings.issuer == "https://auth.openai.com"
    assert settings.token_endpoint == "https://auth.openai.com/oauth/token"
    assert settings.authorize_endpoint == "https://auth.openai.com/oauth/authorize"
    assert settings.client_id == "app_EMoamEEZ73f0CkXaXp7hrann"
    assert (settings.origin, settings.port) == ("https://chatgpt.com", 1455)


def test_the_configuration_comes_from_the_environment_and_is_checked() -> None:
    env = {
        "KISO_CHATGPT_ISSUER": "http://127.0.0.1:8080/",
        "KISO_CHATGPT_CLIENT_ID": "app_other",
        "KISO_CHATGPT_ORIGIN": "HTTP://LOCALHOST:9",
        "KISO_CHATGPT_CALLBACK_PORT": "0",
    }
    assert chatgpt_settings(env) == ChatGPTSettings(
        "http://127.0.0.1:8080", "app_other", "http://localhost:9", 0
    )
    for name, value, says in [
        ("KISO_CHATGPT_ISSUER", "http://auth.example", "https URL"),
        ("KISO_CHATGPT_ISSUER", "ftp://auth.example", "https URL"),
        ("KISO_CHATGPT_ORIGIN", "https://chatgpt.com/backend-api", "no path"),
        ("KISO_CHATGPT_ORIGIN", "http://chatgpt.example", "https URL"),
        ("KISO_CHATGPT_CALLBACK_PORT", "70000", "a port"),
        ("KISO_CHATGPT_CLIENT_ID", "two words", "not a client id"),
    ]:
        with pytest.raises(AuthError, match=says):
            chatgpt_settings({name: value})
