"""Kyronix server replicas on one PostgreSQL database: ``python -m bench.replicas``.

* **tunnel**: a one-tool read-only plan (``read_file``), runtime client → ``kyronix serve``
  ``/ws`` → an executer that answers at once (``echo``, bench/tunnel.py's) → back, one request
  at a time, p50 and p99 over ``-n`` trips of each kind (default 1,000), three kinds alternated
  trip by trip so noise hits all alike:

  - **cross**: the client on replica B, the executer on replica A (B finds the executer in
    ``kx_presence``; the request goes to A as a ``kx_mailbox`` row + ``NOTIFY``, and the result
    comes back to B the same way);
  - **same**: the client and the executer both on replica A (no database on the way);
  - **floor**: the same two hops done with psycopg directly on the same database: connection 1
    INSERTs a row (the request's mailbox body) and NOTIFYs its id in one commit; a second
    connection LISTENing receives it, another SELECTs the row, INSERTs a result row and NOTIFYs
    its id in one commit; connection 1's listener receives it and connection 1 SELECTs the
    result (dedicated LISTEN connections, a scratch table of its own);

  goal: cross p50 <= same p50 + 3x the floor's p50;
* **runs/s with credits**: ``--clients`` (default 20) concurrent clients doing
  ``POST /api/agents/coding`` (scripted model, no delay: the key, the credit hold, a new kiso
  session, the KML, the settle) against one ``kyronix serve`` on PostgreSQL, one on SQLite, and
  the two replicas with the clients split between them (fresh homes and databases each), the
  three alternated ``--repeat`` times (median runs/s each); reported, with the PG/SQLite ratio.

Every process is started here and only those pids are signalled; the PostgreSQL cluster is
tests/pg.py's (``KYRONIX_TEST_PG_URL`` names a server to use instead). ``--quick`` runs small
sizes (a smoke test). Figures depend on the machine: compare ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
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
import psycopg
from websockets.sync.client import ClientConnection, connect

from bench.tunnel import PLAN, Echo

FLOORS = 3.0
"""Goal: cross-replica p50 <= same-replica p50 + this many times the floor's p50."""

SERVER_JSON = {"initialCredits": 100000, "rateLimit": {"burst": 100000, "perMinute": 1000000}}
BODY = {"input": "Create a React component called Button in src/components/Button.tsx"}
TABLE = "bench_replicas_floor"
_UNSET = (
    "KYRONIX_DATABASE_URL",
    "KYRONIX_MODEL",
    "KYRONIX_RATE_LIMIT",
    "KYRONIX_RATE_BURST",
    "KYRONIX_SCRIPTED_DELAY_MS",
    "KYRONIX_API_KEY",
)


def _env(home: Path, db: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env["KYRONIX_HOME"] = str(home)
    if db is not None:
        env["KYRONIX_DATABASE_URL"] = db
    return env


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "from kyronix.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kyronix {' '.join(args)} failed: {done.stderr}")
    return done.stdout.strip()


def _bootstrap(home: Path, db: str | None) -> str:
    """A home with the bench's server.json, a project and its key, made with the CLI."""
    home.mkdir(mode=0o700)
    (home / "server.json").write_text(json.dumps(SERVER_JSON))
    env = _env(home, db)
    _cli(env, "projects", "create", "bench")
    return _cli(env, "keys", "create", "--project", "bench")


