"""Benchmark 5: how fast ``kiso`` starts.

* ``kiso --help`` and ``kiso --version`` against ``python -c pass`` (the same interpreter), each
  the median of several cold process starts, alternated. Target: ``--help`` within 3x.
* ``kiso -p``: from the process start to the first byte of the model request arriving at a local
  OpenAI-compatible server (the SDK import, config, session creation and the request itself).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent / "kiso"
TARGET = 3.0


def _time(argv: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def first_request_ms(repeats: int) -> float:
    arrivals: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            arrivals.append(time.perf_counter())
            self.rfile.read(int(self.headers.get("content-length", "0")))
            body = (
                b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
                b'"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
                b"data: [DONE]\n\n"
            )
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    samples = []
    try:
        with tempfile.TemporaryDirectory() as home:
            env = {
                **os.environ,
                "KISO_HOME": home,
                "OPENAI_API_KEY": "sk-bench",
                "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_port}/v1",
            }
            env.pop("KISO_FAUX_SCRIPT", None)
            for _ in range(repeats):
                began = time.perf_counter()
                subprocess.run(
                    [str(BIN), "-p", "hi"],
                    env=env,
                    cwd=home,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                    check=True,
                )
                samples.append((arrivals[-1] - began) * 1000)
    finally:
        server.shutdown()
        server.server_close()
    return statistics.median(samples)


def run(repeats: int) -> dict[str, float]:
    env = {**os.environ}
    bare, helps, versions = [], [], []
    for _ in range(repeats):
        bare.append(_time([sys.executable, "-c", "pass"], env))
        helps.append(_time([str(BIN), "--help"], env))
        versions.append(_time([str(BIN), "--version"], env))
    t_bare, t_help, t_version = (statistics.median(x) for x in (bare, helps, versions))
    ratio = t_help / t_bare
    first = first_request_ms(max(3, repeats // 3))
    print(
        f"startup  python -c pass {t_bare * 1000:5.0f} ms · kiso --help {t_help * 1000:5.0f} ms "
        f"({ratio:4.2f}x; target <= {TARGET}x: {'ok' if ratio <= TARGET else 'OVER TARGET'}) · "
        f"kiso --version {t_version * 1000:5.0f} ms ({t_version / t_bare:4.2f}x) · "
        f"kiso -p start to first model request {first:5.0f} ms"
    )
    return {
        "bare_ms": t_bare * 1000,
        "help_ms": t_help * 1000,
        "version_ms": t_version * 1000,
        "ratio": ratio,
        "first_request_ms": first,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=15)
    run(p.parse_args(argv).repeats)


if __name__ == "__main__":
    main()
