"""The dashboard's people: users, the projects each may see, and one-time sign-in links.

A user signs in with GitHub (OAuth; :mod:`kyronix.server.dashboard.auth`) or with a one-time
link: ``kyronix serve`` prints one for the owner when no GitHub app is configured (like Jupyter's
token), ``kyronix users invite`` makes one for someone else. A link is a random token shown once;
only its keyed hash is stored (the API keys' HMAC, :func:`kyronix.server.accounts.hash_key`), it
expires, and it signs in once: redeeming it is one conditional update, so two browsers racing
with the same link get one session between them.

A user's first sign-in makes their first project, with the server's initial credits (in the
ledger). Those free credits come once per account, not per project: the first project made for
the account gets them (``kx_users.credits_granted_at`` records it), later ones start at 0 until
an operator grants more (``kyronix credits grant``). Project names are unique per owner: one
user's names neither collide with nor reveal another's. A user sees only the projects they are
a member of; every dashboard route checks it.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from kyronix.errors import KyronixUsageError
from kyronix.server import billing
from kyronix.server.accounts import Project, create_project, get_project, hash_key
from kyronix.server.db import (
    memberships,
    now_ms,
    projects,
    signin_links,
    spent_states,
    users,
    web_sessions,
)

__all__ = [
    "LINK_TTL_MS",
    "User",
    "close_web_session",
    "create_link",
    "get_user",
    "is_member",
    "link_live",
    "list_users",
    "open_web_session",
    "projects_of",
    "redeem_link",
    "sign_in_github",
    "spend_state",
    "web_session_user",
]

LINK_TTL_MS = 24 * 3600 * 1000
"""How long a one-time sign-in link lives: a day."""
LOGIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,38}")


@dataclass(frozen=True)
class User:
    id: str
    login: str
    name: str | None
    github_id: str | None
    created_at: int


def _user(row: Any) -> User:
    return User(row.id, row.login, row.name, row.github_id, row.created_at)


def get_user(conn: Connection, user_id: str) -> User | None:
    row = conn.execute(select(users).where(users.c.id == user_id)).first()
    return _user(row) if row is not None else None


def projects_of(conn: Connection, user_id: str) -> list[Project]:
    """The projects ``user_id`` may see, oldest first."""
    rows = conn.execute(
        select(projects)
        .join(memberships, memberships.c.project_id == projects.c.id)
        .where(memberships.c.user_id == user_id)
        .order_by(projects.c.created_at, projects.c.id)
    )
    return [Project(r.id, r.name, r.created_at, r.credits) for r in rows]


def is_member(conn: Connection, user_id: str, project_id: str) -> bool:
    found = conn.execute(
        select(memberships.c.role).where(
            (memberships.c.user_id == user_id) & (memberships.c.project_id == project_id)
        )
    ).first()
    return found is not None


def add_member(conn: Connection, user_id: str, project_id: str, role: str = "owner") -> None:
    if not is_member(conn, user_id, project_id):
        conn.execute(
            memberships.insert().values(
                user_id=user_id, project_id=project_id, role=role, created_at=now_ms()
            )
        )


def create_project_for(conn: Connection, user: User, name: str, initial_credits: int) -> Project:
    """A new project owned by ``user`` (its name unique among theirs); the caller's transaction.
    ``initial_credits`` is the account's free grant: the first project made for the account gets
    it (in the ledger), once; any later one starts at 0. Claiming the grant is one conditional
    update of the user's row, so two projects made at once grant it once between them."""
    project = create_project(conn, name, 0, owner_id=user.id)
    add_member(conn, user.id, project.id)
    if initial_credits > 0:
        claimed = conn.execute(
            update(users)
            .where((users.c.id == user.id) & users.c.credits_granted_at.is_(None))
            .values(credits_granted_at=project.created_at)
        )
        if claimed.rowcount == 1:
            billing.grant(conn, project.id, initial_credits, note="free credits (once per account)")
            project = replace(project, credits=initial_credits)
    return project


def _first_project(conn: Connection, user: User, initial_credits: int) -> Project:
    """``<login>`` (or ``<login>-2``, ``-3``… when the user has a project of that name)."""
    base = re.sub(r"[^A-Za-z0-9._-]", "-", user.login)[:56].strip("._-") or "project"
    name, n = base, 1
    mine = projects.c.owner_id == user.id
    while conn.execute(select(projects.c.id).where(mine & (projects.c.name == name))).first():
        n += 1
        name = f"{base}-{n}"
    return create_project_for(conn, user, name, initial_credits)


def _new_user(conn: Connection, login: str, name: str | None, github_id: str | None) -> User:
    user = User(f"user_{secrets.token_hex(8)}", login, name, github_id, now_ms())
    conn.execute(
        users.insert().values(
            id=user.id,
            github_id=github_id,
            login=login,
            name=name,
            created_at=user.created_at,
            last_seen_at=user.created_at,
        )
    )
    return user


def sign_in_github(
    conn: Connection, github_id: str, login: str, name: str | None, initial_credits: int
) -> tuple[User, Project | None]:
    """The user GitHub vouched for, made on their first sign-in with their first project (then
    returned too); the caller's transaction."""
    row = conn.execute(select(users).where(users.c.github_id == github_id)).first()
    if row is not None:
        conn.execute(
            update(users)
            .where(users.c.id == row.id)
            .values(login=login, name=name, last_seen_at=now_ms())
        )
        return get_user(conn, row.id) or _user(row), None
    user = _new_user(conn, login, name, github_id)
    return user, _first_project(conn, user, initial_credits)


