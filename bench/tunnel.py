"""The tunnel's round trip against a bare WebSocket relay: ``python -m bench.tunnel``.

* **ours**: a one-tool read-only plan (``read_file``), runtime client → ``kyronix serve`` (``/ws``:
  auth, frame validation, the pending table, the results kept) → an executer → back, one request
  at a time on one connection each side; p50 and p99 over ``-n`` trips (default 5,000);
* **bare**: the same frames through a bare relay on the same stack (Starlette WebSocket routes
  under uvicorn, in its own process: the second connection's frames go to the first, and back),
  with the same answering executer, alternated with ours so noise hits both;
* the executer answers either with a canned result (``echo``: the relay alone) or, with
  ``--real``, is the real ``kyronix executer`` daemon (parse, sandbox, permission, the read, a
  receipt), whose own time for the tool is measured alone in the same run.

Goal: ours <= 2x the bare relay at p99, plus the executer's own time for the tool. Figures
depend on the machine: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from websockets.sync.client import ClientConnection, connect

GOAL = 2.0
UNTHROTTLED = {
    "framesPerSecond": 1e6, "frameBurst": 10**6, "framesPerSecondPerProject": 1e6,
    "frameBurstPerProject": 10**6,
}  # fmt: skip

BARE = """
import sys, asyncio
import uvicorn
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute

peers = {}

async def relay(ws):
    await ws.accept()
    role = ws.query_params.get("role", "runtime")
    peers[role] = ws
    other = "runtime" if role == "executer" else "executer"
    try:
        while True:
            text = await ws.receive_text()
            await peers[other].send_text(text)
    except Exception:
        pass

