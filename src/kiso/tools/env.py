"""The environment for child processes a model can drive (the shell tool, MCP stdio servers).

A model that can run ``env`` or ``printenv`` must not be able to read the credentials kiso itself
uses, so :func:`child_env` removes them: a list of well-known credential variables, every name
ending in ``_API_KEY`` or ``_AUTH_TOKEN`` (any case), the variables the configured model profiles
name, and ``KISO_FAILPOINT`` (test-only fault injection that must never leak into a child).
Everything else, including ``PATH``, ``HOME`` and non-secret settings such as ``OPENAI_BASE_URL``,
is passed through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["CREDENTIAL_NAMES", "CREDENTIAL_SUFFIXES", "child_env", "is_stripped"]

CREDENTIAL_NAMES: frozenset[str] = frozenset(
    {
        # model providers
        "OPENAI_API_KEY",
        "AZURE_OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "DEEPSEEK_API_KEY",
        "ZAI_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "MISTRAL_API_KEY",
        "GROQ_API_KEY",
        "XAI_API_KEY",
        "OPENROUTER_API_KEY",
        "TOGETHER_API_KEY",
        "FIREWORKS_API_KEY",
        "COHERE_API_KEY",
        "REPLICATE_API_TOKEN",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HUGGINGFACE_TOKEN",
        "KYRONIX_API_KEY",
        # clouds
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_BEARER_TOKEN_BEDROCK",
        "AZURE_CLIENT_SECRET",
        "AZURE_API_KEY",
        # code hosts
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "GH_ENTERPRISE_TOKEN",
        "GITHUB_ENTERPRISE_TOKEN",
        "GITLAB_TOKEN",
        # kiso internals that must never reach a child
        "KISO_FAILPOINT",
    }
)
"""Names removed exactly (compared case-insensitively)."""

CREDENTIAL_SUFFIXES: tuple[str, ...] = ("_API_KEY", "_AUTH_TOKEN")
"""Any name ending with one of these (case-insensitively) is removed."""


def is_stripped(name: str, also_strip: Iterable[str] = ()) -> bool:
    """True when :func:`child_env` would remove the variable ``name``."""
    return _stripped(name.upper(), _upper_names(also_strip))


def child_env(environ: Mapping[str, str], also_strip: Iterable[str] = ()) -> dict[str, str]:
    """Return a new dict: ``environ`` without credentials, ``also_strip`` names and KISO_FAILPOINT.

    ``also_strip`` is for the variables the configured model profiles read their keys from, which
    may have any name. ``environ`` itself is never modified.
    """
    extra = _upper_names(also_strip)
    return {name: value for name, value in environ.items() if not _stripped(name.upper(), extra)}


def _stripped(upper: str, extra: frozenset[str]) -> bool:
    return upper in CREDENTIAL_NAMES or upper in extra or upper.endswith(CREDENTIAL_SUFFIXES)


def _upper_names(names: Iterable[str]) -> frozenset[str]:
    # A lone string is one name, not an iterable of one-letter names.
    return frozenset([names.upper()] if isinstance(names, str) else (n.upper() for n in names))
