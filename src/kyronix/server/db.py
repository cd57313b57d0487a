"""The server's database: its tables (SQLAlchemy Core), the engine, one writer at a time.

SQLite by default (WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE`` for writes, a busy timeout for
the CLI writing beside a running server: the engine is :func:`kiso.kernel.sql.make_engine`'s);
PostgreSQL (``postgresql://``, psycopg 3) with the same tables and migrations, where a write is a
plain transaction and rows lock themselves (conditional updates, ``FOR UPDATE``). On SQLite every
write in this process goes through one lock
(:meth:`Database.write`, the lock :mod:`kiso.kernel.sql` keeps per database file): under 20
writers that is ~3x the throughput of SQLite's own busy handler and a far shorter worst case
(../shared/reference/platform-server-anchors.md, B1). Each call is one short transaction; no
transaction is ever open while a model runs.

Credits are integer millicredits. Times are unix milliseconds; both are ``BigInteger`` (64 bits
on PostgreSQL, where ``INTEGER`` is 32: migration 0005). The schema is created and
upgraded by the Alembic scripts in :mod:`kyronix.server.migrations` (``migrate``), never by
``metadata.create_all``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

__all__ = [
    "Database",
    "api_keys",
    "custom_agents",
    "executions",
    "holds",
    "ledger",
    "mailbox",
    "memberships",
    "metadata",
    "now_ms",
    "presence",
    "projects",
    "replicas",
    "runs",
    "sessions",
    "signin_links",
    "spent_states",
    "users",
    "web_sessions",
]

T = TypeVar("T")

metadata = MetaData()

projects = Table(
    "kx_projects",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(64), nullable=False),  # unique per owner (0008)
    Column("created_at", BigInteger, nullable=False),
    Column("credits", BigInteger, nullable=False),  # millicredits; always the ledger's sum
    Column("owner_id", String(64), nullable=False, server_default=""),  # a user's id; '': operator
    UniqueConstraint("owner_id", "name", name="kx_projects_owner_name"),
)

api_keys = Table(
    "kx_api_keys",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("project_id", String(64), ForeignKey("kx_projects.id"), nullable=False),
    Column("prefix", String(32), nullable=False),
    Column("hash", String(128), nullable=False, unique=True),
    Column("name", String(128)),
    Column("created_at", BigInteger, nullable=False),
    Column("last_used_at", BigInteger),
    Column("revoked_at", BigInteger),
    Index("kx_api_keys_project", "project_id"),
)

ledger = Table(
    "kx_ledger",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("project_id", String(64), ForeignKey("kx_projects.id"), nullable=False),
    Column("kind", String(16), nullable=False),  # grant | hold | settle | release | refund
    Column("amount", BigInteger, nullable=False),  # millicredits, signed
    Column("hold_id", String(64)),
    Column("run_id", String(64)),
    Column("note", Text),
    Column("created_at", BigInteger, nullable=False),
    Index("kx_ledger_project", "project_id"),
)

holds = Table(
    "kx_holds",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("project_id", String(64), ForeignKey("kx_projects.id"), nullable=False),
    Column("run_id", String(64), nullable=False, unique=True),
    Column("amount", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),  # held | settled | released
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Column("closed_at", BigInteger),
    Index("kx_holds_open", "status", "expires_at"),
)

sessions = Table(
    "kx_sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("project_id", String(64), ForeignKey("kx_projects.id"), nullable=False),
    Column("agent", String(64), nullable=False),
    Column("custom_agent_id", String(64)),
    Column("created_at", BigInteger, nullable=False),
    Column("active_run", String(64)),  # one active run per session, set by a conditional update
    Index("kx_sessions_project", "project_id"),
)

runs = Table(
    "kx_runs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("project_id", String(64), ForeignKey("kx_projects.id"), nullable=False),
    Column("session_id", String(64), nullable=False),
    Column("agent", String(64), nullable=False),
    Column("custom_agent_id", String(64)),
    Column("status", String(16), nullable=False),  # running | completed | failed | interrupted
    Column("idem_key", String(255)),
    Column("request_hash", String(64)),
    Column("owner", String(64), nullable=False),
    Column("input", Text),  # what was asked (the session log shows it if the run is cut short)
    Column("created_at", BigInteger, nullable=False),
    Column("finished_at", BigInteger),
    Column("http_status", Integer),
    Column("result", Text),  # the JSON body the run answered (200 or an error body)
    Column("transcript", Text),  # JSON list: the text of each model attempt
    Column("cost", BigInteger),
    Column("usage_input", Integer),
    Column("usage_output", Integer),
    Column("mode", String(16)),  # None: answer with a plan; "tunnel": run the tools (0003)
    UniqueConstraint("project_id", "idem_key", name="kx_runs_idem"),
    Index("kx_runs_status", "status"),
    Index("kx_runs_session", "session_id"),
)

executions = Table(
    "kx_executions",
    metadata,
    Column("id", String(64), primary_key=True),  # a tool's executionId, as the plan gave it
    Column("project_id", String(64), ForeignKey("kx_projects.id"), nullable=False),
    Column("session_id", String(64), nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("key_id", String(64)),  # the API key whose run issued it (0009; None before)
)
"""Which session's run issued each tool execution id: where the tunnel records its results."""

