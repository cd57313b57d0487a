"""Benchmark: appends don't block the event loop (issue 10).

Many SDK sessions in one process share one event loop. Every durable append (``write`` +
``fsync``) made on that loop stalls every other session and every timer until it returns, so
running sessions side by side buys nothing, and the process stops answering while they run.

* 50 sessions (``--sessions``), each its own ``JsonlSessionStore`` session in one shared temporary
  KISO home, each driven by its own scripted model: ``--rounds`` turns that call a tool, then a text
  turn. The tool's handler is an async function that does nothing; it is declared with side
  effects (``effects="other"``), and in a second variant read-only (``effects="read"``). The mode
  is ``bypass``, so nothing asks.
* concurrent: all the sessions' ``session.run()`` iterated with ``asyncio.gather`` in one event
  loop, while a 1 ms timer (``await asyncio.sleep(0.001)`` in a loop) records how late each tick
  fires (actual minus expected wake-up). Target: lag p99 <= 5 ms.
* serial: as many fresh sessions run one after another in the same process (the timer running
  too, so both sides pay for it). Throughput is tool rounds per second; target: concurrent >= 3x
  serial. ``--repeat`` pairs of runs, alternating which goes first; medians of each side.
* ``os.fsync`` (and ``os.fdatasync``) are counted while the runs go: fsyncs per tool round is the
  fsync budget the log spends (4 with one fsync per append: the turn, the verdict, the start,
  the receipt), in the concurrent runs and in the serial ones.
* the same on ``MemorySessionStore`` (no appends to disk at all), for reference: the lag and the
  speed-up the loop itself allows. Only the JSONL rows are judged.

Everything goes through the public API (``Agent``, ``agent.session()``, ``session.run``), so the
figures follow whatever the runtime does underneath.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kiso.kernel import JsonlSessionStore, MemorySessionStore, SessionStore
from kiso.providers import FauxAdapter
from kiso.runtime import Agent, Session
from kiso.tools.base import ToolContext, define_tool

TARGET_P99_MS = 5.0
TARGET_SPEEDUP = 3.0
TICK = 0.001


def _tool(effects: str) -> Any:
    async def act(args: dict[str, Any], ctx: ToolContext) -> str:
        return "ok"

    return define_tool(
        "act",
        "Do something (nothing, in fact)",
        {"type": "object", "properties": {"i": {"type": "integer"}}},
        act,
        effects=effects,
    )


def _script(rounds: int, model_ms: int) -> list[Mapping[str, Any]]:
    turns: list[Mapping[str, Any]] = [
        {"tool_calls": [{"name": "act", "input": {"i": i}}], "delay_ms": model_ms}
        for i in range(rounds)
    ]
    return [*turns, {"text": "done", "delay_ms": model_ms}]


def _open(
    store: SessionStore, ws: Path, *, effects: str, rounds: int, count: int, model_ms: int
) -> list[Session]:
    """``count`` fresh sessions, each with its own agent and scripted model (not timed)."""
    sessions = []
    for _ in range(count):
        agent = Agent(
            adapter=FauxAdapter(_script(rounds, model_ms)),
            tools=[_tool(effects)],
            store=store,
            workspace=ws,
            mode="bypass",
            max_turns=rounds + 5,
        )
        sessions.append(agent.session())
    return sessions


async def _drive(session: Session) -> tuple[int, str | None]:
    """Run the session's prompt to its end: (tool receipts seen, outcome kind)."""
    tools, outcome = 0, None
    async for event in session.run("go"):
        if event.type == "tool_end":
            tools += 1
        elif event.type == "terminal":
            outcome = event.outcome.kind  # type: ignore[union-attr]
    return tools, outcome


async def _tick(lags: list[float]) -> None:
    """Sleep 1 ms, again and again; record how late each wake-up is (seconds)."""
    while True:
        began = time.perf_counter()
        await asyncio.sleep(TICK)
        lags.append(max(0.0, time.perf_counter() - began - TICK))


