"""Projects and API keys, and the one check of a presented key (:func:`authenticate`).

A key is ``kyr_`` + 32 random bytes (url-safe base64, 43 characters): shown once, when it is
made. Only a keyed hash is stored (HMAC-SHA256 under the server's secret, ``secret.key`` in
``$KYRONIX_HOME`` or ``KYRONIX_KEY_SECRET``), with a short display prefix (``kyr_AbCdEfGh``).
A presented key is hashed and looked up by its hash, and the stored hash is compared with
:func:`hmac.compare_digest`: nothing about a key is compared byte by byte in variable time.
Last use is recorded, at most once a minute per key (a write per request would serialize every
request on the database's one writer for a timestamp).

:func:`authenticate` is the only place a key is believed: the HTTP routes, the tunnel's ``/ws``
and anything else that takes a key call it. It rate-limits, looks the key up by its hash,
refuses a revoked one and records last use; every refusal is a :class:`KeyRefused` that says
what was wrong.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import os
import re
import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update
from sqlalchemy.exc import IntegrityError

from kyronix.errors import KyronixError, KyronixUsageError
from kyronix.server import billing
from kyronix.server.cluster import tell_every_replica
from kyronix.server.db import Database, api_keys, now_ms, projects
from kyronix.server.ratelimit import FailureThrottle, RateLimiter

__all__ = [
    "KEY_PATTERN",
    "KeyCheck",
    "KeyInfo",
    "KeyRefused",
    "Project",
    "authenticate",
    "bearer",
    "create_key",
    "create_project",
    "find_project",
    "hash_key",
    "list_keys",
    "load_secret",
    "lookup_key",
    "rename_project",
    "revoke_key",
    "revoked_among",
    "too_many_failures",
]

KEY_PREFIX = "kyr_"
KEY_PATTERN = re.compile(r"kyr_[A-Za-z0-9_-]{43}")
PROJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
LAST_USE_EVERY_MS = 60_000


@dataclass(frozen=True)
class Project:
    id: str
    name: str
    created_at: int
    credits: int


@dataclass(frozen=True)
class KeyInfo:
    id: str
    project_id: str
    prefix: str
    name: str | None
    created_at: int
    last_used_at: int | None
    revoked_at: int | None


def load_secret(home: Path, configured: bytes | None = None) -> bytes:
    """The key-hashing secret: ``configured`` (``KYRONIX_KEY_SECRET``), else ``secret.key`` in
    ``home``, made (0600, 32 random bytes) on first use."""
    if configured:
        return configured
    path = home / "secret.key"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    if len(data) >= 32:
        return data
    fresh = secrets.token_bytes(32)
    tmp = home / f".secret.key.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, fresh)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never clobber a secret another process just made
    except FileExistsError:
        os.unlink(tmp)
        return path.read_bytes()
    os.unlink(tmp)
    return fresh


def hash_key(secret: bytes, key: str) -> str:
    return hmac.new(secret, key.encode("utf-8"), hashlib.sha256).hexdigest()


def _project(row: Any) -> Project:
    return Project(row.id, row.name, row.created_at, row.credits)


def _check_name(name: str) -> None:
    if not PROJECT_NAME.fullmatch(name):
        raise KyronixUsageError(
            f"invalid project name {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit"
        )


def _name_taken(owner_id: str, name: str) -> KyronixUsageError:
    """The refusal of a name the owner already uses: it speaks of the owner's projects only."""
    whose = "your projects" if owner_id else "the operator's projects"
    return KyronixUsageError(f"a project named {name!r} already exists among {whose}")


def create_project(
    conn: Connection, name: str, initial_credits: int, *, owner_id: str = ""
) -> Project:
    """A new project of ``owner_id`` (a user's id; ``""``: the operator's) with
    ``initial_credits`` granted in the ledger (one transaction: the caller's). Names are unique
    per owner: the check, and its refusal, see the owner's own projects only."""
    _check_name(name)
    mine = (projects.c.owner_id == owner_id) & (projects.c.name == name)
    if conn.execute(select(projects.c.id).where(mine)).first():
        raise _name_taken(owner_id, name)
    pid = f"proj_{secrets.token_hex(8)}"
    at = now_ms()
    try:
        with conn.begin_nested():  # a racing insert of the same name: the same refusal
            conn.execute(
                projects.insert().values(
                    id=pid, name=name, created_at=at, credits=0, owner_id=owner_id
                )
            )
    except IntegrityError:
        raise _name_taken(owner_id, name) from None
    if initial_credits:
        billing.grant(conn, pid, initial_credits, note="project created")
    return Project(pid, name, at, initial_credits)


