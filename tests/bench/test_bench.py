"""The benchmarks keep working, and the one figure that is deterministic is checked here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import concurrency, size

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
    names = ("append", "load", "size", "kml", "executer", "concurrency", "server", "tunnel",
             "replicas")  # fmt: skip
    for name in names:
        assert f"\n{name} " in "\n" + out.stdout, out.stdout
    assert "ratio" in out.stdout


def test_concurrency_bench_runs_and_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A smoke run: no timing is asserted (machines here are noisy), only that it ran every
    variant to completion and that its counts add up."""
    monkeypatch.setenv("BENCH_DIR", str(tmp_path))
    home = os.environ.get("KISO_HOME")
    rows = concurrency.run(sessions=3, rounds=2, repeat=2)
    assert os.environ.get("KISO_HOME") == home  # the bench put it back
    assert [(r["effects"], r["store"]) for r in rows] == [
        ("other", "jsonl"),
        ("other", "mem"),
        ("read", "jsonl"),
        ("read", "mem"),
    ]
    for row in rows:
        assert (row["sessions"], row["rounds"], row["repeat"], row["tool_rounds"]) == (3, 2, 2, 6)
        assert row["concurrent_rps"] > 0 and row["serial_rps"] > 0 and row["ratio"] > 0
        assert 0 <= row["lag_p50_ms"] <= row["lag_p99_ms"] <= row["lag_max_ms"]
        assert row["ticks"] >= 0
    for jsonl, mem in (rows[0], rows[1]), (rows[2], rows[3]):
        assert jsonl["fsyncs_per_round"] > 0  # the durable log syncs something
        assert mem["fsyncs_per_round"] == mem["serial_fsyncs_per_round"] == 0
    assert list(tmp_path.iterdir()) == []  # the temporary home is gone
