"""Timing helpers: interleaved repetitions, median of each side, ratio."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def compare(
    ours: Callable[[], None], floor: Callable[[], None], repeats: int
) -> tuple[float, float]:
    """Median seconds of ``ours`` and of ``floor``, run alternately so noise hits both alike."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeats):
        t = time.perf_counter()
        floor()
        b.append(time.perf_counter() - t)
        t = time.perf_counter()
        ours()
        a.append(time.perf_counter() - t)
    return statistics.median(a), statistics.median(b)


def verdict(ratio: float, target: float) -> str:
    return "ok" if ratio <= target else "OVER TARGET"
