"""Benchmark 2: load + validate + project + plan of a long session vs json.loads of each line.

The floor reads the same file, decodes it and parses every line with json.loads. Two floors are
measured: the strict one throws each parsed line away (the least work there is); the loader one
keeps them in a list, as anything that loads a log must, and pays the garbage collector for it as
we do. Ours validates every field of every event, checks seq contiguity, builds the frozen events,
projects the model's messages and plans the next action, the way a resume does it: one fold of
the log (kiso.kernel.replay) gives both. Target: at most 2x the strict floor.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path

from bench.sessions import session_events
from bench.timing import compare, verdict
from kiso.kernel import JsonlSessionStore, project, replay
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
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = t_ours / t_floor
    print(
        f"load     {n:>7,} events ({size / 1e6:5.1f} MB, {messages:,} messages): ours "
        f"{t_ours:6.2f} s  floor {t_floor:6.2f} s  ratio {ratio:4.2f}x"
        f"  (target <= {TARGET}x: {verdict(ratio, TARGET)});"
        f" vs json.loads keeping the lines ({t_kept:.2f} s): {t_ours / t_kept:4.2f}x"
    )
    return {
        "events": n,
        "bytes": size,
        "ours_s": t_ours,
        "floor_s": t_floor,
        "floor_kept_s": t_kept,
        "ratio": ratio,
        "ratio_kept": t_ours / t_kept,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-n", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    run(a.n, a.repeats)


if __name__ == "__main__":
    main()
