"""The SQL session store: the JSONL store's contract, in a database (SQLite or PostgreSQL).

Three tables, SQLAlchemy Core, on :data:`metadata` (an application's Alembic migrations include
it; :func:`create_schema` creates them for tests and standalone use)::

    kiso_sessions  one row a session: the header's exact JSON line and its fields as columns
                   (id, workspace, created, kiso, parent), ``project`` (nullable: the server
                   scopes sessions by it), and the listing projection (last_seq, updated, state,
                   title, runs, inputs, projected = the kiso version that computed it)
    kiso_events    one row an event, keyed (session_id, seq): ``line``, the event's JSON text
                   exactly as the writer staged it (the JSONL line without its newline), and
                   ts, run and type as indexed columns
    kiso_writers   the writer lease, at most one row a session: owner token, pid, host, the
                   process's identity (boot id and start time), since, renewed

Writing: :class:`SqlWriter` is a :class:`~kiso.kernel.store.SessionWriter`, so staging, group
commit, ``flush``/``commit``/``await committed()`` and the poisoning of a writer whose batch
failed are the kernel's own. Each batch is ONE transaction: the lease is checked (fencing), the
session row is moved from the last seq this writer stored to the batch's last (a compare-and-set:
any other writer makes it match nothing) along with its projection, and the batch's lines are
inserted (a duplicate ``(session_id, seq)`` is a concurrent writer too). A batch is all or
nothing; a process killed in the middle of one leaves the committed prefix.

Reading: :meth:`SqlSessionStore.load` joins the header and the event lines back into the bytes
of the JSONL log and hands them to :func:`kiso.kernel.jsonl.parse_log`, the one loader: every
check the JSONL store makes on load (each line a valid event, contiguous seq, the start-input
cross-check, the header naming its session) is made here by the same code, and a load is byte
for byte what was written.

One writer: a lease row taken with an INSERT (the primary key refuses a second) or, over a stale
lease, a conditional UPDATE on the old owner's token; a live holder gets
:class:`~kiso.kernel.errors.SessionLockedError` naming its pid, host and since when. A lease is
stale when its process is gone: on the same host, no live process has its pid and start time
(boot id included, so a reboot frees every lease); on another host, only with ``lease_ttl``, when
it was not renewed (every batch renews it; :meth:`SqlWriter.renew` too) for that long.

SQLite: WAL, ``synchronous=FULL``, a busy timeout and foreign keys on every connection, and
transactions begun by us (``BEGIN IMMEDIATE`` for writes) when the engine comes from
:func:`make_engine` (or a URL); every write of the process goes through one lock per database
file (:func:`write_lock`, :func:`writing`), which the server's own writes should share.
docs/adr/0015-the-sql-session-store.md says why.

PostgreSQL (``postgresql://``, psycopg 3): no process lock and no PRAGMA; every write is an
ordinary READ COMMITTED transaction, and the rules above hold across processes and machines
because the database enforces them: the lease row's primary key and the conditional UPDATE over
a stale owner's token, and each batch first locks its lease row (``SELECT ... FOR UPDATE``) and
checks the token is still its own, so a takeover waits for a batch in flight and no batch of a
writer that lost its lease commits after the takeover did. Reads are REPEATABLE READ (one
snapshot for the header and the lines).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import bindparam, delete, exists, func, insert, select, update
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from kiso._version import __version__
from kiso.kernel.errors import (
    AppendError,
    CorruptLogError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    StoreError,
    UsageError,
    describe_os_error,
)
from kiso.kernel.events import Event, SessionHeader, dumps_line
from kiso.kernel.ids import check_session_id, new_id
from kiso.kernel.jsonl import parse_log
from kiso.kernel.listing import SessionInfo, _title, summarize
from kiso.kernel.lock import _when
from kiso.kernel.recovery import SessionState, session_state
from kiso.kernel.replay import Replay
from kiso.kernel.sqlschema import (
    BUSY_TIMEOUT_MS,
    create_schema,
    events,
    is_memory_url,
    make_engine,
    metadata,
    reading,
    sessions,
    write_lock,
    writers,
    writing,
)
from kiso.kernel.store import Clock, SessionLog, SessionWriter, wall_clock_ms

if TYPE_CHECKING:
    from sqlalchemy.engine import Row

__all__ = [
    "BUSY_TIMEOUT_MS",
    "SqlSessionStore",
    "SqlWriter",
    "create_schema",
    "events",
    "make_engine",
    "metadata",
    "process_identity",
    "sessions",
    "this_process",
    "write_lock",
    "writers",
    "writing",
]

RENEW_EVERY = 10.0
"""Seconds between renewals of a writer's lease by its batches (a third of ``lease_ttl`` if less);
every batch checks the lease is still its own, renewed or not."""
LEASE_ATTEMPTS = 5
"""How many times :meth:`SqlSessionStore.open` tries again when the lease changes hands under it."""

# The statements of every batch, built once (building a statement costs more than running it).
_RENEW = update(writers).where(
    writers.c.session_id == bindparam("b_id"), writers.c.token == bindparam("b_token")
)
_MOVE = update(sessions).where(  # the compare-and-set, fenced by the lease
    sessions.c.id == bindparam("b_id"),
    sessions.c.last_seq == bindparam("b_last"),
    exists().where(
        writers.c.session_id == bindparam("b_id"), writers.c.token == bindparam("b_token")
    ),
)
_FENCE = (  # PostgreSQL: the lease row, locked until the batch commits (a takeover waits for it)
    select(writers.c.token).where(writers.c.session_id == bindparam("b_id")).with_for_update()
)
_INSERT = insert(events)
_CREATE = insert(sessions)
_LEASE = insert(writers)


# --------------------------------------------------------------------------- the lease


@dataclass(frozen=True, slots=True)
class _Holder:
    token: str
    pid: int
    host: str
    process: str | None
    since: int
    renewed: int

    @classmethod
    def me(cls) -> _Holder:
        now = wall_clock_ms()
        pid, host, process = this_process()
        holder = cls(secrets.token_hex(16), pid, host, process, now, now)
        with _live_lock:
            _live_tokens.add(holder.token)
        return holder

    @classmethod
    def of(cls, row: Row[Any]) -> _Holder:
        return cls(row.token, row.pid, row.host, row.process, row.since, row.renewed)

    def values(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "pid": self.pid,
            "host": self.host,
            "process": self.process,
            "since": self.since,
            "renewed": self.renewed,
        }

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {_when(self.since)}"


_live_tokens: set[str] = set()
"""The lease tokens of this process's writers that are open (or opening)."""
_live_lock = threading.Lock()


