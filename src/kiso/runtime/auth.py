"""Stored credentials: ``$KISO_HOME/auth.json`` (mode 0600, replaced atomically under a lock).

``kiso login <provider>`` stores an API key for one of the known vendors; each vendor's key is
only ever sent to that vendor's own origin. A stored credential *owns* its vendor: while it is
stored, the vendor's environment variable is not used for that origin, and a stored credential
that cannot be used is a loud error, never a silent fall back to the environment.

The file::

    {"version": 1, "credentials": {"deepseek": {"type": "api_key", "key": "...", "created": 1796…}}}
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
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

    def get(self, provider: str) -> Credential | None:
        """The stored credential for ``provider``; a stored but unusable one is an error."""
        entry = self._read()["credentials"].get(provider)
        if entry is None:
            return None
        key = entry.get("key") if isinstance(entry, dict) else None
        if not isinstance(key, str) or not key.strip() or key != key.strip():
            raise AuthError(
                f"the credential stored for {provider} in {self.path} is unusable (no valid "
                f"key); run `kiso login {provider}` again, or `kiso logout {provider}` to use "
                f"{VENDORS[provider].env if provider in VENDORS else 'the environment'} instead"
            )
        created = entry.get("created")
        return Credential(provider, key, created if isinstance(created, int) else 0)

    def all(self) -> list[Credential]:
        return [
            c for name in sorted(self._read()["credentials"]) if (c := self.get(name)) is not None
        ]

    def store(self, provider: str, key: str) -> None:
        if provider not in VENDORS:
            raise AuthError(f"unknown provider {provider!r}; kiso login knows {', '.join(VENDORS)}")
        key = key.strip()
        if not key or any(ch.isspace() for ch in key):
            raise AuthError("that is not an API key (it is empty or contains spaces)")
        with self._locked():
            data = self._read()
            data.setdefault("version", 1)
            data["credentials"][provider] = {
                "type": "api_key",
                "key": key,
                "created": int(time.time() * 1000),
            }
            self._write(data)

    def remove(self, provider: str) -> bool:
        with self._locked():
            data = self._read()
            if provider not in data["credentials"]:
                return False
            del data["credentials"][provider]
            self._write(data)
            return True
