"""scripts/demo-kill9.sh tells the kill -9 story twice, each time with a fresh KISO_HOME: only
kiso's process group is killed, and the command it was running dies with it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_kill9_demo_script_succeeds_twice_in_a_row() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KISO_FAILPOINT", "KISO_FAUX_SCRIPT")}
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "demo-kill9.sh")],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("kill -9 -") == 2  # one kill a round: kiso's group, nothing else
    crashed = "after the crash and the sleep: f1=NEW f3=OLD marker=no shell=gone"
    assert out.stdout.count(crashed) == 2
    assert out.stdout.count("after the resume: f1=NEW f3=NEW marker=no") == 2
    assert "both rounds" in out.stdout
