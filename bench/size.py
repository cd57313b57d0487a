"""Benchmark 3: bytes on disk per turn over a long session must stay flat.

A 1,000-turn session is appended turn by turn; after every turn the file size is read. The bytes
added per turn are compared window by window: a log that re-wrote state (a checkpoint carrying the
whole history) would grow quadratically, and its later windows would cost more than its first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from bench.sessions import session_events
from kiso.kernel import JsonlSessionStore

TARGET = 1.25  # the largest window may cost at most this much more than the smallest


def run(turns: int, window: int = 100) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="kiso-bench-size-", dir=os.environ.get("BENCH_DIR")))
    try:
        ws = root / "ws"
        ws.mkdir()
        store = JsonlSessionStore(root / "home")
        sizes: list[int] = []
        with store.create(ws) as w:
            assert w.path is not None
            path = Path(w.path)
            pending = []
            for e in session_events(turns):
                pending.append(e)
                if e.type == "execution_finished":  # the end of one tool-calling turn
                    w.append(*pending)
                    pending = []
                    sizes.append(path.stat().st_size)
            w.append(*pending)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_window = [
        (sizes[i + window - 1] - (sizes[i - 1] if i else 0)) / window
        for i in range(0, len(sizes) - window + 1, window)
    ]
    spread = max(per_window) / min(per_window)
    first, last = per_window[0], per_window[-1]
    print(
        f"size     {turns:>7,} turns: {sizes[-1] / turns:7.0f} bytes/turn overall; per window of "
        f"{window}: first {first:.0f}, last {last:.0f}, max/min {spread:4.2f}x"
        f"  (flat if <= {TARGET}x: {'ok' if spread <= TARGET else 'GROWING'})"
    )
    return {
        "turns": turns,
        "bytes_per_turn": sizes[-1] / turns,
        "first": first,
        "last": last,
        "spread": spread,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--turns", type=int, default=1_000)
    a = p.parse_args(argv)
    run(a.turns)


if __name__ == "__main__":
    main()
