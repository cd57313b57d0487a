"""Benchmark 1: appending events one at a time, each fsynced, vs a bare write + fsync loop.

Both sides write the same bytes, one record per write(2) followed by fsync(2), into a fresh file
on the same file system. Ours also stamps, validates and serialises each event and checks that
the file did not change underneath it. Target: at most 1.3x the floor.

The ``append-sql`` row does the same through ``SqlSessionStore`` on SQLite (WAL,
``synchronous=FULL``: one transaction a batch, the lease checked, the session row moved, the
row inserted), against the least a durable SQLite row costs: ``BEGIN IMMEDIATE``, one
``INSERT``, ``COMMIT`` on a bare connection with the same settings. Reported, not judged; the
commits are counted (one per append).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from bench.sessions import session_events
from bench.timing import compare, verdict, write_and_fsync
from kiso.kernel import Event, JsonlSessionStore
from kiso.kernel.events import dumps_line

TARGET = 1.3


def run(n: int, repeats: int) -> dict[str, float]:
    events = list(itertools.islice(session_events(n), n))
    root = Path(tempfile.mkdtemp(prefix="kiso-bench-append-", dir=os.environ.get("BENCH_DIR")))
    counter = itertools.count()
    try:
        sample = root / "sample"
        ws = root / "ws"
        ws.mkdir()

        def ours(home: Path | None = None) -> Path:
            store = JsonlSessionStore(home or root / f"ours-{next(counter)}")
            with store.create(ws) as w:
                for e in events:
                    w.append(e)
                assert w.path is not None
                return Path(w.path)

        lines = ours(sample).read_bytes().splitlines(keepends=True)

        def floor() -> None:
            write_and_fsync(lines, root / f"floor-{next(counter)}.jsonl")

        t_ours, t_floor = compare(lambda: ours() and None, floor, repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = t_ours / t_floor
    print(
        f"append   {n:>7,} events, fsync each: "
        f"ours {t_ours:6.2f} s ({t_ours / n * 1e6:6.1f} us/event)"
        f"  floor {t_floor:6.2f} s ({t_floor / n * 1e6:6.1f} us/event)"
        f"  ratio {ratio:4.2f}x  (target <= {TARGET}x: {verdict(ratio, TARGET)})"
    )
    figures = {"events": n, "ours_s": t_ours, "floor_s": t_floor, "ratio": ratio}
    figures.update(run_sql(events, repeats, t_floor))
    return figures


def run_sql(events: list[Event], repeats: int, t_file: float) -> dict[str, float]:
    """The SQL store's row: appends one at a time through SqlSessionStore vs a bare SQLite
    transaction per row (same settings); ``t_file`` is the JSONL floor, for reference."""
    from sqlalchemy import event

    from kiso.kernel.sql import BUSY_TIMEOUT_MS, SqlSessionStore, create_schema

    n = len(events)
    root = Path(tempfile.mkdtemp(prefix="kiso-bench-sql-", dir=os.environ.get("BENCH_DIR")))
    counter = itertools.count()
    commits = [0]
    try:
        ws = root / "ws"
        ws.mkdir()
        lines: list[str] = []

        def ours() -> None:
            store = SqlSessionStore(f"sqlite:///{root / f'ours-{next(counter)}.db'}")
            create_schema(store.engine)
            event.listen(
                store.engine, "commit", lambda conn: commits.__setitem__(0, commits[0] + 1)
            )
            with store.create(ws) as w:
                commits[0] = 0
                for e in events:
                    w.append(e)
                sid = w.id
            if not lines:
                lines.extend(dumps_line(e.to_json()).decode()[:-1] for e in store.load(sid).events)
            store.close()

        ours()  # warm up, and the lines the floor writes

        def floor() -> None:
            db = sqlite3.connect(root / f"floor-{next(counter)}.db", isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            db.execute("CREATE TABLE e (s TEXT, seq INTEGER, line TEXT, PRIMARY KEY (s, seq))")
            for seq, line in enumerate(lines, 1):
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO e VALUES (?, ?, ?)", ("s", seq, line))
                db.execute("COMMIT")
            db.close()

        t_ours, t_floor = compare(ours, floor, repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = t_ours / t_floor
    print(
        f"append-sql {n:>5,} events, commit each: "
        f"ours {t_ours:6.2f} s ({n / t_ours:6.0f} appends/s, {commits[0] / n:.2f} commits/event)"
        f"  sqlite floor {t_floor:6.2f} s ({n / t_floor:6.0f}/s)  ratio {ratio:4.2f}x"
        f"  (vs the JSONL floor: {t_ours / t_file:4.2f}x)"
    )
    return {"sql_s": t_ours, "sql_floor_s": t_floor, "sql_ratio": ratio, "sql_commits": commits[0]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-n", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    run(a.n, a.repeats)


if __name__ == "__main__":
    main()
