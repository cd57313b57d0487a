"""Choosing the model: a profile (or ``provider/model``), its key, and the adapter that speaks it.

Selection, first match wins:

1. the startup model after precedence (flag, ``KISO_MODEL``, project config, user config): a
   profile name, or ``provider/model`` written directly (``anthropic/claude-sonnet-4-5``,
   ``deepseek/deepseek-chat``, ``openai-responses/gpt-5``);
2. ``KISO_FAUX_SCRIPT``: the scripted model;
3. the environment alone: ``OPENAI_API_KEY`` (with ``OPENAI_BASE_URL`` and ``OPENAI_MODEL`` if
   set), else ``ANTHROPIC_API_KEY``; with both, OpenAI wins;
4. nothing: the keyless scripted mode (four scripted rounds, then a set-a-key message).

The key for a profile: if its endpoint is a known vendor's origin and a credential is stored for
that vendor, the stored one (it owns its vendor; an unusable one is an error). Otherwise the
variable the profile names in ``apiKeyEnv``; otherwise, at a vendor's origin, the vendor's own
variable. A stored key is never sent anywhere but its vendor's origin: a profile that points
elsewhere gets only its own ``apiKeyEnv``.

The ChatGPT sign-in (``kiso login chatgpt``, :mod:`kiso.runtime.oauth`) is bound to one origin
(``https://chatgpt.com`` unless ``KISO_CHATGPT_ORIGIN`` said otherwise when signing in). A
profile at that origin uses it while it is stored (it owns the origin, whatever ``apiKeyEnv``
says): an ``openai-responses`` profile gets a bearer source that renews the access token before
each request; a refresh the issuer refused, or any other kind, is an error. Without a stored
sign-in such a profile needs its ``apiKeyEnv``. While a sign-in is stored, an
``openai-responses`` profile at an origin that is neither the sign-in's nor a vendor's, with no
``apiKeyEnv``, is refused: it would otherwise run without a key, and the sign-in is never
forwarded there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kiso.providers.base import Adapter
from kiso.providers.registry import check_effort
from kiso.runtime.auth import VENDORS, AuthError, AuthStore, vendor_for_origin
from kiso.runtime.config import KINDS, Config, ConfigError, Profile

__all__ = ["THINKING_BUDGETS", "ResolvedModel", "build_adapter", "resolve_model"]


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    profile: Profile | None
    """None: the scripted model."""
    api_key: str | None
    key_source: str
    """Where the key came from: ``stored:<vendor>``, ``env:<NAME>`` or ``none``."""
    faux_script: str | None = None
    bearer: Callable[[], tuple[str, dict[str, str]]] | None = None
    """A sign-in's token source (``stored:chatgpt``): called before each request, it returns the
    access token (renewed when about to expire) and the headers that go with it."""

    @property
    def strip_env(self) -> tuple[str, ...]:
        """Variables to keep from model-driven children, besides the standard credential list."""
        names = {v.env for v in VENDORS.values()}
        if self.profile is not None and self.profile.api_key_env:
            names.add(self.profile.api_key_env)
        return tuple(sorted(names))

    def describe(self) -> str:
        if self.profile is None:
            return f"faux ({self.faux_script or 'keyless script'})"
        p = self.profile
        return f"{p.name} ({p.kind} {p.model}, key: {self.key_source})"


def _direct(spec: str) -> Profile:
    provider, _, model = spec.partition("/")
    if not model:
        raise ConfigError(f"--model {spec}: write provider/model, e.g. anthropic/claude-sonnet-4-5")
    vendor = VENDORS.get(provider)
    if vendor is not None:
        return Profile(spec, vendor.kind, model, base_url=vendor.base_url, source="direct")
    if provider in KINDS:
        return Profile(spec, provider, model, source="direct")
    known = ", ".join([*VENDORS, *KINDS])
    raise ConfigError(f"--model {spec}: unknown provider {provider!r}; known: {known}")


def _from_environment(env: Mapping[str, str]) -> Profile | None:
    if env.get("OPENAI_API_KEY"):
        vendor = VENDORS["openai"]
        base = env.get("OPENAI_BASE_URL") or vendor.base_url
        model = env.get("OPENAI_MODEL") or vendor.default_model
        return Profile(
            "openai", "openai-compat", model, "OPENAI_API_KEY", base, source="environment"
        )
    if env.get("ANTHROPIC_API_KEY"):
        vendor = VENDORS["anthropic"]
        base = env.get("ANTHROPIC_BASE_URL") or vendor.base_url
        model = env.get("ANTHROPIC_MODEL") or vendor.default_model
        return Profile(
            "anthropic", "anthropic", model, "ANTHROPIC_API_KEY", base, source="environment"
        )
    return None


def _key(profile: Profile, auth: AuthStore, env: Mapping[str, str]) -> tuple[str | None, str]:
    vendor = vendor_for_origin(profile.origin)
    if vendor is not None:
        stored = auth.get(vendor.name)  # raises when stored but unusable
        if stored is not None:
            return stored.key, f"stored:{vendor.name}"
    if profile.api_key_env:
        value = env.get(profile.api_key_env)
        if not value:
            raise AuthError(
                f"profile {profile.name} takes its key from ${profile.api_key_env}, which is not "
                f"set; export it (kiso never stores a key in config.json)"
            )
        return value, f"env:{profile.api_key_env}"
    if vendor is not None:
        value = env.get(vendor.env)
        if value:
            return value, f"env:{vendor.env}"
        raise AuthError(
            f"no key for {vendor.name}: run `kiso login {vendor.name}` or export {vendor.env}"
        )
    return None, "none"


def resolve_model(
    config: Config, *, home: Path, environ: Mapping[str, str] | None = None
) -> ResolvedModel:
    env = os.environ if environ is None else environ
    auth = AuthStore(home)
    spec = config.model
    profile: Profile | None = None
    if spec:
        profile = config.models.get(spec)
        if profile is None:
            if "/" not in spec:
                names = ", ".join(sorted(config.models)) or "none configured"
                raise ConfigError(
                    f"no model profile named {spec!r} (profiles: {names}); add it to "
                    f"~/.kiso/config.json, or write provider/model"
                )
            profile = _direct(spec)
    elif env.get("KISO_FAUX_SCRIPT"):
        return ResolvedModel(None, None, "none", env["KISO_FAUX_SCRIPT"])
    else:
        profile = _from_environment(env)
        if profile is None:
            return ResolvedModel(None, None, "none")
    check_effort(profile.model, profile.effort)
    signed_in = _chatgpt(profile, auth, env)
    if signed_in is not None:
        return signed_in
    key, source = _key(profile, auth, env)
    return ResolvedModel(profile, key, source)


def _chatgpt(profile: Profile, auth: AuthStore, env: Mapping[str, str]) -> ResolvedModel | None:
    """The ChatGPT sign-in's route for this profile, if it is on it (the module docstring)."""
    from kiso.runtime.oauth import CHATGPT, ChatGPTBearer, chatgpt_settings, refused_message

    settings = chatgpt_settings(env)
    try:
        stored = auth.get_oauth(CHATGPT)
    except AuthError:
        if profile.origin == settings.origin:
            raise
        return None  # unusable, and not this profile's business: it is never sent anywhere
    origin = settings.of(stored).origin if stored is not None else settings.origin
    name = profile.name
    if profile.origin == origin:
        if stored is None:
            if profile.api_key_env:
                return None
            raise AuthError(
                f"profile {name} talks to {origin}, the ChatGPT backend: run "
                f"`kiso login chatgpt` (or name its key's variable in apiKeyEnv)"
            )
        if profile.kind != "openai-responses":
            raise AuthError(
                f"profile {name}: the ChatGPT sign-in speaks only the Responses API; set its "
                f'"kind" to "openai-responses"'
            )
        if stored.refresh_rejected_at is not None:
            raise AuthError(f"profile {name}: {refused_message(stored)}")
        bearer = ChatGPTBearer(auth, settings)
        return ResolvedModel(profile, None, f"stored:{CHATGPT}", bearer=bearer)
    if (
        stored is not None
        and profile.kind == "openai-responses"
        and not profile.api_key_env
        and vendor_for_origin(profile.origin) is None
    ):
        raise AuthError(
            f"profile {name} points at {profile.origin}, and the ChatGPT sign-in is only ever "
            f"sent to {origin}: set its baseUrl to {origin}/backend-api to use the sign-in, or "
            f"name this endpoint's key variable in apiKeyEnv"
        )
    return None


