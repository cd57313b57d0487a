"""The executer's durable receipts: one row per ``executionId``, so nothing runs twice.

The same rule as kiso's session log (DURABILITY.md), kept in SQLite because an executer serves
many envelopes and connections over its life, not one append-only session:

- before a tool with side effects runs, a ``started`` row is committed and fsynced;
- after it returns (success or failure), the row becomes ``finished`` with the whole result entry;
- a request whose id is ``finished`` gets the stored entry back and nothing runs;
- a request whose id is ``started`` but not finished (the executer died mid-tool) is *uncertain*:
  it is reported, never re-run automatically, until someone calls :meth:`ReceiptStore.resolve`.

Rows are keyed by ``(scope, execution_id)``; the scope is the real base path, so two projects on
one machine cannot replay each other's results. Each row also keeps a hash of the request (tool
name and raw arguments): the same id sent with a different call is a conflict, not a replay.

Read-only tools (``read_file``, ``read_lines``, ``list_dir``) skip the ``started`` row: re-running a
read is harmless, so an interrupted read is simply run again. Their ``finished`` row is written
without waiting for fsync (it survives a process crash, just not a power cut, and losing it only
means the read runs again).

The database runs in WAL mode with ``synchronous=FULL`` for the rows that guard side effects.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Receipt",
    "ReceiptStore",
    "default_receipts_path",
    "request_hash",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS receipts (
    scope        TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    tool         TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('started', 'finished')),
    started_at   REAL NOT NULL,
    finished_at  REAL,
    pid          INTEGER NOT NULL,
    host         TEXT NOT NULL,
    entry        TEXT,
    PRIMARY KEY (scope, execution_id)
) WITHOUT ROWID
"""

_UPSERT_FINISHED = (
    "INSERT INTO receipts (scope, execution_id, tool, request_hash, state, started_at,"
    " finished_at, pid, host, entry) VALUES (?, ?, ?, ?, 'finished', ?, ?, ?, ?, ?)"
    " ON CONFLICT (scope, execution_id) DO UPDATE SET state = 'finished',"
    " finished_at = excluded.finished_at, entry = excluded.entry"
)

Resolution = Literal["rerun", "skipped", "applied"]


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
    scope: str
    execution_id: str
    tool: str
    request_hash: str
    state: Literal["started", "finished"]
    started_at: float
    finished_at: float | None
    pid: int
    host: str
    entry: dict[str, Any] | None


