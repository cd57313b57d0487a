"""The SQL store's tables and engines: the schema (:data:`metadata`) the server's migrations
include, SQLite engines set up for durability (WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE``,
foreign keys), and the one in-process write lock per SQLite database. PostgreSQL engines
(``postgresql://`` means psycopg 3) get none of that: no PRAGMA, no ``BEGIN IMMEDIATE``, no
process lock; their writers are ordinary transactions whose rows lock themselves.
:mod:`kiso.kernel.sql` is the store built on them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    create_engine,
    event,
)
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

if TYPE_CHECKING:
    pass

__all__ = [
    "BUSY_TIMEOUT_MS",
    "create_schema",
    "driver_url",
    "events",
    "is_memory_url",
    "make_engine",
    "metadata",
    "reading",
    "sessions",
    "write_lock",
    "writers",
    "writing",
]

BUSY_TIMEOUT_MS = 30_000
"""How long an SQLite connection waits for another process's write lock before failing."""

# --------------------------------------------------------------------------- the schema

metadata = MetaData()
"""The store's tables; include it in an application's Alembic ``target_metadata``."""

sessions = Table(
    "kiso_sessions",
    metadata,
    Column("id", String(128), nullable=False),
    Column("workspace", Text, nullable=False),
    Column("project", String(128), nullable=True),
    Column("parent", String(128), nullable=True),
    Column("created", BigInteger, nullable=False),
    Column("kiso", String(64), nullable=False),
    Column("header", Text, nullable=False),  # line 1 of the log, exactly, without its newline
    Column("last_seq", BigInteger, nullable=False),
    Column("updated", BigInteger, nullable=False),
    Column("state", String(32), nullable=False),
    Column("title", Text, nullable=False),
    Column("runs", Integer, nullable=False),
    Column("inputs", Integer, nullable=False),
    Column("projected", String(64), nullable=False),  # the kiso version that computed the row
    PrimaryKeyConstraint("id", name="pk_kiso_sessions"),
    Index("ix_kiso_sessions_workspace", "workspace", "updated"),
    Index("ix_kiso_sessions_project", "project", "updated"),
)

events = Table(
    "kiso_events",
    metadata,
    Column("session_id", String(128), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("ts", BigInteger, nullable=False),
    Column("run", Text, nullable=True),
    Column("type", String(32), nullable=False),
    Column("line", Text, nullable=False),  # the event's log line, exactly, without its newline
    PrimaryKeyConstraint("session_id", "seq", name="pk_kiso_events"),
    ForeignKeyConstraint(
        ["session_id"], ["kiso_sessions.id"], name="fk_kiso_events_session", ondelete="CASCADE"
    ),
    Index("ix_kiso_events_type", "session_id", "type"),
    Index("ix_kiso_events_run", "session_id", "run"),
)

writers = Table(
    "kiso_writers",
    metadata,
    Column("session_id", String(128), nullable=False),
    Column("token", String(64), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("host", String(255), nullable=False),
    Column("process", String(128), nullable=True),  # "<boot id>:<start time>" of the pid
    Column("since", BigInteger, nullable=False),
    Column("renewed", BigInteger, nullable=False),
    PrimaryKeyConstraint("session_id", name="pk_kiso_writers"),
    ForeignKeyConstraint(
        ["session_id"], ["kiso_sessions.id"], name="fk_kiso_writers_session", ondelete="CASCADE"
    ),
)


def create_schema(engine: Engine) -> None:
    """Create the store's tables (and indexes) that do not exist yet."""
    with writing(engine) as conn:
        metadata.create_all(conn)


# --------------------------------------------------------------------------- engines


def make_engine(url: str | URL, **options: Any) -> Engine:
    """An engine for ``url``. For SQLite: WAL, ``synchronous=FULL``, foreign keys and a busy
    timeout on every connection, and transactions begun by us (``BEGIN`` to read, ``BEGIN
    IMMEDIATE`` to write, so a write never fails half-way on a lock upgrade); ``sqlite://`` is
    one shared in-memory database. ``options`` go to :func:`sqlalchemy.create_engine`."""
    url = driver_url(url)
    if url.get_backend_name() != "sqlite":
        return create_engine(url, **{"pool_pre_ping": True, **options})
    memory = is_memory_url(url)
    args: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
    if memory:
        args["poolclass"] = StaticPool
    engine = create_engine(url, **{**args, **options})
    event.listen(engine, "connect", _on_sqlite_connect if not memory else _on_memory_connect)
    event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def driver_url(url: str | URL) -> URL:
    """``url`` with the driver kiso uses: ``postgresql://`` (and Heroku's ``postgres://``) is
    ``postgresql+psycopg://`` (psycopg 3); any other URL is left as it is."""
    url = make_url(url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def is_memory_url(url: URL) -> bool:
    return url.database in (None, "", ":memory:") or "mode=memory" in str(url.query)


def _pragmas(dbapi: Any, wal: bool) -> None:
    dbapi.isolation_level = None  # the driver begins nothing: _on_sqlite_begin does
    cur = dbapi.cursor()
    try:
        if wal:
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
    finally:
        cur.close()


def _on_sqlite_connect(dbapi: Any, _record: Any) -> None:
    _pragmas(dbapi, wal=True)


def _on_memory_connect(dbapi: Any, _record: Any) -> None:
    _pragmas(dbapi, wal=False)


def _on_sqlite_begin(conn: Connection) -> None:
    write = conn.get_execution_options().get("kiso_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


_locks: dict[object, threading.Lock] = {}  # database file (or in-memory engine) -> its lock
_engine_locks: weakref.WeakKeyDictionary[Engine, contextlib.AbstractContextManager[Any]] = (
    weakref.WeakKeyDictionary()
)
_locks_guard = threading.Lock()


def write_lock(engine: Engine) -> contextlib.AbstractContextManager[Any]:
    """The process's one write lock of ``engine``'s SQLite database (shared by every engine on
    the same file); a no-op for other databases, whose rows lock themselves."""
    with _locks_guard:
        lock = _engine_locks.get(engine)
        if lock is None:
            url = engine.url
            if url.get_backend_name() != "sqlite":
                lock = contextlib.nullcontext()
            else:
                memory = is_memory_url(url)
                key = ("memory", id(engine)) if memory else os.path.realpath(url.database or "")
                lock = _locks.get(key)
                if lock is None:
                    lock = _locks[key] = threading.Lock()
            _engine_locks[engine] = lock
    return lock


@contextlib.contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """One write transaction under the process's write lock (``BEGIN IMMEDIATE`` on SQLite
    engines from :func:`make_engine`; on PostgreSQL a plain transaction, no lock); committed
    when the block ends, rolled back if it raises."""
    with write_lock(engine), engine.connect() as conn:
        conn.execution_options(kiso_write=True)
        with conn.begin():
            yield conn


@contextlib.contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """One read transaction: a consistent snapshot (one shared connection: take the lock)."""
    sqlite = engine.url.get_backend_name() == "sqlite"
    serial = sqlite and is_memory_url(engine.url)
    lock = write_lock(engine) if serial else contextlib.nullcontext()
    with lock, engine.connect() as conn:
        if not sqlite:  # READ COMMITTED would give each statement a snapshot of its own
            conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn
