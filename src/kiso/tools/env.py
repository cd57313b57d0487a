"""The environment for child processes a model can drive: kiso's ``shell`` tool, MCP stdio servers,
and the Kyronix executer's ``terminal``, git and browser. One function, one rule.

A model that can run ``env`` or ``printenv`` must not be able to read the credentials of the
process that started it, so :func:`child_env` removes, by rule rather than by a list that is
always one name short:

* every name that **contains** ``KEY``, ``TOKEN``, ``SECRET``, ``PASSWORD``, ``PASSWD``,
  ``CREDENTIAL`` or ``WEBHOOK``, or **ends** in ``_PAT``, ``_JWT`` or ``_AUTH`` (any case):
  ``PGPASSWORD``, ``NPM_CONFIG__AUTHTOKEN``, ``GH_PAT``, ``CI_JOB_JWT``, ``SLACK_WEBHOOK_URL``,
  ``AWS_SECRET_ACCESS_KEY``, ``MY_SERVICE_PASSWORD``...;
* every variable whose **value** holds a URL carrying a password (``scheme://user:pass@host``,
  ``redis://:pass@host``), whatever its name: ``DATABASE_URL``, ``REDIS_URL``, ``AMQP_URL``...;
* the agents' sockets: ``SSH_AUTH_SOCK`` and ``GPG_AGENT_INFO`` (a socket to an agent that signs
  and decrypts is a credential too);
* the exact names in :data:`CREDENTIAL_NAMES` (``DOCKER_AUTH_CONFIG``, ``SENTRY_DSN``: secrets
  whose names no rule matches), the names the caller adds
  with ``also_strip`` (the variables the configured model profiles read their keys from, which
  may have any name), and ``KISO_FAILPOINT`` (test-only fault injection).

Everything else passes through unchanged: ``PATH``, ``HOME``, ``USER``, ``SHELL``, ``PWD``,
``LANG`` and ``LC_*``, ``TERM``, ``TMPDIR``, ``OPENAI_BASE_URL`` and other settings. The rule is
broad on purpose: a name that merely looks like a secret (``KEYBOARD``, ``TOKENIZERS_PARALLELISM``)
is removed too; a child that needs one gets it because the caller says so with ``keep`` (names
passed through from ``environ`` as they are) or ``extra`` (values set explicitly). What the caller
passes explicitly always wins over the rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = [
    "CREDENTIAL_NAMES",
    "CREDENTIAL_SUBSTRINGS",
    "CREDENTIAL_SUFFIXES",
    "child_env",
    "is_stripped",
]

CREDENTIAL_NAMES: frozenset[str] = frozenset(
    {
        # agent sockets: whoever can talk to them can sign, decrypt and log in as the user
        "SSH_AUTH_SOCK",
        "GPG_AGENT_INFO",
        # credentials whose names no rule below matches
        "DOCKER_AUTH_CONFIG",
        "SENTRY_DSN",
        # kiso internals that must never reach a child
        "KISO_FAILPOINT",
    }
)
"""Names removed exactly (compared case-insensitively), whatever the rules say."""

CREDENTIAL_SUBSTRINGS: tuple[str, ...] = (
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "WEBHOOK",
)
"""A name containing one of these (case-insensitively) is removed."""

CREDENTIAL_SUFFIXES: tuple[str, ...] = ("_PAT", "_JWT", "_AUTH")
"""A name ending with one of these (case-insensitively) is removed."""

# scheme://[user]:password@  (the password non-empty), anywhere in the value: a list of URLs
# (REDIS_SENTINELS, a DSN inside other text) leaks as surely as one URL.
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:]*:[^\s/?#@]+@")


def is_stripped(
    name: str,
    also_strip: Iterable[str] = (),
    *,
    value: str | None = None,
    keep: Iterable[str] = (),
) -> bool:
    """True when :func:`child_env` would remove the variable ``name`` (holding ``value``, when
    given: a value that is a URL carrying a password is removed whatever its name)."""
    upper = name.upper()
    if upper in _upper_names(keep):
        return False
    return _stripped(upper, value, _upper_names(also_strip))


def child_env(
    environ: Mapping[str, str],
    also_strip: Iterable[str] = (),
    *,
    keep: Iterable[str] = (),
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return a new dict: ``environ`` without credentials (the rules in the module docstring),
    without the ``also_strip`` names, with the ``keep`` names passed through as they are in
    ``environ`` even when a rule matches them, and with ``extra`` set on top.

    ``environ`` itself is never modified. ``also_strip`` and ``keep`` take names (a lone string
    is one name); ``keep`` wins over ``also_strip`` and over the rules: it is the caller saying
    explicitly that the child needs that variable.
    """
    strip = _upper_names(also_strip)
    kept = _upper_names(keep)
    env = {
        name: value
        for name, value in environ.items()
        if name.upper() in kept or not _stripped(name.upper(), value, strip)
    }
    if extra:
        env.update(extra)
    return env


def _stripped(upper: str, value: str | None, extra: frozenset[str]) -> bool:
    return (
        upper in CREDENTIAL_NAMES
        or upper in extra
        or any(part in upper for part in CREDENTIAL_SUBSTRINGS)
        or upper.endswith(CREDENTIAL_SUFFIXES)
        or (value is not None and "://" in value and _URL_WITH_PASSWORD.search(value) is not None)
    )


def _upper_names(names: Iterable[str]) -> frozenset[str]:
    # A lone string is one name, not an iterable of one-letter names.
    return frozenset([names.upper()] if isinstance(names, str) else (n.upper() for n in names))
