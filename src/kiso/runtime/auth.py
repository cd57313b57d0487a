"""Stored credentials: ``$KISO_HOME/auth.json`` (mode 0600, replaced atomically under a lock).

``kiso login <provider>`` stores an API key for one of the known vendors, or (``kiso login
chatgpt``) the tokens of the ChatGPT subscription sign-in (:mod:`kiso.runtime.oauth`); each is
only ever sent to its own origin. A stored credential *owns* its provider: while it is stored,
the vendor's environment variable is not used for that origin, and a stored credential that
cannot be used is a loud error, never a silent fall back to the environment.

The file (version 1; every shape below keeps loading)::

    {"version": 1, "credentials": {
      "deepseek": {"type": "api_key", "key": "...", "created": 1796…},
      "chatgpt": {"type": "oauth", "access": "...", "refresh": "...", "expires": 1796…,
                  "accountId": "...", "savedAt": 1796…, "refreshRejectedAt": 1796…,
                  "issuer": "https://auth.openai.com", "clientId": "...",
                  "origin": "https://chatgpt.com"}}}

Times are milliseconds since the epoch. An API key written by kiso's TypeScript original
(``"type": "api-key"``, ``"savedAt"``) reads the same. ``refreshRejectedAt`` is there once the
issuer refused a refresh: the sign-in is then unusable until ``kiso login chatgpt`` replaces it.
``issuer``, ``clientId`` and ``origin`` record where the tokens came from and where they may be
sent (absent: the defaults), so changing the configuration later never sends them elsewhere.

Every write goes through one path: the lock (``auth.json.lock``, ``flock``), a read of the file
as it is now, the change, a temporary file created 0600, fsync, rename, fsync of the folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiso.kernel import UsageError
from kiso.kernel.layout import make_private_dirs

__all__ = [
    "VENDORS",
    "AuthError",
    "AuthStore",
    "Credential",
    "OAuthCredential",
    "Vendor",
    "mask",
    "vendor_for_origin",
]


@dataclass(frozen=True, slots=True)
class Vendor:
    name: str
    origin: str
    env: str
    kind: str
    base_url: str
    default_model: str


VENDORS: dict[str, Vendor] = {
    "openai": Vendor(
        "openai", "https://api.openai.com", "OPENAI_API_KEY", "openai-compat",
        "https://api.openai.com/v1", "gpt-5",
    ),
    "anthropic": Vendor(
        "anthropic", "https://api.anthropic.com", "ANTHROPIC_API_KEY", "anthropic",
        "https://api.anthropic.com", "claude-sonnet-4-5",
    ),
    "deepseek": Vendor(
        "deepseek", "https://api.deepseek.com", "DEEPSEEK_API_KEY", "openai-compat",
        "https://api.deepseek.com", "deepseek-chat",
    ),
    "zai": Vendor(
        "zai", "https://api.z.ai", "ZAI_API_KEY", "openai-compat",
        "https://api.z.ai/api/paas/v4", "glm-4.6",
    ),
}  # fmt: skip
"""The vendors ``kiso login`` knows: their origin, key variable and default endpoint."""


def vendor_for_origin(origin: str) -> Vendor | None:
    return next((v for v in VENDORS.values() if v.origin == origin.lower()), None)


class AuthError(UsageError):
    """A credential problem: the message says which provider and what to do."""


@dataclass(frozen=True, slots=True)
class Credential:
    provider: str
    key: str
    created: int


@dataclass(frozen=True, slots=True)
class OAuthCredential:
    """A sign-in's tokens (``"type": "oauth"``); times in milliseconds since the epoch."""

    provider: str
    access: str
    refresh: str
    expires: int
    account_id: str | None = None
    saved_at: int = 0
    refresh_rejected_at: int | None = None
    """When the issuer refused to renew it; set, the credential is unusable."""
    issuer: str | None = None
    client_id: str | None = None
    origin: str | None = None
    """The only origin the access token is sent to (None: the provider's default)."""

    def entry(self) -> dict[str, Any]:
        """The credential as it is stored in auth.json."""
        out: dict[str, Any] = {
            "type": "oauth",
            "access": self.access,
            "refresh": self.refresh,
            "expires": self.expires,
            "savedAt": self.saved_at,
        }
        optional = {
            "accountId": self.account_id,
            "refreshRejectedAt": self.refresh_rejected_at,
            "issuer": self.issuer,
            "clientId": self.client_id,
            "origin": self.origin,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out


def mask(key: str) -> str:
    """Enough to recognise a key, never enough to use it."""
    if len(key) <= 8:
        return "****"
    return f"{key[:3]}…{key[-4:]}"


class AuthStore:
    def __init__(self, home: Path) -> None:
        self.path = home / "auth.json"
        self._lock_path = home / "auth.json.lock"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        make_private_dirs(self.path.parent)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> dict[str, Any]:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"version": 1, "credentials": {}}
        except OSError as exc:
            raise AuthError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise AuthError(
                f"{self.path} is not valid JSON ({exc}); fix it, or delete it and run "
                f"`kiso login <provider>` again"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("credentials"), dict):
            raise AuthError(
                f"{self.path} has no 'credentials' object; delete it and run `kiso login` again"
            )
        return data

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".auth.json.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (json.dumps(data, indent=2) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _entry(self, provider: str, entry: Any) -> Credential | OAuthCredential:
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind == "oauth":
            return self._oauth(provider, entry)
        if kind not in ("api_key", "api-key", None):
            raise AuthError(
                f"the credential stored for {provider} in {self.path} has an unknown type "
                f"{kind!r}; kiso never guesses at credentials: run `kiso login {provider}` again"
            )
        key = entry.get("key") if isinstance(entry, dict) else None
        if not isinstance(key, str) or not key.strip() or key != key.strip():
            raise AuthError(
                f"the credential stored for {provider} in {self.path} is unusable (no valid "
                f"key); run `kiso login {provider}` again, or `kiso logout {provider}` to use "
                f"{VENDORS[provider].env if provider in VENDORS else 'the environment'} instead"
            )
        created = entry.get("created", entry.get("savedAt"))
        return Credential(provider, key, created if _is_ms(created) else 0)

    def _oauth(self, provider: str, entry: dict[str, Any]) -> OAuthCredential:
        access, refresh, expires = entry.get("access"), entry.get("refresh"), entry.get("expires")
        if not (
            isinstance(access, str)
            and isinstance(refresh, str)
            and isinstance(expires, int)
            and _token(access)
            and _token(refresh)
            and _is_ms(expires)
        ):
            raise AuthError(
                f"the {provider} sign-in stored in {self.path} is unusable (its access token, "
                f"refresh token or expiry is missing); run `kiso login {provider}` again"
            )
        optional: dict[str, str | None] = {}
        for key in ("accountId", "issuer", "clientId", "origin"):
            value = entry.get(key)
            optional[key] = value if isinstance(value, str) and value else None
        rejected = entry.get("refreshRejectedAt")
        saved = entry.get("savedAt")
        return OAuthCredential(
            provider,
            access,
            refresh,
            expires,
            account_id=optional["accountId"],
            saved_at=saved if isinstance(saved, int) and _is_ms(saved) else 0,
            refresh_rejected_at=rejected
            if isinstance(rejected, int) and _is_ms(rejected)
            else None,
            issuer=optional["issuer"],
            client_id=optional["clientId"],
            origin=optional["origin"],
        )

    def get(self, provider: str) -> Credential | None:
        """The API key stored for ``provider``; a stored but unusable one is an error."""
        entry = self._read()["credentials"].get(provider)
        if entry is None:
            return None
        found = self._entry(provider, entry)
        if isinstance(found, OAuthCredential):
            raise AuthError(
                f"{self.path} holds a sign-in for {provider}, not an API key; run "
                f"`kiso logout {provider}` and `kiso login {provider}` again"
            )
        return found

    def get_oauth(self, provider: str) -> OAuthCredential | None:
        """The sign-in stored for ``provider``; a stored but unusable one is an error."""
        entry = self._read()["credentials"].get(provider)
        if entry is None:
            return None
        found = self._entry(provider, entry)
        if not isinstance(found, OAuthCredential):
            raise AuthError(
                f"{self.path} holds an API key under {provider}, not a sign-in; run "
                f"`kiso logout {provider}` and `kiso login {provider}` again"
            )
        return found

    def all(self) -> list[Credential | OAuthCredential]:
        credentials = self._read()["credentials"]
        return [self._entry(name, credentials[name]) for name in sorted(credentials)]

    def store(self, provider: str, key: str) -> None:
        if provider not in VENDORS:
            raise AuthError(f"unknown provider {provider!r}; kiso login knows {', '.join(VENDORS)}")
        key = key.strip()
        if not key or any(ch.isspace() for ch in key):
            raise AuthError("that is not an API key (it is empty or contains spaces)")
        self._put(provider, {"type": "api_key", "key": key, "created": _now_ms()})

    def store_oauth(self, credential: OAuthCredential) -> None:
        """Store (or replace) a sign-in."""
        self._put(credential.provider, credential.entry())

    def _put(self, provider: str, entry: dict[str, Any]) -> None:
        with self._locked():
            data = self._read()
            data.setdefault("version", 1)
            data["credentials"][provider] = entry
            self._write(data)

    def renew(
        self, provider: str, renew: Callable[[OAuthCredential], OAuthCredential]
    ) -> OAuthCredential:
        """Under the lock: read the sign-in as it is now (another process may have renewed it
        already), give it to ``renew``, and store what it returns if that differs. ``renew`` runs
        while the lock is held, so two processes never spend the same refresh token."""
        with self._locked():
            data = self._read()
            entry = data["credentials"].get(provider)
            if entry is None:
                raise AuthError(
                    f"the {provider} sign-in was removed from {self.path} (kiso logout?); run "
                    f"`kiso login {provider}` again"
                )
            current = self._entry(provider, entry)
            if not isinstance(current, OAuthCredential):
                raise AuthError(f"{self.path} holds an API key under {provider}, not a sign-in")
            renewed = renew(current)
            if renewed != current:
                data["credentials"][provider] = renewed.entry()
                self._write(data)
            return renewed

    def remove(self, provider: str) -> bool:
        with self._locked():
            data = self._read()
            if provider not in data["credentials"]:
                return False
            del data["credentials"][provider]
            self._write(data)
            return True


def _now_ms() -> int:
    return int(time.time() * 1000)


def _is_ms(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _token(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and not any(ch.isspace() for ch in value)
