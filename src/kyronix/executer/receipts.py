"""The executer's durable receipts: one row per ``executionId``, so nothing runs twice.

The same rule as kiso's session log (DURABILITY.md), in the same vocabulary
(:mod:`kiso.kernel.execution`: :data:`~kiso.kernel.execution.ExecutionId`,
:class:`~kiso.kernel.execution.ReceiptState`, :class:`~kiso.kernel.execution.Ruling`), kept in
SQLite because an executer serves many envelopes and connections over its life, not one
append-only session:

- before a tool with side effects runs, a ``started`` row is committed and fsynced;
- after it returns (success or failure), the row becomes ``finished`` with the whole result entry;
- a request whose id is ``finished`` gets the stored entry back and nothing runs;
- a request whose id is ``started`` but not finished (the executer died mid-tool) is *uncertain*:
  it is reported, never re-run automatically, until someone calls :meth:`ReceiptStore.resolve`
  (``rerun`` forgets the row; ``skipped`` / ``applied`` make it ``resolved``, with the entry
  later requests get back).

Rows are keyed by ``(scope, execution_id)``; the scope is the real base path, so two projects on
one machine cannot replay each other's results. Each row also keeps a hash of the request (tool
name and raw arguments): the same id sent with a different call is a conflict, not a replay.

Which rows a call gets is decided by what its tool declares (``read_only``, ``idempotent``; see
:class:`~kiso.kernel.execution.Rerunnable`), never by a list of names: the executer skips the
``started`` row of a rerunnable tool (an interrupted one is simply run again), and writes the
``finished`` row of a read-only one without waiting for fsync (:meth:`ReceiptStore.finish_many`:
it survives a process crash, not a power cut, and losing it only means the read runs again).

Two limits keep the store small: every text a stored entry holds (its ``output``, its ``error``,
each string in its ``data``) is cut to :data:`STORED_TEXT_LIMIT` characters when it is stored,
and the entry records the field's full length and SHA-256 (``result.stored``); and settled rows
older than a retention can be removed with :meth:`ReceiptStore.prune` (``kyronix receipts prune
--older-than 30d``). A pruned id is forgotten: sent again, it runs again. Rows that started and
never finished are never pruned (they wait for a person's ruling).

The database runs in WAL mode with ``synchronous=FULL`` for the rows that guard side effects.
Its layout is versioned (``PRAGMA user_version``); a store written before the version was kept
(whose state column allowed only ``started`` and ``finished``) is migrated when it is opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiso.kernel.execution import ExecutionId, ReceiptState, Ruling
from kyronix.errors import (
    KyronixUsageError,
    NotUncertainError,
    ReceiptStoreError,
    UnknownExecutionError,
)

__all__ = [
    "SCHEMA_VERSION",
    "STORED_TEXT_LIMIT",
    "Receipt",
    "ReceiptStore",
    "cap_entry",
    "default_receipts_path",
    "request_hash",
]

SCHEMA_VERSION = 1
"""The layout of the receipts table (``PRAGMA user_version``). 0: the first layout, whose state
column allowed ``started`` and ``finished`` only. 1: the state column allows every
:class:`~kiso.kernel.execution.ReceiptState` (``resolved`` is new)."""

STORED_TEXT_LIMIT = 64 * 1024
"""The most characters of one text (an output, an error, a string in ``data``) a receipt keeps.
What the first request got back is never cut; a replay of a longer one gets the first
``STORED_TEXT_LIMIT`` characters, ``truncated: true`` and, in ``result.stored``, the full length
and the SHA-256 of the whole text (UTF-8)."""

_STATES = ", ".join(f"'{state.value}'" for state in ReceiptState)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS receipts (
    scope        TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    tool         TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ({_STATES})),
    started_at   REAL NOT NULL,
    finished_at  REAL,
    pid          INTEGER NOT NULL,
    host         TEXT NOT NULL,
    entry        TEXT,
    PRIMARY KEY (scope, execution_id)
) WITHOUT ROWID
"""

_COLUMNS = (
    "scope, execution_id, tool, request_hash, state, started_at, finished_at, pid, host, entry"
)