custom_agents = Table(
    "kx_custom_agents",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("project_id", String(64), ForeignKey("kx_projects.id"), nullable=False),
    Column("name", String(128), nullable=False),
    Column("description", Text, nullable=False),
    Column("tools", Text, nullable=False),  # JSON list of {name, description, params, disabled}
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Index("kx_custom_agents_project", "project_id"),
)


users = Table(
    "kx_users",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("github_id", String(64), unique=True),  # None: signed in by a one-time link only
    Column("login", String(128), nullable=False),
    Column("name", String(255)),
    Column("created_at", BigInteger, nullable=False),
    Column("last_seen_at", BigInteger),
    Column("credits_granted_at", BigInteger),  # when the account got its free credits (0008)
)

memberships = Table(
    "kx_memberships",
    metadata,
    Column("user_id", String(64), ForeignKey("kx_users.id"), primary_key=True),
    Column("project_id", String(64), ForeignKey("kx_projects.id"), primary_key=True),
    Column("role", String(16), nullable=False),  # owner
    Column("created_at", BigInteger, nullable=False),
    Index("kx_memberships_project", "project_id"),
)
"""Which projects a dashboard user may see: a user sees only these."""

signin_links = Table(
    "kx_signin_links",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("hash", String(128), nullable=False, unique=True),  # HMAC of the token, never it
    Column("user_id", String(64), ForeignKey("kx_users.id")),  # None: the user it will create
    Column("login", String(128), nullable=False),
    Column("purpose", String(16), nullable=False),  # owner | invite
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Column("used_at", BigInteger),  # set once: a link signs in once
)

web_sessions = Table(
    "kx_web_sessions",
    metadata,
    Column("id", String(64), primary_key=True),  # SHA-256 of the cookie's session token
    Column("user_id", String(64), ForeignKey("kx_users.id"), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Index("kx_web_sessions_user", "user_id"),
)
"""Signed-in dashboard sessions (0007): a cookie is good only while its row is here, so signing
out (the row deleted) ends it on every replica, even for a copy of the cookie."""

spent_states = Table(
    "kx_spent_states",
    metadata,
    Column("id", String(64), primary_key=True),  # SHA-256 of an OAuth state a callback used
    Column("expires_at", BigInteger, nullable=False),
)
"""OAuth ``state`` values already used by a callback on any replica (0007): a replay is refused."""


replicas = Table(
    "kx_replicas",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("process", String(128)),  # "<boot id>:<start time>": tells it from a later pid
    Column("started_at", BigInteger, nullable=False),
    Column("heartbeat_at", BigInteger, nullable=False),
)
"""The running servers (replicas) of this database, each with its last heartbeat (0006)."""

presence = Table(
    "kx_presence",
    metadata,
    Column("project_id", String(64), primary_key=True),
    Column("executer_id", String(64), primary_key=True),
    Column("replica_id", String(64), nullable=False),
    Column("connected_at", BigInteger, nullable=False),
    Column("seen_at", BigInteger, nullable=False),  # last heard from (its pings)
    Column("key_id", String(64)),  # the API key of the connection that claimed it (0008)
)
"""Which replica each connected executer is connected to."""

mailbox = Table(
    "kx_mailbox",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("target", String(64), nullable=False),  # the replica it is for
    Column("kind", String(16), nullable=False),
    Column("body", Text, nullable=False),  # JSON
    Column("created_at", BigInteger, nullable=False),
    Index("kx_mailbox_target", "target", "id"),
)
"""Frames for another replica: a row each, named by ``NOTIFY kx_<replica>`` (payload: its id)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Database:
    """The engine plus the process's one write lock. ``write``/``read`` run ``fn(connection)``
    in one transaction (blocking: call them from a worker thread in async code).

    The engine and the lock are the SQL session store's (:mod:`kiso.kernel.sql`): the kiso
    session logs live in the same database, and every write of the process, theirs and ours,
    goes through the one lock of that database file.
    """

    def __init__(self, url: str) -> None:
        from kiso.kernel.sql import make_engine

        self.url = url
        self.engine = make_engine(url, **_pool(url))
        self.is_sqlite = self.engine.url.get_backend_name() == "sqlite"

    def write(self, fn: Callable[[Connection], T]) -> T:
        from kiso.kernel.sql import writing

        with writing(self.engine) as conn:
            return fn(conn)

    def read(self, fn: Callable[[Connection], T]) -> T:
        with self.engine.connect() as conn, conn.begin():
            return fn(conn)

    def close(self) -> None:
        self.engine.dispose()


IDLE_IN_TRANSACTION_MS = 10_000
"""PostgreSQL ends a server's transaction left idle this long (its process paused: SIGSTOP, a
VM pause), so its row locks never stall the replicas taking its runs over. Every transaction of
the server is short: none waits on anything but the database."""


def _pool(url: str) -> dict[str, Any]:
    if url.startswith("sqlite") and url not in ("sqlite://", "sqlite:///:memory:"):
        return {"pool_size": 8, "max_overflow": 8}
    if url.startswith(("postgresql", "postgres")):
        options = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
        return {"connect_args": {"options": options}}
    return {}