class ReceiptStore:
    """SQLite receipts; safe to share between threads and between processes."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        target = Path(path) if path is not None else default_receipts_path()
        self.path = target
        if str(target) != ":memory:":
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                str(target), timeout=30, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise RuntimeError(
                f"cannot open the receipt store {target}: {exc}. Move the file aside (it holds "
                f"which tool executions already ran) or pass receipts= another path"
            ) from None
        if str(target) != ":memory:":
            os.chmod(target, 0o600)
        self._host = socket.gethostname()

    # -- reads ---------------------------------------------------------------------------------

    def get(self, scope: str, execution_id: str) -> Receipt | None:
        with self._lock:
            row = self._db.execute(
                "SELECT scope, execution_id, tool, request_hash, state, started_at, finished_at,"
                " pid, host, entry FROM receipts WHERE scope = ? AND execution_id = ?",
                (scope, execution_id),
            ).fetchone()
        return _receipt(row) if row else None

    def get_many(self, scope: str, execution_ids: Sequence[str]) -> dict[str, Receipt]:
        """The receipts among ``execution_ids`` (one query per 500 ids)."""
        found: dict[str, Receipt] = {}
        ids = list(dict.fromkeys(execution_ids))
        with self._lock:
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    "SELECT scope, execution_id, tool, request_hash, state, started_at,"
                    " finished_at, pid, host, entry FROM receipts WHERE scope = ? AND"
                    f" execution_id IN ({marks})",
                    (scope, *chunk),
                ).fetchall()
                for row in rows:
                    found[row[1]] = _receipt(row)
        return found

    def uncertain(self, scope: str | None = None) -> list[Receipt]:
        """Executions that started and never finished (oldest first)."""
        query = (
            "SELECT scope, execution_id, tool, request_hash, state, started_at, finished_at,"
            " pid, host, entry FROM receipts WHERE state = 'started'"
        )
        params: tuple[str, ...] = ()
        if scope is not None:
            query += " AND scope = ?"
            params = (scope,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY started_at", params).fetchall()
        return [_receipt(r) for r in rows]

    # -- writes --------------------------------------------------------------------------------

    def start(self, scope: str, execution_id: str, tool: str, digest: str) -> Receipt | None:
        """Commit (and fsync) a ``started`` row. Returns None when it was written, or the row that
        was already there (another process, or an earlier life of this one, got there first)."""
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO receipts (scope, execution_id, tool, request_hash, state, started_at,"
                " pid, host) VALUES (?, ?, ?, ?, 'started', ?, ?, ?) ON CONFLICT DO NOTHING",
                (scope, execution_id, tool, digest, time.time(), os.getpid(), self._host),
            )
            inserted = cursor.rowcount == 1
        return None if inserted else self.get(scope, execution_id)

    def finish(
        self,
        scope: str,
        execution_id: str,
        tool: str,
        digest: str,
        entry: Mapping[str, Any],
        *,
        durable: bool = True,
    ) -> None:
        """Record the result entry. ``durable=False`` (read-only tools) skips the fsync."""
        blob = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
        now = time.time()
        with self._lock:
            if not durable:
                self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                self._db.execute(
                    _UPSERT_FINISHED,
                    (scope, execution_id, tool, digest, now, now, os.getpid(), self._host, blob),
                )
            finally:
                if not durable:
                    self._db.execute("PRAGMA synchronous=FULL")

    def finish_many(
        self, scope: str, rows: Sequence[tuple[str, str, str, Mapping[str, Any]]]
    ) -> None:
        """Record several ``(execution_id, tool, digest, entry)`` results of read-only calls in
        one transaction, without waiting for fsync."""
        now = time.time()
        params = [
            (
                scope,
                eid,
                tool,
                digest,
                now,
                now,
                os.getpid(),
                self._host,
                json.dumps(entry, ensure_ascii=False, separators=(",", ":")),
            )
            for eid, tool, digest, entry in rows
        ]
        with self._lock:
            self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                self._db.execute("BEGIN")
                try:
                    self._db.executemany(_UPSERT_FINISHED, params)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            finally:
                self._db.execute("PRAGMA synchronous=FULL")

    def resolve(
        self, scope: str, execution_id: str, how: Resolution, entry: Mapping[str, Any] | None
    ) -> Receipt:
        """Settle an uncertain execution: ``rerun`` forgets it (the next request runs the tool);
        ``skipped``/``applied`` finish it with ``entry`` (what later requests get back)."""
        receipt = self.get(scope, execution_id)
        if receipt is None:
            raise KeyError(f"no execution {execution_id!r} is recorded for {scope}")
        if receipt.state != "started":
            raise ValueError(
                f"execution {execution_id!r} already finished; only an uncertain execution "
                f"(started, never finished) can be resolved"
            )
        if how == "rerun":
            with self._lock:
                self._db.execute(
                    "DELETE FROM receipts"
                    " WHERE scope = ? AND execution_id = ? AND state = 'started'",
                    (scope, execution_id),
                )
        elif how in ("skipped", "applied"):
            assert entry is not None
            self.finish(scope, execution_id, receipt.tool, receipt.request_hash, entry)
        else:
            raise ValueError(f"resolve with 'rerun', 'skipped' or 'applied', not {how!r}")
        return receipt

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _receipt(row: tuple[Any, ...]) -> Receipt:
    entry = json.loads(row[9]) if row[9] is not None else None
    return Receipt(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], entry)
