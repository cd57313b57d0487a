"""The Kyronix server against a bare endpoint on the same stack: ``python -m bench.server``.

* latency: ``POST /api/agents/coding`` (scripted model: auth, a credit hold, a kiso session in
  SQLite, KML, the settle) against a bare FastAPI ``POST`` that returns a JSON body of the same
  size, both under uvicorn in their own process, one httpx2 keep-alive client, requests
  alternated so noise hits both alike: p50, p99 and the p50 ratio (goal <= 3x);
* throughput: 20 concurrent clients (threads, one keep-alive client each), runs per second with
  credits on SQLite, and the same for the bare endpoint;
* the ledger's cost per run: its rows, its bytes in the database, and the time of the two credit
  transactions (reserve, settle) measured alone on the same SQLite settings.

``--quick`` runs small sizes (a smoke test). Figures depend on the machine: compare ratios.
"""

from __future__ import annotations

import argparse
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2

GOAL = 3.0

BARE = """
import sys
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()
PAYLOAD = {"response": "x" * int(sys.argv[2]), "sessionId": "sess_0", "creditsRemaining": 1.0}

@app.post("/bare")
async def bare(request: Request) -> JSONResponse:
    await request.json()
    return JSONResponse(PAYLOAD)

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server at {url} exited")
        try:
            httpx2.get(url, timeout=1)
            return
        except httpx2.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"the server at {url} did not start")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _bootstrap(home: Path) -> str:
    from kyronix.server import accounts
    from kyronix.server.accounts import load_secret
    from kyronix.server.config import ensure_home
    from kyronix.server.db import Database
    from kyronix.server.migrations import migrate

    ensure_home(home)
    db = Database(f"sqlite:///{home / 'kyronix.sqlite3'}")
    try:
        migrate(db)
        secret = load_secret(home)
        project = db.write(lambda c: accounts.create_project(c, "bench", 10**9 * 1000))
        key, _ = db.write(lambda c: accounts.create_key(c, secret, project.id))
    finally:
        db.close()
    return key


def _ledger_cost(home: Path, runs: int) -> dict[str, float]:
    """The two credit transactions of a run, alone, on the same SQLite settings."""
    from kyronix.server import accounts, billing
    from kyronix.server.db import Database

    db = Database(f"sqlite:///{home / 'ledger-only.sqlite3'}")
    from kyronix.server.migrations import migrate

    try:
        migrate(db)
        project = db.write(lambda c: accounts.create_project(c, "ledger", 10**9))
        size_before = (home / "ledger-only.sqlite3").stat().st_size
        began = time.perf_counter()
        for i in range(runs):
            rid = f"run_{i:08d}"
            db.write(lambda c, r=rid: billing.reserve(c, project.id, r, 500, 900_000))
            db.write(lambda c, r=rid: billing.settle(c, r, 500))
        seconds = time.perf_counter() - began
        assert db.read(lambda c: billing.ledger_sum(c, project.id)) == db.read(
            lambda c: billing.balance(c, project.id)
        )
    finally:
        db.close()
    with sqlite3.connect(home / "ledger-only.sqlite3") as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    grown = (home / "ledger-only.sqlite3").stat().st_size - size_before
    return {"ms_per_run": seconds / runs * 1000, "bytes_per_run": grown / runs}


def _commit_floor(path: Path, n: int) -> float:
    """Median ms of one durable SQLite commit, with the server's settings."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (x INTEGER)")
        times = []
        for i in range(n):
            t = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?)", (i,))
            conn.execute("COMMIT")
            times.append(time.perf_counter() - t)
    finally:
        conn.close()
    return statistics.median(times) * 1000


