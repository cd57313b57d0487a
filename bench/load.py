"""Benchmark 2: load + validate + project + plan of a long session vs json.loads of each line.

The floor reads the same file, decodes it and parses every line with json.loads. Two floors are
measured: the strict one throws each parsed line away (the least work there is); the loader one
keeps them in a list, as anything that loads a log must, and pays the garbage collector for it as
we do. Ours validates every field of every event, checks seq contiguity, builds the frozen events,
projects the model's messages and plans the next action, the way a resume does it: one fold of
the log (kiso.kernel.replay) gives both. Target: at most 2x the strict floor.

The ``load-sql`` row loads the same session from ``SqlSessionStore`` (SQLite): one query for the
rows, the lines joined back and validated by the same loader, then the same fold; shown against
the JSONL load and the strict floor. Reported, not judged.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.sessions import session_events
from bench.timing import compare, verdict
from kiso.kernel import Event, JsonlSessionStore, project, replay
from kiso.kernel.recovery import plan_replay

TARGET = 2.0


def run(n: int, repeats: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="kiso-bench-load-", dir=os.environ.get("BENCH_DIR")))
    try:
        ws = root / "ws"
        ws.mkdir()
        store = JsonlSessionStore(root / "home")
        events = session_events(n)  # more turns than needed; cut at n events
        with store.create(ws) as w:
            sid = w.id
            remaining = n
            while remaining:
                batch = list(itertools.islice(events, min(remaining, 1000)))
                w.append(*batch)
                remaining -= len(batch)
        path = store.path_of(sid)
        size = path.stat().st_size

        def ours() -> None:
            log = store.load(sid)
            state = replay(log.events)  # the projection is state.messages
            plan_replay(state)

        def floor() -> None:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8")
            loads = json.loads
            for line in text.splitlines():
                loads(line)

        def floor_kept() -> None:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8")
            loads = json.loads
            kept = [loads(line) for line in text.splitlines()]
            del kept

        t_ours, t_floor = compare(ours, floor, repeats)
        _, t_kept = compare(ours, floor_kept, max(1, repeats // 2))
        log = store.load(sid)
        messages = len(project(log.events))
        t_sql = run_sql(root, log.events, ours, repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = t_ours / t_floor
    print(
        f"load     {n:>7,} events ({size / 1e6:5.1f} MB, {messages:,} messages): ours "
        f"{t_ours:6.2f} s  floor {t_floor:6.2f} s  ratio {ratio:4.2f}x"
        f"  (target <= {TARGET}x: {verdict(ratio, TARGET)});"
        f" vs json.loads keeping the lines ({t_kept:.2f} s): {t_ours / t_kept:4.2f}x"
    )
    print(
        f"load-sql {n:>7,} events: ours {t_sql:6.2f} s  vs the JSONL load {t_sql / t_ours:4.2f}x"
        f"  vs the strict floor {t_sql / t_floor:4.2f}x"
    )
    return {
        "events": n,
        "bytes": size,
        "ours_s": t_ours,
        "floor_s": t_floor,
        "floor_kept_s": t_kept,
        "ratio": ratio,
        "ratio_kept": t_ours / t_kept,
        "sql_s": t_sql,
        "sql_ratio_jsonl": t_sql / t_ours,
    }


def run_sql(root: Path, events: Sequence[Event], jsonl: Callable[[], None], repeats: int) -> float:
    """Seconds to load + fold the same session from the SQL store (median, alternated with the
    JSONL load ``jsonl``)."""
    from kiso.kernel.sql import SqlSessionStore, create_schema

    store = SqlSessionStore(f"sqlite:///{root / 'sessions.db'}")
    try:
        create_schema(store.engine)
        with store.create(root / "ws") as w:
            sid = w.id
            for start in range(0, len(events), 1000):
                w.append(*events[start : start + 1000])

        def ours() -> None:
            log = store.load(sid)
            plan_replay(replay(log.events))

        t_sql, _ = compare(ours, jsonl, repeats)
    finally:
        store.close()
    return t_sql


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-n", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    run(a.n, a.repeats)


if __name__ == "__main__":
    main()
