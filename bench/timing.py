"""Timing helpers: interleaved repetitions, median of each side, ratio."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path


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


def write_and_fsync(lines: list[bytes], path: Path) -> float:
    """The floor of a durable log: one ``write`` + ``fsync`` per record. Returns seconds."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    began = time.perf_counter()
    try:
        for line in lines:
            os.write(fd, line)
            os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - began


def verdict(ratio: float, target: float) -> str:
    return "ok" if ratio <= target else "OVER TARGET"