@contextmanager
def _count_fsyncs() -> Iterator[list[int]]:
    """Count ``os.fsync`` and ``os.fdatasync`` calls (from any thread) while the block runs."""
    counter = [0]
    lock = threading.Lock()
    originals: dict[str, Callable[[int], None]] = {}

    def counting(original: Callable[[int], None]) -> Callable[[int], None]:
        def wrapper(fd: int) -> None:
            with lock:
                counter[0] += 1
            original(fd)

        return wrapper

    for name in ("fsync", "fdatasync"):
        if hasattr(os, name):
            originals[name] = getattr(os, name)
            setattr(os, name, counting(originals[name]))
    try:
        yield counter
    finally:
        for name, original in originals.items():
            setattr(os, name, original)


def _phase(sessions: list[Session], concurrent: bool) -> dict[str, Any]:
    """Run every session (all at once, or one after another) with the timer ticking."""
    lags: list[float] = []

    async def main() -> tuple[float, list[tuple[int, str | None]]]:
        ticker = asyncio.create_task(_tick(lags))
        await asyncio.sleep(0)  # the ticker has started its first sleep
        began = time.perf_counter()
        if concurrent:
            results = list(await asyncio.gather(*(_drive(s) for s in sessions)))
        else:
            results = [await _drive(s) for s in sessions]
        elapsed = time.perf_counter() - began
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        return elapsed, results

    with _count_fsyncs() as fsyncs:
        elapsed, results = asyncio.run(main())
    bad = [outcome for _, outcome in results if outcome != "completed"]
    assert not bad, f"runs did not complete: {bad[:3]}"
    return {
        "elapsed": elapsed,
        "tool_rounds": sum(tools for tools, _ in results),
        "fsyncs": fsyncs[0],
        "lags": lags,
    }


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _idle_lag() -> float:
    """The timer's p99 lag with nothing else on the loop (its own granularity), in ms."""
    lags: list[float] = []

    async def main() -> None:
        ticker = asyncio.create_task(_tick(lags))
        await asyncio.sleep(0.2)
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)

    asyncio.run(main())
    return _percentile(lags, 0.99) * 1e3


def _measure(
    root: Path,
    store_kind: str,
    *,
    effects: str,
    count: int,
    rounds: int,
    model_ms: int,
    repeat: int,
) -> dict[str, Any]:
    """``repeat`` pairs of a concurrent and a serial run, alternating which goes first so that
    noise (a disk busy with other work) hits both sides; throughput from the median of each
    side, the lag percentiles over the ticks of every concurrent run."""
    ws = root / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    store: SessionStore = (
        JsonlSessionStore(root / "home") if store_kind == "jsonl" else MemorySessionStore()
    )
    total = count * rounds
    phases: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for i in range(repeat):
        for concurrent in (True, False) if i % 2 == 0 else (False, True):
            sessions = _open(
                store, ws, effects=effects, rounds=rounds, count=count, model_ms=model_ms
            )
            try:
                figures = _phase(sessions, concurrent)
            finally:
                for session in sessions:
                    session.close()
            assert figures["tool_rounds"] == total, figures["tool_rounds"]
            phases[concurrent].append(figures)
    conc, ser = phases[True], phases[False]
    lags = [lag for figures in conc for lag in figures["lags"]]
    t_conc = statistics.median(f["elapsed"] for f in conc)
    t_ser = statistics.median(f["elapsed"] for f in ser)
    return {
        "effects": effects,
        "store": store_kind,
        "sessions": count,
        "rounds": rounds,
        "repeat": repeat,
        "tool_rounds": total,
        "ticks": len(lags),
        "lag_p50_ms": _percentile(lags, 0.50) * 1e3,
        "lag_p99_ms": _percentile(lags, 0.99) * 1e3,
        "lag_max_ms": max(lags, default=0.0) * 1e3,
        "serial_lag_p99_ms": _percentile([lag for f in ser for lag in f["lags"]], 0.99) * 1e3,
        "concurrent_s": t_conc,
        "serial_s": t_ser,
        "concurrent_rps": total / t_conc,
        "serial_rps": total / t_ser,
        "ratio": t_ser / t_conc,
        "fsyncs_per_round": sum(f["fsyncs"] for f in conc) / (total * repeat),
        "serial_fsyncs_per_round": sum(f["fsyncs"] for f in ser) / (total * repeat),
    }