class Serve:
    """``kyronix serve --port 0`` in a child process (stderr read for its URL, and kept)."""

    def __init__(self, home: Path, db: str | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from kyronix.cli import main; main()", "serve", "--port", "0"],
            env=_env(home, db),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.url = ""
        self._signalled = False
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "serving on " in line and not self.url:
                self.url = line.split("serving on ", 1)[1].split()[0]
                self._ready.set()
        self._ready.set()

    def wait_ready(self) -> None:
        if not self._ready.wait(60) or not self.url:
            raise RuntimeError("kyronix serve did not start:\n" + "".join(self.lines))

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://") + "/ws"

    def terminate(self) -> None:
        """SIGTERM, once, to our own child by its pid (a second one would cut its drain)."""
        if not self._signalled and self.proc.poll() is None:
            self._signalled = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._reader.join(5)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _open(url: str, key: str, role: str = "runtime") -> ClientConnection:
    query = "?role=executer" if role == "executer" else ""
    ws = connect(
        url + query, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=10
    ).__enter__()
    ready = json.loads(ws.recv(30))
    assert ready["type"] == "ready", ready
    return ws


def _trip(ws: ClientConnection, i: int) -> float:
    frame = {"type": "kml_request", "executionId": f"req_{i}", "kmlResponse": PLAN.format(i=i)}
    t = time.perf_counter()
    ws.send(json.dumps(frame))
    while True:
        got = json.loads(ws.recv(60))
        if got.get("type") == "kml_result" and got.get("executionId") == frame["executionId"]:
            return time.perf_counter() - t
        if got.get("type") == "error":
            raise RuntimeError(f"the tunnel answered an error: {got}")


class Floor:
    """Two mailbox hops with psycopg alone: a row + NOTIFY there, a row + NOTIFY back."""

    def __init__(self, conninfo: str) -> None:
        self.conns: list[psycopg.Connection[Any]] = []
        self.w1 = self._connect(conninfo)  # the runtime side's writes and reads
        self.l1 = self._connect(conninfo)  # its LISTEN connection
        self.w2 = self._connect(conninfo)  # the executer side's
        self.l2 = self._connect(conninfo)
        self.w1.execute(f"CREATE TABLE {TABLE} (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)")
        self.l1.execute("LISTEN bench_result")
        self.l2.execute("LISTEN bench_request")
        self._answerer = threading.Thread(target=self._answer, daemon=True)
        self._answerer.start()

    def _connect(self, conninfo: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(conninfo, autocommit=True)
        self.conns.append(conn)
        return conn

    def _post(self, conn: psycopg.Connection[Any], channel: str, body: str) -> None:
        with conn.transaction():  # the row and its notification: one commit
            cur = conn.execute(f"INSERT INTO {TABLE} (body) VALUES (%s) RETURNING id", (body,))
            (row_id,) = cur.fetchone() or (None,)
            conn.execute("SELECT pg_notify(%s, %s)", (channel, str(row_id)))

    def _fetch(self, conn: psycopg.Connection[Any], row_id: str) -> dict[str, Any]:
        cur = conn.execute(f"SELECT body FROM {TABLE} WHERE id = %s", (int(row_id),))
        (body,) = cur.fetchone() or ("{}",)
        return dict(json.loads(body))

    def _answer(self) -> None:
        for note in self.l2.notifies():
            if note.payload == "stop":
                return
            body = self._fetch(self.w2, note.payload)
            eid = body["kml"].split('executionId="', 1)[1].split('"', 1)[0]
            frame = {
                "type": "kml_result",
                "executionId": body["requestId"],
                "results": [
                    {
                        "tool": "read_file",
                        "args": {"path": "package.json"},
                        "result": {"success": True, "output": "{}", "executionId": eid},
                    }
                ],
            }
            out = {
                "project": body["project"],
                "requestId": body["requestId"],
                "via": "a",
                "frame": frame,
            }
            self._post(self.w2, "bench_result", json.dumps(out, separators=(",", ":")))

    def trip(self, i: int) -> float:
        body = {
            "project": "proj_bench",
            "requestId": f"req_{i}",
            "kml": PLAN.format(i=i),
            "executerId": "default",
            "timeout": 60.0,
            "origin": "b",
        }
        t = time.perf_counter()
        self._post(self.w1, "bench_request", json.dumps(body, separators=(",", ":")))
        note = next(self.l1.notifies(timeout=60, stop_after=1))
        got = self._fetch(self.w1, note.payload)
        elapsed = time.perf_counter() - t
        assert got["frame"]["executionId"] == body["requestId"], got
        return elapsed

    def close(self) -> None:
        try:
            if self._answerer.is_alive():
                self.w1.execute("SELECT pg_notify('bench_request', 'stop')")
                self._answerer.join(10)
            self.w1.execute(f"DROP TABLE IF EXISTS {TABLE}")
        finally:
            for conn in self.conns:
                conn.close()


def _storm(urls: list[str], key: str, runs: int, clients: int) -> float:
    """Runs per second of ``clients`` threads (one keep-alive client each, spread over
    ``urls``) doing ``runs`` runs in all."""
    per = max(1, runs // clients)
    pool = [
        httpx2.Client(
            base_url=urls[c % len(urls)], timeout=120, headers={"Authorization": f"Bearer {key}"}
        )
        for c in range(clients)
    ]
    try:

        def one(client: httpx2.Client) -> None:
            for _ in range(per):
                client.post("/api/agents/coding", json=BODY).raise_for_status()

        began = time.perf_counter()
        with ThreadPoolExecutor(clients) as threads:
            list(threads.map(one, pool))
        return per * clients / (time.perf_counter() - began)
    finally:
        for client in pool:
            client.close()


def _plain(url: Any) -> str:
    return str(url.set(drivername="postgresql").render_as_string(hide_password=False))


def run(n: int = 1000, runs: int = 200, clients: int = 20, repeat: int = 3) -> dict[str, float]:
    from tests.pg import start_cluster

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        cluster = start_cluster()
        databases: list[Any] = []
        servers: list[Serve] = []
        opened: list[ClientConnection] = []
        floor: Floor | None = None
        try:
            for _ in range(2):
                databases.append(cluster.create_database())
            rep_db, one_db = (_plain(u) for u in databases)
            homes = {
                "rep": (Path(tmp) / "replicas", rep_db),
                "pg": (Path(tmp) / "pg", one_db),
                "sqlite": (Path(tmp) / "sqlite", None),
            }
            with ThreadPoolExecutor(len(homes)) as boot:
                made = boot.map(lambda h: _bootstrap(*h), homes.values())
                keys = dict(zip(homes, made, strict=True))
            for home in ("rep", "rep", "pg", "sqlite"):  # A and B: one home, one secret.key
                servers.append(Serve(*homes[home]))
            a, b, one_pg, one_sqlite = servers
            for server in servers:
                server.wait_ready()
            with psycopg.connect(rep_db, autocommit=True) as conn:
                row = conn.execute("SHOW server_version").fetchone()
                version = str(row[0]).split()[0] if row else "?"

            # ---- the tunnel: cross-replica, same-replica, the floor
            key = keys["rep"]
            ex = _open(a.ws, key, "executer")
            opened.append(ex)
            Echo(ex).start()
            on_a, on_b = _open(a.ws, key), _open(b.ws, key)
            opened += [on_a, on_b]
            floor = Floor(rep_db)
            ids = iter(range(1, 10**9))  # every envelope and tool id new: no kept result
            deadline = time.monotonic() + 60
            while True:  # B may not see the executer on A yet
                try:
                    _trip(on_b, next(ids))
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            for _ in range(min(200, max(20, n // 5))):  # warm up all three
                floor.trip(next(ids))
                _trip(on_a, next(ids))
                _trip(on_b, next(ids))
            cross: list[float] = []
            same: list[float] = []
            bare: list[float] = []
            for _ in range(n):
                bare.append(floor.trip(next(ids)))
                same.append(_trip(on_a, next(ids)))
                cross.append(_trip(on_b, next(ids)))
            for ws in opened:
                ws.close()
            opened.clear()
            floor.close()
            floor = None

            # ---- runs/s with credits
            targets = {
                "sqlite": ([one_sqlite.url], keys["sqlite"]),
                "pg": ([one_pg.url], keys["pg"]),
                "pg x2": ([a.url, b.url], keys["rep"]),
            }
            for urls, k in targets.values():  # warm up each
                _storm(urls, k, clients * 2, clients)
            rps: dict[str, list[float]] = {name: [] for name in targets}
            for _ in range(repeat):
                for name, (urls, k) in targets.items():
                    rps[name].append(_storm(urls, k, runs, clients))
        finally:
            try:
                for ws in opened:
                    ws.close()
                if floor is not None:
                    floor.close()
            finally:
                for server in servers:
                    server.terminate()  # all at once, then wait for each
                for server in servers:
                    server.stop()
                try:
                    for url in databases:
                        cluster.drop_database(url)
                finally:
                    cluster.close()

    figures: dict[str, float] = {}
    print(
        f"replicas  tunnel round trip of a one-tool read_file plan, echo executer, {n} trips of "
        f"each kind alternated, PostgreSQL {version}"
    )
    print("     kind   p50 ms   p99 ms")
    for name, values in (("cross", cross), ("same", same), ("floor", bare)):
        p50, p99 = statistics.median(values) * 1000, _percentile(values, 0.99) * 1000
        figures[f"{name}_p50_ms"], figures[f"{name}_p99_ms"] = p50, p99
        print(f"{name:>9}  {p50:7.2f}  {p99:7.2f}")
    c50, s50, f50 = figures["cross_p50_ms"], figures["same_p50_ms"], figures["floor_p50_ms"]
    budget = s50 + FLOORS * f50
    print(
        "cross: client on replica B, executer on replica A (a kx_mailbox row + NOTIFY each way); "
        "same: both on A; floor: a row + NOTIFY there and back with psycopg alone"
    )
    print(
        f"replicas  cross/same ratio p50 {c50 / s50:.2f}x, p99 "
        f"{figures['cross_p99_ms'] / figures['same_p99_ms']:.2f}x; cross/floor p50 "
        f"{c50 / f50:.2f}x, p99 {figures['cross_p99_ms'] / figures['floor_p99_ms']:.2f}x "
        f"(goal cross p50 <= same p50 + {FLOORS:g}x floor p50 = {budget:.2f} ms: "
        + ("ok" if c50 <= budget else "OVER TARGET")
        + ")"
    )
    per = max(1, runs // clients)
    print(
        f"replicas  runs/s with credits, {clients} concurrent clients, POST /api/agents/coding "
        f"(scripted model), median of {repeat} alternated runs of {per * clients} each"
    )
    print("   target   runs/s")
    for name, values in rps.items():
        figures[f"{name.replace(' x2', '2')}_rps"] = statistics.median(values)
        print(f"{name:>9}  {statistics.median(values):7.0f}")
    pg, sq, pg2 = figures["pg_rps"], figures["sqlite_rps"], figures["pg2_rps"]
    figures["pg_sqlite_ratio"] = pg / sq
    print(
        f"replicas  PG/SQLite ratio {pg / sq:.2f}x (one replica each); two PG replicas / one "
        f"{pg2 / pg:.2f}x, / SQLite {pg2 / sq:.2f}x (report)"
    )
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-n", type=int, default=1000, help="round trips of each kind (default 1000)")
    p.add_argument("--runs", type=int, default=200, help="runs per throughput measurement")
    p.add_argument("--clients", type=int, default=20, help="concurrent clients (default 20)")
    p.add_argument("--repeat", type=int, default=3, help="alternated throughput measurements")
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    a = p.parse_args()
    if a.quick:
        run(30, 40, 4, 1)
    else:
        run(a.n, a.runs, a.clients, a.repeat)


if __name__ == "__main__":
    main()