app = Starlette(routes=[WebSocketRoute("/ws", relay)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""

PLAN = '<tool name="read_file" executionId="exec_{i:032x}"><path>package.json</path></tool>'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _dial(url: str, headers: dict[str, str] | None = None) -> ClientConnection:
    deadline = time.monotonic() + 60
    while True:
        try:
            return connect(url, additional_headers=headers or {}, open_timeout=10).__enter__()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Echo(threading.Thread):
    """An executer that answers every request at once with a canned successful entry."""

    def __init__(self, ws: ClientConnection) -> None:
        super().__init__(daemon=True)
        self.ws = ws

    def run(self) -> None:
        try:
            while True:
                frame = json.loads(self.ws.recv())
                if frame.get("type") != "kml_request":
                    continue
                eid = frame["kmlResponse"].split('executionId="', 1)[1].split('"', 1)[0]
                self.ws.send(
                    json.dumps(
                        {
                            "type": "kml_result",
                            "executionId": frame["executionId"],
                            "results": [
                                {
                                    "tool": "read_file",
                                    "args": {"path": "package.json"},
                                    "result": {"success": True, "output": "{}", "executionId": eid},
                                }
                            ],
                        }
                    )
                )
        except Exception:
            return


def _trip(ws: ClientConnection, i: int, tag: str) -> float:
    frame = {"type": "kml_request", "executionId": f"{tag}_{i}", "kmlResponse": PLAN.format(i=i)}
    t = time.perf_counter()
    ws.send(json.dumps(frame))
    while True:
        got = json.loads(ws.recv(60))
        if got.get("type") == "kml_result" and got.get("executionId") == frame["executionId"]:
            return time.perf_counter() - t
        if got.get("type") == "error":
            raise RuntimeError(f"the tunnel answered an error: {got}")


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
        project = db.write(lambda c: accounts.create_project(c, "bench", 1000))
        key, _ = db.write(lambda c: accounts.create_key(c, secret, project.id))
    finally:
        db.close()
    return key


def _executer_time(base: Path, n: int) -> float:
    """Median ms of the real executer running the one-tool plan alone (receipts included)."""
    from kyronix.executer import KyronixExecuter

    ex = KyronixExecuter(receipts=base.parent / "alone.sqlite3")
    times = []
    try:
        for i in range(n):
            t = time.perf_counter()
            ex.execute_sync(PLAN.format(i=10**9 + i), base)
            times.append(time.perf_counter() - t)
    finally:
        ex.close()
    return statistics.median(times) * 1000


def run(n: int = 5000, real: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        home = Path(tmp) / "home"
        key = _bootstrap(home)
        base = Path(tmp) / "project"
        base.mkdir()
        (base / "package.json").write_text('{"name": "bench"}\n')
        env = {**os.environ, "KYRONIX_HOME": str(home), "KYRONIX_API_KEY": key}
        # round trips back to back on one connection go faster than the default frame rate
        # (tunnel.framesPerSecond): the limits are checked on every frame, at a rate they allow
        (home / "server.json").write_text(json.dumps({"tunnel": UNTHROTTLED}))
        port, bare_port = _free_port(), _free_port()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from kyronix.cli import main; main()",
                    "serve",
                    "--port",
                    str(port),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            subprocess.Popen(
                [sys.executable, "-c", BARE, str(bare_port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
        ]
        opened: list[ClientConnection] = []
        try:
            ours_url = f"ws://127.0.0.1:{port}/ws"
            bare_url = f"ws://127.0.0.1:{bare_port}/ws"
            hdr = {"Authorization": f"Bearer {key}"}
            bare_ex = _dial(bare_url + "?role=executer")
            opened.append(bare_ex)
            Echo(bare_ex).start()
            if real:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            "from kyronix.cli import main; main()",
                            "executer",
                            "--ws",
                            ours_url,
                            "--base",
                            str(base),
                            "--receipts",
                            str(Path(tmp) / "receipts.sqlite3"),
                        ],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            else:
                ex = _dial(ours_url + "?role=executer", hdr)
                opened.append(ex)
                assert json.loads(ex.recv(30))["type"] == "ready"
                Echo(ex).start()
            rt = _dial(ours_url, hdr)
            opened.append(rt)
            assert json.loads(rt.recv(30))["type"] == "ready"
            bare_rt = _dial(bare_url + "?role=runtime")
            opened.append(bare_rt)
            deadline = time.monotonic() + 60
            while True:  # the executer (the daemon, with --real) may still be connecting
                try:
                    _trip(rt, 0, "warm")
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            for i in range(1, 200):
                _trip(rt, i, "warm")
                _trip(bare_rt, i, "warm")
            ours: list[float] = []
            bare: list[float] = []
            for i in range(n):
                bare.append(_trip(bare_rt, i, "bare"))
                ours.append(_trip(rt, i, "ours"))
        finally:
            for ws in opened:
                ws.close()
            for proc in procs:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        tool_ms = _executer_time(base, min(n, 500)) if real else 0.0
    p50, p99 = statistics.median(ours) * 1000, _percentile(ours, 0.99) * 1000
    b50, b99 = statistics.median(bare) * 1000, _percentile(bare, 0.99) * 1000
    budget = GOAL * b99 + tool_ms
    kind = "real executer" if real else "echo executer"
    print(
        f"tunnel {kind}: {n} trips of a one-tool read_file plan: ours p50 {p50:.2f} ms, p99 "
        f"{p99:.2f} ms; bare relay p50 {b50:.2f} ms, p99 {b99:.2f} ms; ratio p50 {p50 / b50:.2f}x, "
        f"p99 {p99 / b99:.2f}x"
        + (f"; the executer's own time for the tool {tool_ms:.2f} ms" if real else "")
        + f" (goal p99 <= {GOAL:g}x bare + tool = {budget:.2f} ms: "
        + ("ok" if p99 <= budget else "OVER TARGET")
        + "; the document promises < 10 ms)"
    )
    return {
        "p50_ms": p50,
        "p99_ms": p99,
        "bare_p50_ms": b50,
        "bare_p99_ms": b99,
        "tool_ms": tool_ms,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-n", type=int, default=5000, help="round trips (default 5000)")
    p.add_argument("--real", action="store_true", help="the real `kyronix executer` daemon")
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    a = p.parse_args()
    run(200 if a.quick else a.n, real=a.real)


if __name__ == "__main__":
    main()