def run(
    sessions: int = 50, rounds: int = 20, model_ms: int = 0, repeat: int = 3
) -> list[dict[str, Any]]:
    """Both variants (side effects, read-only) on JSONL and, for reference, in memory."""
    root = Path(tempfile.mkdtemp(prefix="kiso-bench-conc-", dir=os.environ.get("BENCH_DIR")))
    saved_home = os.environ.get("KISO_HOME")
    os.environ["KISO_HOME"] = str(root / "home")  # rules and anything else stay in the temp home
    results = []
    try:
        idle = _idle_lag()
        print(
            f"concurrency  {sessions} sessions x {rounds} rounds (model {model_ms} ms/turn), "
            f"{repeat} concurrent and {repeat} serial runs each, 1 ms timer; "
            f"idle loop lag p99 {idle:.2f} ms"
        )
        print(
            f"{'effects':>7}  {'store':>5}  {'lag p50':>7}  {'p99':>6}  {'max':>6}  "
            f"{'serial p99':>10}  {'serial r/s':>10}  {'concurrent r/s':>14}  {'ratio':>6}  "
            f"{'fsyncs/round':>12}  {'serial':>6}  {'ticks':>6}"
        )
        for effects in ("other", "read"):
            for store_kind in ("jsonl", "mem"):
                where = root / f"{effects}-{store_kind}"
                row = _measure(
                    where,
                    store_kind,
                    effects=effects,
                    count=sessions,
                    rounds=rounds,
                    model_ms=model_ms,
                    repeat=repeat,
                )
                row["idle_lag_p99_ms"] = idle
                results.append(row)
                print(
                    f"{effects:>7}  {store_kind:>5}  {row['lag_p50_ms']:7.2f}  "
                    f"{row['lag_p99_ms']:6.2f}  {row['lag_max_ms']:6.1f}  "
                    f"{row['serial_lag_p99_ms']:10.2f}  {row['serial_rps']:10.0f}  "
                    f"{row['concurrent_rps']:14.0f}  {row['ratio']:5.2f}x  "
                    f"{row['fsyncs_per_round']:12.2f}  {row['serial_fsyncs_per_round']:6.2f}  "
                    f"{row['ticks']:6d}",
                    flush=True,
                )
    finally:
        if saved_home is None:
            os.environ.pop("KISO_HOME", None)
        else:
            os.environ["KISO_HOME"] = saved_home
        shutil.rmtree(root, ignore_errors=True)
    print(
        "lag in ms, over the concurrent runs' timer ticks (serial p99: the serial runs'); "
        "r/s: tool rounds per second; ratio: concurrent r/s over serial r/s; fsyncs per tool "
        "round in the concurrent run and in the serial one"
    )
    for row in results:
        if row["store"] != "jsonl":
            continue
        lag_ok = row["lag_p99_ms"] <= TARGET_P99_MS
        speed_ok = row["ratio"] >= TARGET_SPEEDUP
        # Read-only rounds wait on no fsync (their batches are written in the background), so
        # run one after another they are already bound by the loop's CPU: nothing to overlap.
        judged = (
            f"(target >= {TARGET_SPEEDUP:g}x: {'ok' if speed_ok else 'UNDER TARGET'})"
            if row["effects"] == "other"
            else "(not judged: read rounds wait on no fsync, so serial runs are CPU-bound too)"
        )
        print(
            f"concurrency  effects={row['effects']}, jsonl: lag p99 {row['lag_p99_ms']:.2f} ms "
            f"(target <= {TARGET_P99_MS:g} ms: {'ok' if lag_ok else 'OVER TARGET'}); "
            f"concurrent/serial {row['ratio']:.2f}x {judged}"
        )
    return results


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sessions", type=int, default=50, help="sessions run side by side")
    p.add_argument("--rounds", type=int, default=20, help="tool rounds per session")
    p.add_argument(
        "--model-ms", type=int, default=0, help="scripted model latency per turn (default 0)"
    )
    p.add_argument("--repeat", type=int, default=3, help="runs of each kind (median)")
    a = p.parse_args(argv)
    run(a.sessions, a.rounds, a.model_ms, a.repeat)


if __name__ == "__main__":
    main()