def rename_project(conn: Connection, project_id: str, name: str) -> Project | None:
    """Give the project a new name (the rules of :func:`create_project`, among its owner's
    projects); None: no project."""
    _check_name(name)
    owner_id = conn.execute(
        select(projects.c.owner_id).where(projects.c.id == project_id)
    ).scalar_one_or_none()
    if owner_id is None:
        return None
    taken = conn.execute(
        select(projects.c.id).where(
            (projects.c.owner_id == owner_id)
            & (projects.c.name == name)
            & (projects.c.id != project_id)
        )
    ).first()
    if taken:
        raise _name_taken(owner_id, name)
    try:
        with conn.begin_nested():
            conn.execute(update(projects).where(projects.c.id == project_id).values(name=name))
    except IntegrityError:
        raise _name_taken(owner_id, name) from None
    return get_project(conn, project_id)


def find_project(conn: Connection, ref: str) -> Project | None:
    """A project by id, else by name (the operator's CLI: every owner's projects). A name that
    several owners use is refused, with the ids to choose from."""
    row = conn.execute(select(projects).where(projects.c.id == ref)).first()
    if row is not None:
        return _project(row)
    rows = conn.execute(
        select(projects).where(projects.c.name == ref).order_by(projects.c.created_at)
    ).all()
    if len(rows) > 1:
        ids = ", ".join(r.id for r in rows)
        raise KyronixUsageError(f"{len(rows)} projects are named {ref!r}; use its id: {ids}")
    return _project(rows[0]) if rows else None


def get_project(conn: Connection, project_id: str) -> Project | None:
    row = conn.execute(select(projects).where(projects.c.id == project_id)).first()
    return _project(row) if row is not None else None


def list_projects(conn: Connection) -> list[Project]:
    return [_project(r) for r in conn.execute(select(projects).order_by(projects.c.created_at))]


def create_key(
    conn: Connection, secret: bytes, project_id: str, name: str | None = None
) -> tuple[str, KeyInfo]:
    """A new key for the project: (the key itself, shown once; what is stored)."""
    raw = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    key = KEY_PREFIX + raw
    info = KeyInfo(
        id=f"key_{secrets.token_hex(6)}",
        project_id=project_id,
        prefix=key[:12],
        name=name,
        created_at=now_ms(),
        last_used_at=None,
        revoked_at=None,
    )
    conn.execute(
        api_keys.insert().values(
            id=info.id,
            project_id=project_id,
            prefix=info.prefix,
            hash=hash_key(secret, key),
            name=name,
            created_at=info.created_at,
        )
    )
    return key, info


def _key(row: Any) -> KeyInfo:
    return KeyInfo(
        row.id, row.project_id, row.prefix, row.name, row.created_at, row.last_used_at,
        row.revoked_at,
    )  # fmt: skip


def list_keys(conn: Connection, project_id: str | None = None) -> list[KeyInfo]:
    query = select(api_keys).order_by(api_keys.c.created_at)
    if project_id is not None:
        query = query.where(api_keys.c.project_id == project_id)
    return [_key(r) for r in conn.execute(query)]


def revoke_key(conn: Connection, ref: str) -> KeyInfo | None:
    """Revoke a key by its id or display prefix; None if no such key."""
    row = conn.execute(
        select(api_keys).where((api_keys.c.id == ref) | (api_keys.c.prefix == ref))
    ).first()
    if row is None:
        return None
    if row.revoked_at is None:
        conn.execute(update(api_keys).where(api_keys.c.id == row.id).values(revoked_at=now_ms()))
        # every replica closes the key's open connections at once (each also finds it by
        # itself within half a second: the revocation watch)
        tell_every_replica(conn, "revoked", {"keyId": row.id})
    return _key(conn.execute(select(api_keys).where(api_keys.c.id == row.id)).one())


_BY_HASH = select(api_keys).where(api_keys.c.hash == bindparam("b_hash"))


def lookup_key(conn: Connection, secret: bytes, key: str) -> KeyInfo | None:
    """The live (not revoked) key ``key`` names, or None. ``key`` must already match
    :data:`KEY_PATTERN`."""
    digest = hash_key(secret, key)
    row = conn.execute(_BY_HASH, {"b_hash": digest}).first()
    if row is None or not hmac.compare_digest(row.hash, digest) or row.revoked_at is not None:
        return None
    return _key(row)


