"""A real model on loopback: llama.cpp's server (the xllamacpp wheel) with SmolLM2-135M-Instruct.

It speaks OpenAI chat completions, the Responses API and Anthropic messages, with real streaming.
The model file comes from scripts/fetch-test-model (cached after the first run). The server runs
in a child process and stops when its stdin closes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SERVER = """
import sys
import xllamacpp as xlc
p = xlc.CommonParams()
p.model.path = sys.argv[1]
p.n_ctx = int(sys.argv[3])
p.cpuparams.n_threads = 2
p.cpuparams_batch.n_threads = 2
p.hostnames = ["127.0.0.1"]
p.port = int(sys.argv[2])
p.use_jinja = True
if sys.argv[4] != "-":  # greedy decoding: the same answer every run
    p.sampling.temp = 0.0
    p.sampling.seed = 1
    p.sampling.penalty_repeat = float(sys.argv[4])
server = xlc.Server(p)
print("READY", flush=True)
sys.stdin.read()
"""


def model_path() -> Path:
    out = subprocess.run(
        [str(ROOT / "scripts" / "fetch-test-model")],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def llama_server(n_ctx: int = 4096, *, repeat_penalty: float | None = None) -> Iterator[str]:
    """Yield the server's base URL (``http://127.0.0.1:<port>``) once it answers; ``n_ctx``: its
    context size in tokens; ``repeat_penalty``: decode greedily (temperature 0, a fixed seed)
    with that repetition penalty, so a test sees the same answer every run."""
    port = _free_port()
    sampling = "-" if repeat_penalty is None else str(repeat_penalty)
    with subprocess.Popen(
        [sys.executable, "-c", SERVER, str(model_path()), str(port), str(n_ctx), sampling],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/v1/models", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the llama.cpp server did not start")
                time.sleep(0.2)
            yield base
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