def _done_with(token: str) -> None:
    with _live_lock:
        _live_tokens.discard(token)


def _mine_and_closed(holder: _Holder) -> bool:
    """Whether ``holder`` is a lease of this very process whose writer is closed: its drop
    failed (the database refused the write, say its disk was full) and it was left behind."""
    pid, host, process = this_process()
    if (holder.pid, holder.host) != (pid, host) or (holder.process or "") != (process or ""):
        return False
    with _live_lock:
        return holder.token not in _live_tokens


_boot: list[str] = []


def _boot_id() -> str:
    if not _boot:
        try:
            _boot.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
        except OSError:
            _boot.append("")
    return _boot[0]


_me: tuple[int, str, str | None] | None = None


def this_process() -> tuple[int, str, str | None]:
    """This process's pid, host and identity (read once per process: a fork reads again)."""
    global _me
    pid = os.getpid()
    if _me is None or _me[0] != pid:
        _me = (pid, socket.gethostname(), process_identity(pid))
    return _me


def process_identity(pid: int) -> str | None:
    """``"<boot id>:<start time>"`` of live process ``pid``, ``""`` when it lives but cannot be
    told apart from a later process with the same pid (no ``/proc``), ``None`` when it is gone
    (a zombie, dead and waiting to be reaped, is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return ""
        return ""
    fields = stat[stat.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return f"{_boot_id()}:{int(fields[19])}"


# --------------------------------------------------------------------------- the writer


class SqlWriter(SessionWriter):
    """The writer of one session in a SQL store; holds the session's lease until closed."""

    _before_commit: ClassVar[Callable[[SqlWriter, Sequence[Event]], None] | None] = None
    """Tests only: called inside each batch's transaction, after its rows are inserted."""

    def __init__(
        self, store: SqlSessionStore, log: SessionLog, token: str, fold: Replay | None = None
    ) -> None:
        super().__init__(log, store._clock)
        self.store = store
        self.token = token
        self._fold = fold if fold is not None else Replay(render=False).feed(log.events)
        self._stored = log.events[-1].seq if log.events else 0  # the last seq in the database
        self._renew_at = time.monotonic() + store._renew_every  # the lease was renewed just now
        self._attached: list[tuple[int, Callable[[Connection], None]]] = []
        self._attach_lock = threading.Lock()

    def attach(self, fn: Callable[[Connection], None], *, seq: int) -> None:
        """Run ``fn(connection)`` inside the transaction that makes event ``seq`` durable, after
        the batch's rows: the application's own rows commit with the events, or neither does.

        ``seq`` must be staged and not yet durable (:class:`~kiso.kernel.errors.UsageError`
        otherwise). ``fn`` runs on the writer's I/O thread; an exception from it rolls the whole
        batch back and fails it (the writer is then unusable, as after any failed batch). A
        batch that fails drops the functions attached to it: they did not commit.
        """
        with self._attach_lock:
            if not self._stored < seq < self.next_seq:
                raise UsageError(
                    f"session {self.id}: attach needs a staged event that is not durable yet "
                    f"(seq {self._stored + 1}-{self.next_seq - 1}), not seq {seq}"
                )
            self._attached.append((seq, fn))

    def _take_attached(self, last: int) -> list[Callable[[Connection], None]]:
        with self._attach_lock:
            due = [fn for seq, fn in self._attached if seq <= last]
            self._attached = [(seq, fn) for seq, fn in self._attached if seq > last]
        return due

    def _write(self, data: bytes, count: int) -> None:
        first = self._stored + 1
        batch = tuple(self._events[first - 1 : first - 1 + count])
        lines = data.decode("utf-8").split("\n")
        lines.pop()  # after the last newline: nothing
        if len(lines) != count or len(batch) != count or batch[0].seq != first:
            raise AppendError(
                f"session {self.id}: the batch from seq {first} does not match the staged events "
                f"(a bug in kiso); nothing was appended"
            )
        self._fold.feed(batch)
        self.store._append(self, batch, lines, _projection(self.header, self._fold, batch[-1].seq))
        self._stored = batch[-1].seq

    def renew(self) -> None:
        """Renew the lease without appending (each batch renews it too): for a writer that may
        stay idle longer than a store's ``lease_ttl``. Raises :class:`AppendError` if the lease
        was taken over."""
        store = self.store
        with self._io:
            try:
                with writing(store.engine) as conn:
                    store._renew(conn, self.id, self.token)
            except _LeaseLost:
                holder = store._holder_or_none(self.id)
                raise store._lease_lost(self.id, holder, "nothing was written") from None
            except SQLAlchemyError as exc:
                raise AppendError(
                    store._describe(exc, f"renew the writer lease of session {self.id} in")
                ) from exc
            self._renew_at = time.monotonic() + store._renew_every

    def __enter__(self) -> SqlWriter:
        return self

    def _release(self) -> None:
        self.store._drop_lease(self.id, self.token)


