"""examples/hello_agent.py runs with no key, as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kiso.kernel import JsonlSessionStore

ROOT = Path(__file__).resolve().parents[2]


def test_hello_agent_runs_offline_and_leaves_a_durable_session(tmp_path: Path) -> None:
    env = {**os.environ, "KISO_HOME": str(tmp_path / "home")}
    env.pop("KISO_FAUX_SCRIPT", None)
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hello_agent.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "[add -> 5]" in out.stdout
    assert "2 + 3 = 5." in out.stdout
    assert out.stdout.strip().endswith("completed")
    log = JsonlSessionStore(tmp_path / "home").load("demo")
    assert [e.type for e in log.events][-1] == "run_ended"
    assert log.header.workspace == os.path.realpath(tmp_path)
