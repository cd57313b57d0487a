"""The OS sandbox's cost on a shell call: `python -m bench.sandbox [-n 200]`.

ours: ``run_command("true")`` in the ``workspace-write`` sandbox (the supervisor, then ``bwrap``
with its mounts, then the shell). Baseline: the same call without the sandbox. Peer: ``bwrap``
with the same arguments started directly by ``subprocess.run``, no supervisor (what the sandbox
costs on its own). Alternated, medians.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from bench.timing import compare
from kiso.tools.sandbox import Sandbox, SandboxPolicy, probe
from kiso.tools.shell import run_command


def run(n: int = 200) -> None:
    why = probe()
    if why is not None:
        print(f"sandbox   skipped: {why}")
        return
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        ws = Path(tmp)
        env = dict(os.environ)
        box = Sandbox.for_workspace(SandboxPolicy(), ws, environ=env)
        assert box is not None

        def sandboxed() -> None:
            run_command("true", cwd=ws, env=env, timeout_ms=60_000, sandbox=box)

        def bare() -> None:
            run_command("true", cwd=ws, env=env, timeout_ms=60_000)

        argv = box.wrap(["/bin/sh", "-c", "true"], ws)

        def peer() -> None:
            subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)

        ours, baseline = compare(sandboxed, bare, n)
        _, direct = compare(sandboxed, peer, max(n // 4, 5))
    extra = (ours - baseline) * 1000
    print(
        f"sandbox   shell call ({n}): in the sandbox {ours * 1000:6.1f} ms  without "
        f"{baseline * 1000:6.1f} ms  ratio {ours / baseline:4.2f}x  (+{extra:.1f} ms a call); "
        f"bwrap alone {direct * 1000:.1f} ms"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-n", type=int, default=200)
    run(p.parse_args().n)


if __name__ == "__main__":
    main()