_UPSERT = (
    f"INSERT INTO receipts ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (scope, execution_id) DO UPDATE SET state = excluded.state,"
    " finished_at = excluded.finished_at, entry = excluded.entry"
)


def default_receipts_path() -> Path:
    """``$KYRONIX_HOME/receipts.sqlite3`` (``KYRONIX_HOME`` defaults to ``~/.kyronix``)."""
    home = os.environ.get("KYRONIX_HOME") or os.path.join(os.path.expanduser("~"), ".kyronix")
    return Path(home) / "receipts.sqlite3"


def request_hash(tool: str, args: Mapping[str, str]) -> str:
    """What identifies a request beside its id: the tool and its raw arguments."""
    blob = json.dumps([tool, sorted(args.items())], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class Receipt:
    """One execution as the store records it."""

    scope: str
    execution_id: ExecutionId
    tool: str
    request_hash: str
    state: ReceiptState
    started_at: float
    finished_at: float | None
    pid: int
    host: str
    entry: dict[str, Any] | None

    @property
    def settled(self) -> bool:
        """It finished, or a person ruled on it: its entry is what later requests get back."""
        return self.state is not ReceiptState.STARTED and self.entry is not None


class ReceiptStore:
    """SQLite receipts; safe to share between threads and between processes.

    Raises :class:`~kyronix.errors.ReceiptStoreError` when the file cannot be opened, read or
    written (the message names the file and what to do).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        text_limit: int = STORED_TEXT_LIMIT,
    ) -> None:
        target = Path(path) if path is not None else default_receipts_path()
        self.path = target
        self.text_limit = text_limit
        """The most characters of one text a stored entry keeps (:data:`STORED_TEXT_LIMIT`)."""
        memory = str(target) == ":memory:"
        self._lock = threading.Lock()
        try:
            if not memory:
                target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._db = sqlite3.connect(
                str(target), timeout=30, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise ReceiptStoreError(
                f"cannot open the receipt store {target}: {_reason(exc)}. Pass receipts= (kyronix "
                f"exec --receipts) a file in a directory you can write, or set KYRONIX_HOME"
            ) from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            _migrate(self._db, target)
            if not memory:
                os.chmod(target, 0o600)
        except ReceiptStoreError:
            self._db.close()
            raise
        except sqlite3.Error as exc:
            self._db.close()
            raise ReceiptStoreError(
                f"cannot open the receipt store {target}: {exc}. Move the file aside (it holds "
                f"which tool executions already ran) or pass receipts= (kyronix exec --receipts) "
                f"another path"
            ) from None
        except OSError as exc:
            self._db.close()
            raise ReceiptStoreError(
                f"cannot open the receipt store {target}: {_reason(exc)}"
            ) from None
        self._host = socket.gethostname()

    @contextmanager
    def _using(self, doing: str) -> Iterator[sqlite3.Connection]:
        """The connection, under the store's lock, with SQLite's errors said in one sentence."""
        with self._lock:
            try:
                yield self._db
            except sqlite3.Error as exc:
                raise ReceiptStoreError(
                    f"the receipt store {self.path} could not {doing}: {exc}. If another "
                    f"executer holds it, wait for it; if the disk is full, free some space"
                ) from None

    # -- reads ---------------------------------------------------------------------------------

    def get(self, scope: str, execution_id: ExecutionId) -> Receipt | None:
        with self._using("read a receipt") as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM receipts WHERE scope = ? AND execution_id = ?",
                (scope, execution_id),
            ).fetchone()
        return _receipt(row) if row else None

    def get_many(
        self, scope: str, execution_ids: Sequence[ExecutionId]
    ) -> dict[ExecutionId, Receipt]:
        """The receipts among ``execution_ids`` (one query per 500 ids)."""
        found: dict[ExecutionId, Receipt] = {}
        ids = list(dict.fromkeys(execution_ids))
        with self._using("read receipts") as db:
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ",".join("?" * len(chunk))
                rows = db.execute(
                    f"SELECT {_COLUMNS} FROM receipts WHERE scope = ? AND"
                    f" execution_id IN ({marks})",
                    (scope, *chunk),
                ).fetchall()
                for row in rows:
                    receipt = _receipt(row)
                    found[receipt.execution_id] = receipt
        return found

    def uncertain(self, scope: str | None = None) -> list[Receipt]:
        """Executions that started and never finished (oldest first)."""
        query = f"SELECT {_COLUMNS} FROM receipts WHERE state = ?"
        params: tuple[str, ...] = (ReceiptState.STARTED.value,)
        if scope is not None:
            query += " AND scope = ?"
            params = (*params, scope)
        with self._using("list uncertain executions") as db:
            rows = db.execute(query + " ORDER BY started_at", params).fetchall()
        return [_receipt(r) for r in rows]

    # -- writes --------------------------------------------------------------------------------

    def start(
        self, scope: str, execution_id: ExecutionId, tool: str, digest: str
    ) -> Receipt | None:
        """Commit (and fsync) a ``started`` row. Returns None when it was written, or the row that
        was already there (another process, or an earlier life of this one, got there first)."""
        with self._using("record that a tool started") as db:
            cursor = db.execute(
                "INSERT INTO receipts (scope, execution_id, tool, request_hash, state, started_at,"
                " pid, host) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    scope,
                    execution_id,
                    tool,
                    digest,
                    ReceiptState.STARTED.value,
                    time.time(),
                    os.getpid(),
                    self._host,
                ),
            )
            inserted = cursor.rowcount == 1
        return None if inserted else self.get(scope, execution_id)

    def finish(
        self,
        scope: str,
        execution_id: ExecutionId,
        tool: str,
        digest: str,
        entry: Mapping[str, Any],
        *,
        durable: bool = True,
        state: ReceiptState = ReceiptState.FINISHED,
    ) -> None:
        """Record the result entry (``state`` ``finished``, or ``resolved`` for a ruling).
        ``durable=False`` (read-only tools) skips the fsync."""
        now = time.time()
        row = self._row(scope, execution_id, tool, digest, entry, now=now, state=state)
        with self._using("record a tool's result") as db:
            if not durable:
                db.execute("PRAGMA synchronous=NORMAL")
            try:
                db.execute(_UPSERT, row)
            finally:
                if not durable:
                    db.execute("PRAGMA synchronous=FULL")

    def finish_many(
        self, scope: str, rows: Sequence[tuple[ExecutionId, str, str, Mapping[str, Any]]]
    ) -> None:
        """Record several ``(execution_id, tool, digest, entry)`` results of read-only calls in
        one transaction, without waiting for fsync."""
        now = time.time()
        params = [
            self._row(scope, eid, tool, digest, entry, now=now, state=ReceiptState.FINISHED)
            for eid, tool, digest, entry in rows
        ]
        with self._using("record results") as db:
            db.execute("PRAGMA synchronous=NORMAL")
            try:
                db.execute("BEGIN")
                try:
                    db.executemany(_UPSERT, params)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            finally:
                db.execute("PRAGMA synchronous=FULL")

    def resolve(
        self,
        scope: str,
        execution_id: ExecutionId,
        ruling: Ruling,
        entry: Mapping[str, Any] | None,
    ) -> Receipt:
        """Settle an uncertain execution: ``rerun`` forgets it (the next request runs the tool);
        ``skipped``/``applied`` make it ``resolved`` with ``entry`` (what later requests get
        back). Raises :class:`~kyronix.errors.UnknownExecutionError` for an id with no receipt
        and :class:`~kyronix.errors.NotUncertainError` for one that is not uncertain."""
        receipt = self.get(scope, execution_id)
        if receipt is None:
            raise UnknownExecutionError(
                f"no execution {execution_id!r} is recorded for {scope}; list the uncertain ones "
                f"with uncertain_executions() (kyronix exec --uncertain --base {scope})"
            )
        if receipt.state is not ReceiptState.STARTED:
            how = (receipt.entry or {}).get("result", {}).get("resolved")
            done = f"already finished: a person resolved it as {how}" if how else "already finished"
            raise NotUncertainError(
                f"execution {execution_id!r} {done}; only an uncertain execution (started, never "
                f"finished) can be resolved"
            )
        if ruling is Ruling.RERUN:
            with self._using("forget an uncertain execution") as db:
                db.execute(
                    "DELETE FROM receipts WHERE scope = ? AND execution_id = ? AND state = ?",
                    (scope, execution_id, ReceiptState.STARTED.value),
                )
        else:
            if entry is None:
                raise NotUncertainError(f"resolving {execution_id!r} as {ruling} needs an entry")
            self.finish(
                scope,
                execution_id,
                receipt.tool,
                receipt.request_hash,
                entry,
                state=ReceiptState.RESOLVED,
            )
        return receipt

    def prune(self, older_than_s: float, scope: str | None = None) -> int:
        """Remove the settled rows (finished, or resolved by a person) that settled more than
        ``older_than_s`` seconds ago, under ``scope`` or everywhere; return how many went.

        An id pruned is forgotten: a request that carries it again runs again. Rows that
        started and never finished are kept whatever their age: they wait for a ruling."""
        if not older_than_s >= 0:
            raise KyronixUsageError(f"older_than_s is 0 or more seconds, got {older_than_s!r}")
        cutoff = time.time() - older_than_s
        query = "DELETE FROM receipts WHERE state != ? AND COALESCE(finished_at, started_at) < ?"
        params: tuple[Any, ...] = (ReceiptState.STARTED.value, cutoff)
        if scope is not None:
            query += " AND scope = ?"
            params = (*params, scope)
        with self._using("prune old receipts") as db:
            removed = db.execute(query, params).rowcount
        return int(removed)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _row(
        self,
        scope: str,
        execution_id: ExecutionId,
        tool: str,
        digest: str,
        entry: Mapping[str, Any],
        *,
        now: float,
        state: ReceiptState,
    ) -> tuple[Any, ...]:
        capped = cap_entry(entry, self.text_limit)
        blob = json.dumps(capped, ensure_ascii=False, separators=(",", ":"))
        pid, host = os.getpid(), self._host
        return (scope, execution_id, tool, digest, state.value, now, now, pid, host, blob)


def cap_entry(entry: Mapping[str, Any], limit: int) -> Mapping[str, Any]:
    """``entry`` with every text of its result longer than ``limit`` cut to it (a new dict;
    the entry itself is untouched, and returned as it is when nothing is too long). Each cut
    field is recorded in ``result.stored`` with its full length and SHA-256, and the result is
    marked ``truncated``."""
    result = entry.get("result")
    if not isinstance(result, Mapping):
        return entry
    stored: dict[str, dict[str, Any]] = {}

    def cut(value: Any, where: str) -> Any:
        if isinstance(value, str):
            if len(value) <= limit:
                return value
            encoded = value.encode("utf-8", "surrogatepass")
            stored[where] = {"length": len(value), "sha256": hashlib.sha256(encoded).hexdigest()}
            return value[:limit]
        if isinstance(value, Mapping):
            return {k: cut(v, f"{where}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [cut(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    fields = {k: cut(v, k) if k in ("output", "error", "data") else v for k, v in result.items()}
    if not stored:
        return entry
    fields["truncated"] = True
    fields["stored"] = {**fields.get("stored", {}), **stored}
    return {**entry, "result": fields}


def _receipt(row: tuple[Any, ...]) -> Receipt:
    entry = json.loads(row[9]) if row[9] is not None else None
    return Receipt(
        row[0],
        ExecutionId(row[1]),
        row[2],
        row[3],
        ReceiptState(row[4]),
        row[5],
        row[6],
        row[7],
        row[8],
        entry,
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, FileExistsError | NotADirectoryError):
        return f"{exc.filename} is not a directory"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the table to :data:`SCHEMA_VERSION` (in one transaction; other processes wait)."""
    if db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ReceiptStoreError(
                f"the receipt store {path} was written by a newer Kyronix (layout {version}, "
                f"this one knows {SCHEMA_VERSION}); upgrade kyronix or pass receipts= another path"
            )
        if version < SCHEMA_VERSION:
            old = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'receipts'"
            ).fetchone()
            if old is not None:  # layout 0: rebuild the table, whose CHECK cannot be altered
                db.execute("ALTER TABLE receipts RENAME TO receipts_v0")
                db.execute(_SCHEMA)
                db.execute(f"INSERT INTO receipts ({_COLUMNS}) SELECT {_COLUMNS} FROM receipts_v0")
                db.execute("DROP TABLE receipts_v0")
            else:
                db.execute(_SCHEMA)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