def run(requests: int = 400, concurrent_runs: int = 400, clients: int = 20) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        home = Path(tmp) / "home"
        key = _bootstrap(home)
        env = {**os.environ, "KYRONIX_HOME": str(home), "KYRONIX_RATE_LIMIT": "10000000",
               "KYRONIX_RATE_BURST": "10000000"}  # fmt: skip
        port = _free_port()
        ours = subprocess.Popen(
            [sys.executable, "-c", "from kyronix.cli import main; main()", "serve",
             "--port", str(port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        bare_port = _free_port()
        bare = subprocess.Popen(
            [sys.executable, "-c", BARE, str(bare_port), "900"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base, bare_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{bare_port}"
            _wait(base + "/healthz", ours)
            _wait(bare_url + "/docs", bare)
            headers = {"Authorization": f"Bearer {key}"}
            body = {"input": "Create a React component called Button in src/components/Button.tsx"}
            a: list[float] = []
            b: list[float] = []
            with httpx2.Client(base_url=base, headers=headers, timeout=60) as c_ours, \
                    httpx2.Client(base_url=bare_url, timeout=60) as c_bare:  # fmt: skip
                for _ in range(20):  # warm up both
                    c_ours.post("/api/agents/coding", json=body).raise_for_status()
                    c_bare.post("/bare", json=body).raise_for_status()
                for _ in range(requests):
                    t = time.perf_counter()
                    c_bare.post("/bare", json=body).raise_for_status()
                    b.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    r = c_ours.post("/api/agents/coding", json=body)
                    a.append(time.perf_counter() - t)
                    r.raise_for_status()
                size = len(r.content)
            p50_ours, p50_bare = statistics.median(a) * 1000, statistics.median(b) * 1000
            p99_ours, p99_bare = _percentile(a, 0.99) * 1000, _percentile(b, 0.99) * 1000
            ratio = p50_ours / p50_bare
            print(
                f"server latency: POST /api/agents/coding p50 {p50_ours:.2f} ms, p99 "
                f"{p99_ours:.2f} ms; bare POST p50 {p50_bare:.2f} ms, p99 {p99_bare:.2f} ms; "
                f"ratio {ratio:.2f}x at p50 (goal <= {GOAL:g}x: "
                f"{'ok' if ratio <= GOAL else 'OVER TARGET'}); response {size} bytes"
            )

            def storm(url: str, path: str, hdrs: dict[str, str]) -> float:
                per = max(1, concurrent_runs // clients)
                local = threading.local()

                def one(_: int) -> None:
                    client = getattr(local, "client", None)
                    if client is None:
                        client = local.client = httpx2.Client(
                            base_url=url, headers=hdrs, timeout=120
                        )
                    client.post(path, json=body).raise_for_status()

                began = time.perf_counter()
                with ThreadPoolExecutor(clients) as pool:
                    list(pool.map(one, range(per * clients)))
                return per * clients / (time.perf_counter() - began)

            ours_rps = storm(base, "/api/agents/coding", headers)
            bare_rps = storm(bare_url, "/bare", {})
            print(
                f"server throughput: {clients} concurrent clients, {ours_rps:.0f} runs/s "
                f"(credits on SQLite) vs {bare_rps:.0f} requests/s bare "
                f"({bare_rps / ours_rps:.1f}x)"
            )
        finally:
            for proc in (ours, bare):
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        ledger = _ledger_cost(Path(tmp), max(50, requests // 2))
        floor = _commit_floor(Path(tmp) / "floor.sqlite3", 200)
        print(
            f"server floor: one SQLite commit (WAL, synchronous=FULL) {floor:.2f} ms here; a run "
            f"with a new session commits twice (the admission: idempotency key, credit hold, "
            f"session rows, run row; then the turn's batch: its events, its result, the settle): "
            f"{2 * floor:.2f} ms of fsync floor + the bare {p50_bare:.2f} ms = "
            f"{2 * floor + p50_bare:.2f} ms ({(2 * floor + p50_bare) / p50_bare:.2f}x)"
        )
        print(
            f"server ledger: 3 rows a run (hold, release, settle), "
            f"{ledger['bytes_per_run']:.0f} bytes a run in the database, reserve + settle "
            f"{ledger['ms_per_run']:.2f} ms a run (two fsynced transactions)"
        )
    return {
        "commit_floor_ms": floor,
        "p50_ms": p50_ours,
        "p99_ms": p99_ours,
        "bare_p50_ms": p50_bare,
        "bare_p99_ms": p99_bare,
        "ratio": ratio,
        "runs_per_s": ours_rps,
        "bare_per_s": bare_rps,
        "ledger_ms_per_run": ledger["ms_per_run"],
        "ledger_bytes_per_run": ledger["bytes_per_run"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    a = p.parse_args()
    if a.quick:
        run(40, 40, 4)
    else:
        run()


if __name__ == "__main__":
    main()