class _LeaseLost(Exception):
    pass


class _Moved(Exception):
    pass


def _corrupt(where: str, line: int, reason: str, *, session_id: str) -> CorruptLogError:
    """The loader's error, with advice for rows rather than a file (``kiso doctor`` repairs
    files)."""
    error = CorruptLogError(where, line, reason, session_id=session_id)
    error.args = (
        f"{where}, line {line}: {reason}. The session's stored log is damaged and was not "
        f"changed. Do not delete its rows by hand: that would also drop the receipts after them, "
        f"and resuming would run those effects again. Restore the database from a backup, or "
        f"write the rows out as {session_id}.jsonl (the header, then each line in seq order) "
        f"and repair that with `kiso doctor`.",
    )
    return error


def _projection(header: SessionHeader, fold: Replay, last: int) -> dict[str, Any]:
    """The listing row's columns, as :func:`kiso.kernel.listing.summarize` computes them."""
    return {
        "last_seq": last,
        "updated": fold.updated or header.created,
        "state": session_state(fold).value,
        "title": _title(fold.title),
        "runs": fold.runs,
        "inputs": fold.user_inputs,
        "projected": __version__,
    }


# --------------------------------------------------------------------------- the store


class SqlSessionStore:
    """Sessions in a SQL database: ``SqlSessionStore("sqlite:///sessions.db")`` or an engine.

    An engine passed in is used as it is (make it with :func:`make_engine` to get the SQLite
    settings); a URL gets an engine of the store's own (:meth:`close` disposes of it). The tables
    must exist: :func:`create_schema`, or the application's migrations. ``lease_ttl`` (seconds):
    a lease held from another host that was not renewed for that long is taken over; without it,
    only leases of dead processes on this host are.
    """

    def __init__(
        self,
        engine: Engine | str | URL,
        *,
        clock: Clock = wall_clock_ms,
        lease_ttl: float | None = None,
    ) -> None:
        self._owns_engine = not isinstance(engine, Engine)
        self.engine: Engine = make_engine(engine) if not isinstance(engine, Engine) else engine
        self._clock = clock
        self.lease_ttl = lease_ttl
        self._renew_every = RENEW_EVERY if lease_ttl is None else min(RENEW_EVERY, lease_ttl / 3)
        url = self.engine.url
        self._sqlite = url.get_backend_name() == "sqlite"
        if self._sqlite and not is_memory_url(url):
            self.where = os.path.abspath(url.database or "")
            """The database, as messages name it."""
        elif self._sqlite:
            self.where = "an in-memory SQLite database"
        else:
            self.where = url.render_as_string(hide_password=True)

    def close(self) -> None:
        """Dispose of the engine, if the store made it from a URL."""
        if self._owns_engine:
            self.engine.dispose()

    # ------------------------------------------------------------------ the contract

    def create(
        self,
        workspace: str | os.PathLike[str],
        *,
        session_id: str | None = None,
        parent: str | None = None,
        project: str | None = None,
        connection: Connection | None = None,
    ) -> SqlWriter:
        """Store a new session's header and return its writer, holding the lease.

        ``project`` scopes the session (``list(project=...)``); it is a column of the session
        row, not part of the log. ``connection``: an open write transaction of this store's
        database (:func:`writing`) to create the session in, so that it commits with the
        caller's own rows; the caller commits it, and closes the writer unused if it rolls back.
        """
        sid = check_session_id(session_id) if session_id is not None else new_id()
        if project is not None and (not isinstance(project, str) or not 0 < len(project) <= 128):
            raise UsageError(f"project must be a string of 1-128 characters, not {project!r}")
        ws = os.path.realpath(os.fspath(workspace))
        header = SessionHeader(
            id=sid, workspace=ws, created=self._clock(), kiso=__version__, parent=parent
        )
        row = {
            "id": sid,
            "workspace": ws,
            "project": project,
            "parent": parent,
            "created": header.created,
            "kiso": header.kiso,
            "header": dumps_line(header.to_json())[:-1].decode("utf-8"),
        }
        fold = Replay(render=False)
        me = _Holder.me()
        try:
            with (
                writing(self.engine) if connection is None else contextlib.nullcontext(connection)
            ) as conn:
                conn.execute(_CREATE, {**row, **_projection(header, fold, 0)})
                conn.execute(_LEASE, {"session_id": sid, **me.values()})
        except IntegrityError:
            _done_with(me.token)
            raise SessionExistsError(f"session {sid!r} already exists in {self.where}") from None
        except SQLAlchemyError as exc:
            _done_with(me.token)
            raise StoreError(
                self._describe(exc, f"create session {sid} in") + f"; session {sid} was not created"
            ) from exc
        except BaseException:
            _done_with(me.token)
            raise
        return SqlWriter(self, SessionLog(header, ()), me.token, fold)

    def open(self, session_id: str) -> SqlWriter:
        """Take the session's lease, then load it; refuses while a live writer holds it."""
        sid = check_session_id(session_id)
        me = _Holder.me()
        try:
            self._take_lease(sid, me)
        except BaseException:
            _done_with(me.token)
            raise
        try:
            log, stored = self._read(sid)
            fold = Replay(render=False).feed(log.events)
            projection = _projection(log.header, fold, log.next_seq - 1)
            if stored != (projection["last_seq"], projection["projected"]):
                # rows changed by hand, or an older kiso: the row follows the log
                with writing(self.engine) as conn:
                    self._renew(conn, sid, me.token)
                    conn.execute(update(sessions).where(sessions.c.id == sid).values(projection))
        except _LeaseLost:
            _done_with(me.token)
            raise SessionLockedError(sid, self._holder_text(sid)) from None
        except SQLAlchemyError as exc:
            self._drop_lease(sid, me.token)
            raise StoreError(
                self._describe(exc, f"open session {sid} in") + f"; session {sid} was not opened"
            ) from exc
        except BaseException:
            self._drop_lease(sid, me.token)
            raise
        return SqlWriter(self, log, me.token, fold)

    def load(self, session_id: str) -> SessionLog:
        """Read and validate a whole session (no lease: a reader never blocks the writer)."""
        return self._read(check_session_id(session_id))[0]

    def list(
        self, workspace: str | os.PathLike[str] | None = None, *, project: str | None = None
    ) -> list[SessionInfo]:
        """Every session (of ``workspace`` and/or ``project``, when given), newest activity first.

        Rows come from the session table's projection, written in the transaction of each batch;
        a row whose projection disagrees with its events (another count, another kiso version) is
        recomputed from its log, as the JSONL store's index is.
        """
        s = sessions.c
        stored = (
            select(func.max(events.c.seq))
            .where(events.c.session_id == s.id)
            .scalar_subquery()
            .label("stored")
        )
        query = select(
            s.id,
            s.workspace,
            s.parent,
            s.created,
            s.last_seq,
            s.updated,
            s.state,
            s.title,
            s.runs,
            s.inputs,
            s.projected,
            stored,
        ).order_by(s.updated.desc(), s.id.desc())
        if workspace is not None:
            query = query.where(s.workspace == os.path.realpath(os.fspath(workspace)))
        if project is not None:
            query = query.where(s.project == project)
        try:
            with reading(self.engine) as conn:
                rows = conn.execute(query).all()
        except SQLAlchemyError as exc:
            raise StoreError(self._describe(exc, "list the sessions in")) from exc
        out: list[SessionInfo] = []
        for row in rows:
            info = self._listed(row)
            if info is not None:
                out.append(info)
        out.sort(key=lambda r: (r.updated, r.id), reverse=True)
        return out

    def project_of(self, session_id: str) -> str | None:
        """The project ``create`` gave the session (None if none)."""
        try:
            with reading(self.engine) as conn:
                row = conn.execute(
                    select(sessions.c.project).where(sessions.c.id == session_id)
                ).first()
        except SQLAlchemyError as exc:
            raise StoreError(self._describe(exc, f"read session {session_id} from")) from exc
        if row is None:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.where}")
        project: str | None = row.project
        return project

    # ------------------------------------------------------------------ reading

    def _read(self, sid: str) -> tuple[SessionLog, tuple[int, str]]:
        """The validated log, and the (last_seq, projected) its session row has."""
        s, e = sessions.c, events.c
        try:
            with reading(self.engine) as conn:
                row = conn.execute(
                    select(
                        s.header, s.workspace, s.created, s.kiso, s.parent, s.last_seq, s.projected
                    ).where(s.id == sid)
                ).first()
                if row is None:
                    raise SessionNotFoundError(f"no session {sid!r} in {self.where}")
                lines = conn.execute(
                    select(e.seq, e.line).where(e.session_id == sid).order_by(e.seq)
                ).all()
        except SQLAlchemyError as exc:
            raise StoreError(self._describe(exc, f"read session {sid} from")) from exc
        where = f"session {sid} in {self.where}"
        parts: list[str] = [row.header]
        for number, (seq, line) in enumerate(lines, 1):
            if seq != number:
                raise _corrupt(
                    where,
                    number + 1,
                    f"the stored rows go from seq {number - 1} to seq {seq} (a gap or a duplicate)",
                    session_id=sid,
                )
            parts.append(line)
        for number, part in enumerate(parts, 1):
            if "\n" in part:
                raise _corrupt(
                    where, number, "the stored record spans more than one line", session_id=sid
                )
        parts.append("")
        try:
            log = parse_log("\n".join(parts).encode("utf-8"), where, session_id=sid)
        except CorruptLogError as exc:
            raise _corrupt(where, exc.line, exc.reason, session_id=sid) from None
        header = log.header
        columns = (row.workspace, row.created, row.kiso, row.parent)
        if (header.workspace, header.created, header.kiso, header.parent) != columns:
            raise _corrupt(
                where,
                1,
                "the session row's workspace, created, kiso and parent columns disagree with its "
                "header",
                session_id=sid,
            )
        return SessionLog(header, log.events), (row.last_seq, row.projected)

    def _listed(self, row: Any) -> SessionInfo | None:
        """The listing row of ``row``: its projection if it agrees with the events, else the
        log's own summary (written back for next time), or a ``corrupt`` row."""
        stored = row.stored or 0
        if row.projected == __version__ and stored == row.last_seq:
            with contextlib.suppress(ValueError):
                return SessionInfo(
                    id=row.id,
                    workspace=row.workspace,
                    state=SessionState(row.state),
                    title=row.title,
                    created=row.created,
                    updated=row.updated,
                    runs=row.runs,
                    inputs=row.inputs,
                    events=row.last_seq,
                    parent=row.parent,
                )
        try:
            log = self.load(row.id)
        except SessionNotFoundError:
            return None  # deleted since the query
        except CorruptLogError as exc:
            return SessionInfo(
                id=row.id,
                workspace=row.workspace,
                state=SessionState.CORRUPT,
                title="",
                created=row.created,
                updated=row.updated,
                runs=0,
                inputs=0,
                events=0,
                parent=row.parent,
                error=str(exc),
            )
        info = summarize(log)
        if len(log.events) == stored == row.last_seq:  # only a kiso upgrade: cache it
            with contextlib.suppress(SQLAlchemyError), writing(self.engine) as conn:
                conn.execute(
                    update(sessions)
                    .where(
                        sessions.c.id == row.id,
                        sessions.c.last_seq == row.last_seq,
                        sessions.c.projected == row.projected,
                    )
                    .values(_projection(log.header, Replay(render=False).feed(log.events), stored))
                )
        return info

    # ------------------------------------------------------------------ writing

    def _append(
        self,
        writer: SqlWriter,
        batch: Sequence[Event],
        lines: Sequence[str],
        projection: dict[str, Any],
    ) -> None:
        """Make one batch durable in one transaction, all of it or none (raises AppendError)."""
        sid = writer.id
        first, count = batch[0].seq, len(batch)
        rows = [
            {
                "session_id": sid,
                "seq": ev.seq,
                "ts": ev.ts,
                "run": ev.run,
                "type": ev.type,
                "line": line,
            }
            for ev, line in zip(batch, lines, strict=True)
        ]
        lost = f"{count} event(s) were not committed"
        renew = time.monotonic() >= writer._renew_at
        attached = writer._take_attached(batch[-1].seq)
        try:
            with writing(self.engine) as conn:
                if not self._sqlite and conn.execute(_FENCE, {"b_id": sid}).scalar() != (
                    writer.token
                ):
                    raise _LeaseLost  # (SQLite: BEGIN IMMEDIATE already excludes a takeover)
                if renew:  # the lease says it is alive (the compare-and-set checks it is ours)
                    self._renew(conn, sid, writer.token)
                params = {"b_id": sid, "b_token": writer.token, "b_last": first - 1}
                if conn.execute(_MOVE, params | projection).rowcount != 1:
                    raise _Moved
                conn.execute(_INSERT, rows)
                for fn in attached:
                    fn(conn)
                hook = SqlWriter._before_commit
                if hook is not None:
                    hook(writer, batch)
        except _Moved:
            holder = self._holder_or_none(sid)
            if holder is None or holder.token != writer.token:
                raise self._lease_lost(sid, holder, lost) from None
            raise AppendError(
                f"session {sid} in {self.where}: its rows changed underneath this writer (another "
                f"writer appended after seq {first - 1}); {lost}. Open the session again."
            ) from None
        except _LeaseLost:
            raise self._lease_lost(sid, self._holder_or_none(sid), lost) from None
        except IntegrityError:
            raise AppendError(
                f"session {sid} in {self.where}: its rows changed underneath this writer (another "
                f"writer appended after seq {first - 1}); {lost}. Open the session again."
            ) from None
        except SQLAlchemyError as exc:
            raise AppendError(
                self._describe(exc, f"append to session {sid} in") + f"; {lost}."
            ) from exc

        if renew:
            writer._renew_at = time.monotonic() + self._renew_every

    def _lease_lost(self, sid: str, holder: _Holder | None, lost: str) -> AppendError:
        now = f"it is now held by {holder.describe()}" if holder is not None else "nobody holds it"
        return AppendError(
            f"session {sid}: this writer no longer holds the session's lease ({now}); {lost}. "
            f"Open the session again."
        )

    def _holder_or_none(self, sid: str) -> _Holder | None:
        try:
            return self._holder(sid)
        except StoreError:
            return None

    def _renew(self, conn: Connection, sid: str, token: str) -> None:
        renewed = conn.execute(_RENEW, {"b_id": sid, "b_token": token, "renewed": wall_clock_ms()})
        if renewed.rowcount != 1:
            raise _LeaseLost

    # ------------------------------------------------------------------ the lease

    def _take_lease(self, sid: str, me: _Holder) -> None:
        for _ in range(LEASE_ATTEMPTS):
            try:
                with writing(self.engine) as conn:
                    conn.execute(_LEASE, {"session_id": sid, **me.values()})
                return
            except IntegrityError:
                pass  # held, or no such session
            except SQLAlchemyError as exc:
                raise StoreError(
                    self._describe(exc, f"open session {sid} in")
                    + f"; session {sid} was not opened"
                ) from exc
            holder = self._holder(sid)
            if holder is None:
                continue  # released in between: try again
            if not self._stale(holder):
                raise SessionLockedError(sid, holder.describe())
            try:
                with writing(self.engine) as conn:
                    taken = conn.execute(
                        update(writers)
                        .where(writers.c.session_id == sid, writers.c.token == holder.token)
                        .values(me.values())
                    )
                if taken.rowcount == 1:
                    return
            except SQLAlchemyError as exc:
                raise StoreError(
                    self._describe(exc, f"take over the writer lease of session {sid} in")
                    + f"; session {sid} was not opened"
                ) from exc
        raise StoreError(
            f"could not take the writer lease of session {sid} in {self.where}: it changed hands "
            f"{LEASE_ATTEMPTS} times while this process tried; try again"
        )

    def _holder(self, sid: str) -> _Holder | None:
        """The session's lease holder; raises SessionNotFoundError if there is no session."""
        try:
            with reading(self.engine) as conn:
                row = conn.execute(select(writers).where(writers.c.session_id == sid)).first()
                if row is None:
                    found = conn.execute(select(sessions.c.id).where(sessions.c.id == sid)).first()
                    if found is None:
                        raise SessionNotFoundError(f"no session {sid!r} in {self.where}")
                    return None
        except SQLAlchemyError as exc:
            raise StoreError(self._describe(exc, f"read the writer of session {sid} in")) from exc
        return _Holder.of(row)

    def _holder_text(self, sid: str) -> str:
        holder = self._holder_or_none(sid)
        return holder.describe() if holder is not None else "nobody"

    def _stale(self, holder: _Holder) -> bool:
        """Whether ``holder``'s lease may be taken over: its process is gone, or it is this
        process's and its writer is closed (a lease whose drop failed)."""
        if _mine_and_closed(holder):
            return True
        if holder.host == socket.gethostname():
            now = process_identity(holder.pid)
            if now is None:
                return True  # no such process
            if not now or not holder.process:
                return False  # alive, and nothing to tell it from a later process of that pid
            return now != holder.process  # another process has that pid now (or a reboot)
        if self.lease_ttl is None:
            return False
        return wall_clock_ms() - holder.renewed > self.lease_ttl * 1000

    def _drop_lease(self, sid: str, token: str) -> None:
        """Give the lease up (best effort: a lease left behind is stale once this process goes,
        and to this process at once: its writer is closed)."""
        _done_with(token)
        with contextlib.suppress(SQLAlchemyError), writing(self.engine) as conn:
            conn.execute(
                delete(writers).where(writers.c.session_id == sid, writers.c.token == token)
            )

    # ------------------------------------------------------------------ errors

    def _describe(self, exc: SQLAlchemyError, doing: str) -> str:
        """One sentence for a database error while ``doing`` something to the database."""
        orig = exc.orig if isinstance(exc, DBAPIError) else None
        text = str(orig) if orig is not None else str(exc)
        low = text.lower()
        where = self.where
        state = getattr(orig, "sqlstate", None)  # PostgreSQL's error code (psycopg)
        if state == "53100":  # disk_full
            return describe_os_error(where, OSError(errno.ENOSPC, text), doing)
        if state == "25006":  # read_only_sql_transaction (a standby, or read-only by setting)
            return f"could not {doing} {where}: the database is read-only ({text})"
        if state in ("40001", "40P01"):  # serialization failure, deadlock: nothing was written
            return f"could not {doing} {where}: another writer got in the way ({text}); try again"
        if "database or disk is full" in low or "disk full" in low or "no space" in low:
            return describe_os_error(where, OSError(errno.ENOSPC, text), doing)
        if "readonly database" in low or "read-only" in low:
            return f"could not {doing} {where}: the database is read-only ({text})"
        if "database is locked" in low:
            return (
                f"could not {doing} {where}: another process held the database's write lock for "
                f"more than {BUSY_TIMEOUT_MS // 1000} s ({text}); try again"
            )
        if "disk i/o error" in low:
            return describe_os_error(where, OSError(errno.EIO, text), doing)
        if "no such table" in low or "does not exist" in low:
            return (
                f"could not {doing} {where}: the database has no session tables ({text}); run "
                f"the application's migrations, or kiso.kernel.sql.create_schema(engine)"
            )
        return f"could not {doing} {where}: {type(orig or exc).__name__}: {text}"
