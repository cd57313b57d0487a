"""Profiles, precedence, model selection, keys, and the registry."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import KisoError, Usage
from kiso.providers import registry
from kiso.runtime.auth import AuthError, AuthStore
from kiso.runtime.config import ConfigError, load_config
from kiso.runtime.models import resolve_model


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    return home, ws


DEEPSEEK = {
    "kind": "openai-compat",
    "model": "deepseek-chat",
    "apiKeyEnv": "DEEPSEEK_API_KEY",
    "baseUrl": "https://api.deepseek.com",
}
CLAUDE = {"kind": "anthropic", "model": "claude-sonnet-4-5", "promptCaching": True}


def test_precedence_flags_env_project_user(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    write(home / "config.json", {"model": "deepseek", "models": {"deepseek": DEEPSEEK,
          "claude": CLAUDE}, "mode": "accept-edits"})  # fmt: skip
    assert load_config(home, ws, environ={}).model == "deepseek"
    write(ws / ".kiso" / "config.json", {"model": "claude", "mode": "plan"})
    cfg = load_config(home, ws, environ={})
    assert (cfg.model, cfg.mode) == ("claude", "plan")
    assert cfg.models["claude"].prompt_caching is True
    cfg = load_config(home, ws, environ={"KISO_MODEL": "deepseek", "KISO_MODE": "bypass"})
    assert (cfg.model, cfg.mode) == ("deepseek", "bypass")
    cfg = load_config(
        home,
        ws,
        environ={"KISO_MODEL": "deepseek"},
        model="anthropic/claude-opus-4",
        mode="default",
    )
    assert (cfg.model, cfg.mode) == ("anthropic/claude-opus-4", "default")
    assert len(cfg.files) == 2


def test_project_profiles_override_user_ones_by_name(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    write(home / "config.json", {"models": {"deepseek": DEEPSEEK}})
    write(ws / ".kiso" / "config.json", {"models": {"deepseek": {**DEEPSEEK, "model": "other"}}})
    assert load_config(home, ws, environ={}).models["deepseek"].model == "other"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"model": "x", // the startup profile\n}', "remove the // and /* */ lines"),
        ("[1, 2]", "must be a JSON object"),
        ('{"modle": "x"}', "unknown key 'modle'"),
        ('{"models": {"d": {"kind": "openai-compat", "model": "m", "apikey": "K"}}}',
         "models.d.apikey: unknown key; did you mean apiKeyEnv?"),
        ('{"models": {"d": {"kind": "gemini", "model": "m"}}}', "models.d.kind"),
        ('{"models": {"d": {"kind": "anthropic"}}}', "models.d.model"),
        ('{"models": {"d": {"kind": "anthropic", "model": "m", "apiKeyEnv": "sk-ant-123 4"}}}',
         "never the key itself"),
        ('{"models": {"d": {"kind": "anthropic", "model": "m", "baseUrl": "ftp://x"}}}',
         "models.d.baseUrl"),
        ('{"mode": "yolo"}', "mode: must be one of"),
        # the same bound, in the same words, as KISO_CONTEXT_WINDOW
        ('{"models": {"d": {"kind": "anthropic", "model": "m", "contextWindow": 1}}}',
         "models.d.contextWindow=1: must be a whole number of tokens, from 256 to 100,000,000"),
        ('{"models": {"d": {"kind": "anthropic", "model": "m", "contextWindow": 255}}}',
         "models.d.contextWindow=255: must be a whole number of tokens, from 256 to 100,000,000"),
        ('{"models": {"d": {"kind": "anthropic", "model": "m", "contextWindow": 100000001}}}',
         "models.d.contextWindow=100000001: must be a whole number of tokens, from 256 to "
         "100,000,000"),
        ('{"models": {"d": {"kind": "anthropic", "model": "m", "contextWindow": "8000"}}}',
         'models.d.contextWindow="8000": must be a whole number of tokens, from 256 to '
         "100,000,000"),
    ],
)  # fmt: skip
def test_a_broken_user_config_names_the_file_and_the_key(
    dirs: tuple[Path, Path], text: str, message: str
) -> None:
    home, ws = dirs
    path = write(home / "config.json", text)
    with pytest.raises(ConfigError) as info:
        load_config(home, ws, environ={})
    assert str(path) in str(info.value) and message in str(info.value)


def test_the_smallest_window_a_profile_may_set_is_256_tokens(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    write(home / "config.json", {"models": {"d": {**CLAUDE, "contextWindow": 256}}})
    assert load_config(home, ws, environ={}).models["d"].context_window == 256


@pytest.mark.parametrize("key", ["floor", "theme"])
def test_floor_and_theme_belong_to_the_user_alone(dirs: tuple[Path, Path], key: str) -> None:
    home, ws = dirs
    write(home / "config.json", {"floor": "off", "theme": "dark"})
    cfg = load_config(home, ws, environ={})
    assert cfg.floor is False and cfg.theme == "dark"
    write(ws / ".kiso" / "config.json", {key: "off" if key == "floor" else "light"})
    with pytest.raises(ConfigError, match="only your user config"):
        load_config(home, ws, environ={})


def test_selection_without_config(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    cfg = load_config(home, ws, environ={})
    keyless = resolve_model(cfg, home=home, environ={})
    assert keyless.profile is None and keyless.describe() == "faux (keyless script)"
    both = {"OPENAI_API_KEY": "sk-o", "ANTHROPIC_API_KEY": "sk-a"}
    chosen = resolve_model(cfg, home=home, environ=both)
    assert chosen.profile is not None and chosen.profile.kind == "openai-compat"
    assert (chosen.api_key, chosen.key_source) == ("sk-o", "env:OPENAI_API_KEY")
    only_a = resolve_model(cfg, home=home, environ={"ANTHROPIC_API_KEY": "sk-a"})
    assert only_a.profile is not None and only_a.profile.kind == "anthropic"
    retargeted = resolve_model(
        cfg,
        home=home,
        environ={"OPENAI_API_KEY": "sk-o", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
    )
    assert retargeted.profile is not None
    assert retargeted.profile.origin == "http://127.0.0.1:9"
    assert retargeted.api_key == "sk-o"
    script = resolve_model(cfg, home=home, environ={"KISO_FAUX_SCRIPT": "/s.json", **both})
    assert script.profile is None and script.faux_script == "/s.json"


def test_direct_writes_and_unknown_names(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    env = {"ANTHROPIC_API_KEY": "sk-a", "DEEPSEEK_API_KEY": "sk-d"}
    direct = resolve_model(load_config(home, ws, environ={}, model="anthropic/claude-opus-4"),
                           home=home, environ=env)  # fmt: skip
    assert direct.profile is not None
    assert (direct.profile.kind, direct.profile.model) == ("anthropic", "claude-opus-4")
    ds = resolve_model(load_config(home, ws, environ={}, model="deepseek/deepseek-chat"),
                       home=home, environ=env)  # fmt: skip
    assert ds.profile is not None and ds.profile.origin == "https://api.deepseek.com"
    assert ds.api_key == "sk-d"
    with pytest.raises(ConfigError, match="no model profile named 'nope'"):
        resolve_model(load_config(home, ws, environ={}, model="nope"), home=home, environ=env)
    with pytest.raises(ConfigError, match="unknown provider 'acme'"):
        resolve_model(load_config(home, ws, environ={}, model="acme/x"), home=home, environ=env)


def test_a_stored_key_owns_its_vendor_and_never_leaves_its_origin(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    AuthStore(home).store("openai", "sk-stored")
    env = {"OPENAI_API_KEY": "sk-env", "GATEWAY_KEY": "gw-1"}
    # the environment route at OpenAI's own origin: the stored key wins (changed in 0.36)
    picked = resolve_model(load_config(home, ws, environ={}), home=home, environ=env)
    assert (picked.api_key, picked.key_source) == ("sk-stored", "stored:openai")
    # a profile pointing at a gateway uses its own variable, never the stored key
    write(home / "config.json", {"model": "gw", "models": {"gw": {
        "kind": "openai-compat", "model": "m", "baseUrl": "https://gateway.example/v1",
        "apiKeyEnv": "GATEWAY_KEY"}}})  # fmt: skip
    gw = resolve_model(load_config(home, ws, environ={}), home=home, environ=env)
    assert (gw.api_key, gw.key_source) == ("gw-1", "env:GATEWAY_KEY")
    # and a gateway profile without a variable gets no key at all
    bare = {"kind": "openai-compat", "model": "m", "baseUrl": "https://gateway.example/v1"}
    write(home / "config.json", {"model": "gw", "models": {"gw": bare}})
    assert resolve_model(load_config(home, ws, environ={}), home=home, environ=env).api_key is None


def test_an_unusable_stored_key_is_a_loud_error(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    AuthStore(home).store("anthropic", "sk-ant")
    data = json.loads((home / "auth.json").read_text())
    data["credentials"]["anthropic"]["key"] = ""
    (home / "auth.json").write_text(json.dumps(data))
    cfg = load_config(home, ws, environ={}, model="anthropic/claude-sonnet-4-5")
    with pytest.raises(AuthError, match="kiso login anthropic"):
        resolve_model(cfg, home=home, environ={"ANTHROPIC_API_KEY": "sk-env"})


def test_a_named_variable_that_is_not_set_is_a_clear_error(dirs: tuple[Path, Path]) -> None:
    home, ws = dirs
    write(home / "config.json", {"model": "deepseek", "models": {"deepseek": DEEPSEEK}})
    with pytest.raises(AuthError, match=r"\$DEEPSEEK_API_KEY, which is not set"):
        resolve_model(load_config(home, ws, environ={}), home=home, environ={})
    assert (
        "DEEPSEEK_API_KEY"
        in resolve_model(
            load_config(home, ws, environ={}), home=home, environ={"DEEPSEEK_API_KEY": "x"}
        ).strip_env
    )


def test_the_auth_file_is_private_and_replaced_whole(dirs: tuple[Path, Path]) -> None:
    home, _ = dirs
    store = AuthStore(home)
    store.store("deepseek", "  sk-d-123456789  \n")
    store.store("zai", "z-123456789")
    assert stat.S_IMODE((home / "auth.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert [(c.provider, c.key) for c in store.all()] == [
        ("deepseek", "sk-d-123456789"),
        ("zai", "z-123456789"),
    ]
    assert not [p for p in os.listdir(home) if p.endswith(".tmp")]
    assert store.remove("zai") and not store.remove("zai")
    with pytest.raises(AuthError, match="unknown provider"):
        store.store("acme", "k")
    with pytest.raises(AuthError, match="not an API key"):
        store.store("openai", "two words")
    (home / "auth.json").write_text("{oops")
    with pytest.raises(AuthError, match="not valid JSON"):
        store.get("openai")


def test_the_registry_is_dated_and_never_invents_a_price() -> None:
    for row in registry.MODELS:
        assert row.as_of and row.source, row.id
    gpt = registry.lookup("gpt-4o-2024-08-06")
    assert gpt.id == "gpt-4o"
    assert registry.lookup("mystery-model") is registry.DEFAULT
    assert registry.cost("mystery-model", Usage(100, 100)) is None
    assert registry.cost("claude-sonnet-5", Usage(100, 100)) is None  # no published price
    assert registry.cost("gpt-4o", Usage(input=None, output=5)) is None
    assert registry.cost("gpt-4o", Usage(1_000_000, 1_000_000)) == pytest.approx(12.5)
    assert registry.check_effort("gpt-5", "high") == "high"
    with pytest.raises(KisoError, match="no effort level 'turbo'; its levels: minimal"):
        registry.check_effort("gpt-5", "turbo")
    with pytest.raises(KisoError, match="takes no effort setting"):
        registry.check_effort("gpt-4o", "high")


def test_an_effort_the_model_lacks_is_refused_when_the_profile_is_chosen(
    dirs: tuple[Path, Path],
) -> None:
    home, ws = dirs
    write(home / "config.json", {"model": "x", "models": {"x": {
        "kind": "openai-compat", "model": "gpt-4o", "effort": "high"}}})  # fmt: skip
    with pytest.raises(KisoError, match="gpt-4o has no effort level 'high'"):
        resolve_model(load_config(home, ws, environ={}), home=home, environ={"OPENAI_API_KEY": "k"})