def create_link(
    conn: Connection,
    secret: bytes,
    *,
    login: str,
    purpose: str = "invite",
    ttl_ms: int = LINK_TTL_MS,
) -> tuple[str, int]:
    """A one-time sign-in link for ``login`` (the user is made when it is first used, or is the
    existing user of that login who has no GitHub account): ``(token, expires_at)``. The token
    is shown once; only its hash is stored."""
    if not LOGIN.fullmatch(login):
        raise KyronixUsageError(
            f"invalid user name {login!r}: 1-39 letters, digits, '.', '_' or '-', starting with a "
            f"letter or digit"
        )
    if purpose not in ("owner", "invite"):
        raise KyronixUsageError(f"invalid link purpose {purpose!r}")
    token = "kxs_" + base64.urlsafe_b64encode(secrets.token_bytes(24)).rstrip(b"=").decode()
    at = now_ms()
    existing = conn.execute(
        select(users.c.id).where((users.c.login == login) & users.c.github_id.is_(None))
    ).first()
    conn.execute(
        signin_links.insert().values(
            id=f"link_{secrets.token_hex(6)}",
            hash=hash_key(secret, token),
            user_id=existing.id if existing is not None else None,
            login=login,
            purpose=purpose,
            created_at=at,
            expires_at=at + ttl_ms,
        )
    )
    return token, at + ttl_ms


def redeem_link(
    conn: Connection, secret: bytes, token: str, initial_credits: int
) -> tuple[User, Project | None] | None:
    """The user a live, unused link signs in (made now, with a first project, if it is new),
    and the link is spent; None for a link that is unknown, used or expired."""
    if not token.startswith("kxs_") or len(token) > 64:
        return None
    digest = hash_key(secret, token)
    row = conn.execute(select(signin_links).where(signin_links.c.hash == digest)).first()
    at = now_ms()
    if row is None or row.used_at is not None or row.expires_at < at:
        return None
    spent = conn.execute(
        update(signin_links)
        .where((signin_links.c.id == row.id) & signin_links.c.used_at.is_(None))
        .values(used_at=at)
    )
    if spent.rowcount != 1:
        return None
    if row.user_id is not None:
        user = get_user(conn, row.user_id)
        if user is not None:
            conn.execute(update(users).where(users.c.id == user.id).values(last_seen_at=at))
            return user, None
    user = _new_user(conn, row.login, None, None)
    return user, _first_project(conn, user, initial_credits)


def link_live(conn: Connection, secret: bytes, token: str) -> bool:
    """Whether a sign-in link can still sign in (a read: it spends nothing)."""
    row = conn.execute(
        select(signin_links.c.used_at, signin_links.c.expires_at).where(
            signin_links.c.hash == hash_key(secret, token)
        )
    ).first()
    return row is not None and row.used_at is None and row.expires_at >= now_ms()


def list_users(conn: Connection) -> list[tuple[User, list[Project]]]:
    """Every user, oldest first, with the projects each may see."""
    rows = conn.execute(select(users).order_by(users.c.created_at, users.c.id))
    return [(_user(r), projects_of(conn, r.id)) for r in rows]


def project_for(conn: Connection, user_id: str, project_id: str) -> Project | None:
    """The project, if ``user_id`` may see it (else None: the same answer as no project)."""
    if not is_member(conn, user_id, project_id):
        return None
    return get_project(conn, project_id)


# --------------------------------------------------------------------------- browser sessions


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def open_web_session(conn: Connection, user_id: str, ttl_ms: int) -> str:
    """A new signed-in browser session for ``user_id``: its token (for the signed cookie; only
    its SHA-256 is stored). Sessions past their time are deleted on the way."""
    at = now_ms()
    conn.execute(delete(web_sessions).where(web_sessions.c.expires_at < at))
    token = secrets.token_urlsafe(32)
    conn.execute(
        insert(web_sessions).values(
            id=_digest(token), user_id=user_id, created_at=at, expires_at=at + ttl_ms
        )
    )
    return token


def web_session_user(conn: Connection, user_id: str, token: str) -> User | None:
    """The user of a live session whose cookie says ``user_id`` and carries ``token``; None for
    a session that was signed out, expired or belongs to someone else."""
    row = conn.execute(
        select(users)
        .join(web_sessions, web_sessions.c.user_id == users.c.id)
        .where(
            (web_sessions.c.id == _digest(token))
            & (users.c.id == user_id)
            & (web_sessions.c.expires_at >= now_ms())
        )
    ).first()
    return _user(row) if row is not None else None


def close_web_session(conn: Connection, token: str) -> None:
    """Sign the session out: its cookie, or any copy of it, no longer signs anyone in."""
    conn.execute(delete(web_sessions).where(web_sessions.c.id == _digest(token)))


def spend_state(conn: Connection, state: str, ttl_ms: int) -> bool:
    """Record that an OAuth callback used ``state``: True the first time on any replica, False
    for a replay. States past their time are forgotten (a replay then fails at GitHub, whose
    codes are single-use, and at the browser's own session)."""
    at = now_ms()
    conn.execute(delete(spent_states).where(spent_states.c.expires_at < at))
    digest = _digest(state)
    if conn.execute(select(spent_states.c.id).where(spent_states.c.id == digest)).first():
        return False
    dialect = conn.dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as upsert
    else:
        from sqlalchemy.dialects.sqlite import insert as upsert  # type: ignore[assignment]
    done = conn.execute(
        upsert(spent_states)
        .values(id=digest, expires_at=at + ttl_ms)
        .on_conflict_do_nothing()
        .returning(spent_states.c.id)
    )
    return done.first() is not None  # a row came back: this insert made it
