"""The benchmarks keep working, and the one figure that is deterministic is checked here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench import size

ROOT = Path(__file__).resolve().parents[2]


def test_bytes_per_turn_stay_flat(tmp_path: Path) -> None:
    os.environ["BENCH_DIR"] = str(tmp_path)
    try:
        figures = size.run(400, window=100)
    finally:
        del os.environ["BENCH_DIR"]
    assert figures["spread"] <= size.TARGET
    assert 1_000 < figures["bytes_per_turn"] < 3_000


def test_every_benchmark_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BENCH_DIR": str(tmp_path)},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    for name in ("append", "load", "size", "kml", "executer"):
        assert f"\n{name} " in "\n" + out.stdout, out.stdout
    assert "ratio" in out.stdout