THINKING_BUDGETS = {"low": 2_048, "medium": 8_192, "high": 24_576}
"""The extended-thinking budget (tokens) an Anthropic profile's ``effort`` asks for."""


def build_adapter(resolved: ResolvedModel) -> Adapter:
    """The adapter for a resolved model; provider SDKs are imported here, not before."""
    profile = resolved.profile
    if profile is None:
        from kiso.providers.faux import KEYLESS_SCRIPT, FauxAdapter

        if resolved.faux_script:
            return FauxAdapter.from_file(resolved.faux_script)
        return FauxAdapter(KEYLESS_SCRIPT, model="faux:keyless")
    if profile.kind == "anthropic":
        from kiso.providers.anthropic import AnthropicAdapter

        return AnthropicAdapter(
            model=profile.model,
            api_key=resolved.api_key,
            base_url=profile.base_url,
            provider=profile.name,
            prompt_caching=profile.prompt_caching,
            thinking_budget=THINKING_BUDGETS.get(profile.effort) if profile.effort else None,
        )
    if profile.kind == "openai-responses":
        from kiso.providers.openai_responses import OpenAIResponsesAdapter

        return OpenAIResponsesAdapter(
            model=profile.model,
            api_key=resolved.api_key,
            base_url=profile.base_url,
            provider=profile.name,
            reasoning_effort=profile.effort,
            bearer=resolved.bearer,
        )
    from kiso.providers.openai_compat import OpenAICompatAdapter

    return OpenAICompatAdapter(
        model=profile.model,
        api_key=resolved.api_key,
        base_url=profile.base_url,
        provider=profile.name,
        reasoning_effort=profile.effort,
    )