def revoked_among(conn: Connection, key_ids: Collection[str]) -> set[str]:
    """Those of ``key_ids`` that are revoked (or gone)."""
    ids = list(key_ids)
    if not ids:
        return set()
    live = {
        r.id
        for r in conn.execute(
            select(api_keys.c.id).where(api_keys.c.id.in_(ids) & api_keys.c.revoked_at.is_(None))
        )
    }
    return set(ids) - live


def touch_key(conn: Connection, key_id: str, at: int) -> None:
    conn.execute(update(api_keys).where(api_keys.c.id == key_id).values(last_used_at=at))


def count_keys(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(api_keys)).scalar_one())


# --------------------------------------------------------------------------- the key check

_BEARER = re.compile(r"Bearer\s+(\S+)\s*", re.IGNORECASE)


class KeyRefused(KyronixError):
    """A presented key was not accepted: ``status`` 401 (``missing_api_key``,
    ``invalid_api_key``) or 429 (``rate_limited``, with ``retry_after`` seconds)."""

    def __init__(
        self, status: int, code: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status_code=status)
        self.status = status
        self.code = code
        self.retry_after = retry_after


def bearer(header: str | None) -> str | None:
    """The key of an ``Authorization: Bearer …`` header ("" for a malformed header, None for
    none)."""
    if not header:
        return None
    m = _BEARER.fullmatch(header)
    return m.group(1) if m else ""


class KeyCheck:
    """What :func:`authenticate` needs, once per server: the database, the hashing secret, the
    rate limiter, the failed-authentication throttle and when each key's last use was last
    written. ``background(fn)`` runs a blocking function off the request path (the last-use
    write)."""

    def __init__(
        self,
        db: Database,
        secret: bytes,
        limiter: RateLimiter,
        failures: FailureThrottle,
        background: Callable[[Callable[[], object]], None] | None = None,
    ) -> None:
        self.db = db
        self.secret = secret
        self.limiter = limiter
        self.failures = failures
        self.background = background
        self.touched: dict[str, int] = {}


def too_many_failures(wait: float) -> KeyRefused:
    seconds = max(1, math.ceil(wait))
    return KeyRefused(
        429,
        "too_many_failures",
        f"too many failed authentications from this address; try again in {seconds} s",
        wait,
    )


def authenticate(check: KeyCheck, presented: str | None, client: str | None = None) -> KeyInfo:
    """The live key ``presented`` names, or :class:`KeyRefused`. In order: the failures of the
    client's address (an address that failed too often is refused before anything is checked:
    429 ``too_many_failures``), the rate limit (a bucket per presented key), the key's shape,
    its look-up by hash, revocation. A malformed, unknown or revoked key counts as a failure of
    ``client``. Last use is recorded at most every :data:`LAST_USE_EVERY_MS`."""
    if presented is None:
        raise KeyRefused(
            401, "missing_api_key", "send your API key as `Authorization: Bearer kyr_…`"
        )
    blocked = check.failures.wait(client)
    if blocked:
        raise too_many_failures(blocked)
    # A header may carry anything, a lone surrogate too: hashed as given, never an exception.
    raw = presented.encode("utf-8", "surrogatepass")
    bucket = hashlib.sha256(raw).hexdigest()[:32] if presented else "malformed"
    wait = check.limiter.take(bucket)
    if wait:
        raise KeyRefused(429, "rate_limited", "too many requests for this API key; slow down", wait)
    if not KEY_PATTERN.fullmatch(presented):
        check.failures.failed(client)
        raise KeyRefused(
            401, "invalid_api_key", "not a Kyronix API key: send `Bearer kyr_…` with a valid key"
        )
    info = check.db.read(lambda c: lookup_key(c, check.secret, presented))
    if info is None:
        check.failures.failed(client)
        raise KeyRefused(401, "invalid_api_key", "this API key is unknown or has been revoked")
    at = now_ms()
    last = check.touched.get(info.id, info.last_used_at or 0)
    if at - last >= LAST_USE_EVERY_MS:
        check.touched[info.id] = at

        def touch() -> None:
            check.db.write(lambda c: touch_key(c, info.id, at))

        if check.background is not None:
            check.background(touch)
        else:
            touch()
    return info
