"""Crash-proof end to end: real processes, real SIGKILL, then resume in a fresh process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import ExecutionResolved, JsonlSessionStore, RunEnded, plan
from kiso.kernel.recovery import ResolveUncertain

DRIVER = Path(__file__).with_name("driver.py")

FAILPOINT_SCRIPT = {
    "turns": [
        {
            "text": "Two things.",
            "tool_calls": [
                {"name": "effect", "input": {"tag": "a"}},
                {"name": "peek", "input": {"tag": "p"}},
            ],
        },
        {"tool_calls": [{"name": "effect", "input": {"tag": "b"}}]},
        {"text": "Done."},
    ]
}
# How many records of each type the full run above writes (default mode, approvals answered).
RECORDS = {
    "run_started": 1,
    "user": 1,
    "assistant": 3,
    "approval_requested": 2,
    "approval_decided": 3,
    "execution_started": 3,
    "execution_finished": 3,
    "run_ended": 1,
}


def driver(
    home: Path, ws: Path, script: Path, *args: str, failpoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KISO_FAUX_SCRIPT": str(script)}
    env.pop("KISO_FAILPOINT", None)
    if failpoint:
        env["KISO_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, str(DRIVER), str(home), str(ws), "s", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(FAILPOINT_SCRIPT))
    return home, ws, script


def test_the_run_without_a_crash_writes_exactly_these_records(
    setup: tuple[Path, Path, Path],
) -> None:
    home, ws, script = setup
    out = driver(home, ws, script, "run", "go")
    assert out.returncode == 0, out.stderr
    log = JsonlSessionStore(home).load("s")
    assert Counter(e.type for e in log.events) == RECORDS
    assert (ws / "effects.log").read_text() == "a\nb\n"


CASES = [(kind, n) for kind, count in RECORDS.items() for n in range(1, count + 1)]


@pytest.mark.parametrize(("kind", "n"), CASES, ids=[f"{k}:{n}" for k, n in CASES])
def test_a_crash_after_any_record_resumes_to_completion_without_repeating_effects(
    setup: tuple[Path, Path, Path], kind: str, n: int
) -> None:
    home, ws, script = setup
    crashed = driver(home, ws, script, "run", "go", failpoint=f"{kind}:{n}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    log = JsonlSessionStore(home).load("s")  # the log always loads
    # the process died right after the batch holding that record was durable: nothing later
    assert [e.type for e in log.events].count(kind) == n
    resumed = driver(home, ws, script, "resume", "rerun")
    assert resumed.returncode == 0, resumed.stderr
    final = JsonlSessionStore(home).load("s")
    ends = [e for e in final.events if isinstance(e, RunEnded)]
    assert len(ends) == 1 and ends[0].outcome.kind == "completed"
    effects = (ws / "effects.log").read_text().splitlines() if (ws / "effects.log").exists() else []
    assert sorted(effects) == ["a", "b"], effects  # each side effect exactly once
    # a confirmed execution (one with a receipt) never ran again
    started = Counter(
        e.call_id  # type: ignore[union-attr]
        for e in final.events
        if e.type == "execution_started"
    )
    finished_before = {
        e.call_id  # type: ignore[union-attr]
        for e in log.events
        if e.type == "execution_finished"
    }
    assert all(started[c] == 1 for c in finished_before)
    # an uncertain read was re-run by policy; an uncertain effect by the human's ruling
    for ruling in (e for e in final.events if isinstance(e, ExecutionResolved)):
        expected = "policy:idempotent" if ruling.call_id == "call_0_1" else "user"
        assert ruling.decided_by == expected


def test_a_crash_right_after_a_ruling_keeps_the_ruling(setup: tuple[Path, Path, Path]) -> None:
    home, ws, script = setup
    assert driver(home, ws, script, "run", "go", failpoint="execution_started:1").returncode == (
        -signal.SIGKILL
    )
    action = plan(JsonlSessionStore(home).load("s").events, rerunnable={"peek"})
    assert isinstance(action, ResolveUncertain)
    assert [u.name for u in action.executions] == ["effect"]
    crashed = driver(home, ws, script, "resume", "rerun", failpoint="execution_resolved:1")
    assert crashed.returncode == -signal.SIGKILL
    log = JsonlSessionStore(home).load("s")
    assert log.events[-1].type == "execution_resolved"
    out = driver(home, ws, script, "resume")  # no ruling needed: it is on disk
    assert out.returncode == 0, out.stderr
    assert "uncertain" not in [e["type"] for e in lines(out.stdout)]
    assert (ws / "effects.log").read_text().splitlines() == ["a", "b"]


def test_an_unruled_uncertain_execution_pauses_the_resume(setup: tuple[Path, Path, Path]) -> None:
    home, ws, script = setup
    driver(home, ws, script, "run", "go", failpoint="execution_started:1")
    out = driver(home, ws, script, "resume")  # nobody rules
    events = lines(out.stdout)
    assert [e["type"] for e in events][-3:] == ["uncertain", "paused", "exit"]
    assert events[-1]["state"] == "uncertain"
    assert not (ws / "effects.log").exists()
    # the next resume asks again; this time a human rules "skipped", and the run goes on
    assert driver(home, ws, script, "resume", "skipped").returncode == 0
    assert (ws / "effects.log").read_text().splitlines() == ["b"]  # a was skipped, b ran
