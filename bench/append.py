"""Benchmark 1: appending events one at a time, each fsynced, vs a bare write + fsync loop.

Both sides write the same bytes, one record per write(2) followed by fsync(2), into a fresh file
on the same file system. Ours also stamps, validates and serialises each event and checks that
the file did not change underneath it. Target: at most 1.3x the floor.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import tempfile
from pathlib import Path

from bench.sessions import session_events
from bench.timing import compare, verdict, write_and_fsync
from kiso.kernel import JsonlSessionStore

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
    return {"events": n, "ours_s": t_ours, "floor_s": t_floor, "ratio": ratio}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-n", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    run(a.n, a.repeats)


if __name__ == "__main__":
    main()
