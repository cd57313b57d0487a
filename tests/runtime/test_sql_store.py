"""The runtime on the SQL store, end to end: tool rounds, then SIGKILL, then resume elsewhere.

An ``Agent(store=SqlSessionStore(...))`` with the scripted model does rounds with a side effect
(counted in a file) and a read-only tool. A real process is killed by SIGKILL right after a batch
is committed (``KISO_FAILPOINT``) or in the middle of a batch's transaction (its rows inserted,
not committed), and a new process resumes the session from the database: the run completes, each
side effect happened exactly once, and no execution that had a receipt ran again. The crash
tests run on SQLite and on a real PostgreSQL (tests/pg.py).
"""

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

from kiso.kernel import ExecutionStarted, RunEnded, SessionInfo, SessionLog
from kiso.kernel.sql import SqlSessionStore, create_schema
from kiso.providers import FauxAdapter
from kiso.runtime import Agent

from .helpers import assert_runs_end_once, note_tool, types

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = {
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
RECORDS = {  # what the run above writes when nothing goes wrong (default mode, approved)
    "run_started": 1,
    "user": 1,
    "assistant": 3,
    "approval_requested": 2,
    "approval_decided": 3,
    "execution_started": 3,
    "execution_finished": 3,
    "run_ended": 1,
}

DRIVER = """
import json, os, signal, sys
from pathlib import Path
from kiso.kernel.sql import SqlSessionStore, SqlWriter
from kiso.runtime import Agent
from kiso.tools.base import define_tool

url, workspace, session_id, command, *rest = sys.argv[1:]
inside = os.environ.get("KILL_INSIDE")
if inside:  # die inside the transaction of the first batch holding a record of that type
    def die(writer, batch):
        if any(e.type == inside for e in batch):
            os.kill(os.getpid(), signal.SIGKILL)
    SqlWriter._before_commit = die
effects = Path(workspace) / "effects.log"

def effect(args, ctx):
    with open(effects, "a", encoding="utf-8") as f:
        f.write(args["tag"] + "\\n")
    return "effect " + args["tag"]

def peek(args, ctx):
    return "peeked " + args["tag"]

obj = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
agent = Agent(
    tools=[define_tool("effect", "Record a side effect", obj, effect, effects="other"),
           define_tool("peek", "Look at something", obj, peek, effects="read")],
    store=SqlSessionStore(url), workspace=Path(workspace), mode="default", retry_base_delay=0.01)
with agent.session(session_id) as session:
    events = session.run_sync(rest[0]) if command == "run" else session.resume_sync()
    for ev in events:
        print(json.dumps({"type": ev.type}), flush=True)
        if ev.type == "approval_request":
            session.approve(ev.call_id)
        elif ev.type == "uncertain":
            done = effects.read_text().split() if effects.exists() else []
            for u in ev.executions:  # a human looks: did it happen?
                if not u.auto_rerun:
                    ruling = "applied" if u.input["tag"] in done else "rerun"
                    session.resolve(u.execution_id, ruling)
    print(json.dumps({"type": "exit", "state": session.state.value}), flush=True)
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path, Path]:
    """(database URL, workspace, faux script): SQLite, or a PostgreSQL database of its own."""
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url").render_as_string(hide_password=False)
    else:
        url = f"sqlite:///{tmp_path / 'server.db'}"
    store = SqlSessionStore(url)
    create_schema(store.engine)
    store.close()
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return url, ws, script


def driver(
    world: tuple[str, Path, Path], *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    url, ws, script = world
    full = {**os.environ, "KISO_FAUX_SCRIPT": str(script)}
    for name in ("KISO_FAILPOINT", "KILL_INSIDE"):
        full.pop(name, None)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", DRIVER, url, str(ws), "s", *args],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def load(url: str) -> SessionLog:
    """The session as a new process would read it (the store closed after)."""
    store = SqlSessionStore(url)
    try:
        return store.load("s")
    finally:
        store.close()


def listed(url: str, ws: Path) -> list[SessionInfo]:
    store = SqlSessionStore(url)
    try:
        return store.list(ws)
    finally:
        store.close()


def effects(ws: Path) -> list[str]:
    path = ws / "effects.log"
    return path.read_text().splitlines() if path.exists() else []


def test_an_agent_runs_tool_rounds_on_the_sql_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'server.db'}"
    store = SqlSessionStore(url)
    create_schema(store.engine)
    turns = [
        {"tool_calls": [{"name": "note", "input": {"line": "one"}}]},
        {"tool_calls": [{"name": "note", "input": {"line": "two"}}]},
        {"text": "done"},
    ]
    notes = tmp_path / "notes.txt"
    agent = Agent(
        adapter=FauxAdapter(turns),
        tools=[note_tool(notes)],
        store=store,
        workspace=tmp_path,
        mode="bypass",
    )
    with agent.session("s") as session:
        seen = [ev.type for ev in session.run_sync("write two notes")]
        assert seen[-1] == "terminal"
        assert session.state.value == "completed"
        written = list(session.events)
    assert notes.read_text() == "one\ntwo\n"
    log = store.load("s")
    assert list(log.events) == written  # what the session saw is what the database holds
    assert types(log.events).count("execution_finished") == 2
    assert_runs_end_once(log.events)
    (row,) = store.list(tmp_path)
    assert (row.id, row.state.value, row.title) == ("s", "completed", "write two notes")
    # a new agent, as another process would build it, finds nothing left to do
    again = Agent(
        adapter=FauxAdapter([{"text": "unused"}]),
        tools=[note_tool(notes)],
        store=SqlSessionStore(url),
        workspace=tmp_path,
    )
    with again.session("s") as session:
        assert session.state.value == "completed"
        assert list(session.resume_sync()) == []
    assert notes.read_text() == "one\ntwo\n"
    store.close()
    again.store.close()  # type: ignore[attr-defined]


def test_the_run_without_a_crash_writes_exactly_these_records(
    world: tuple[str, Path, Path],
) -> None:
    out = driver(world, "run", "go")
    assert out.returncode == 0, out.stderr
    log = load(world[0])
    assert Counter(e.type for e in log.events) == RECORDS
    assert effects(world[1]) == ["a", "b"]


CRASHES = [
    *({"KISO_FAILPOINT": point} for point in (
        "assistant:1", "approval_decided:1", "execution_started:1", "execution_finished:1",
        "execution_started:2", "approval_requested:2", "assistant:3",
    )),
    *({"KILL_INSIDE": kind} for kind in ("execution_started", "execution_finished", "run_ended")),
]  # fmt: skip


@pytest.mark.parametrize("crash", CRASHES, ids=["=".join(*c.items()) for c in CRASHES])
def test_a_sigkill_mid_run_resumes_in_a_new_process_without_repeating_effects(
    world: tuple[str, Path, Path], crash: dict[str, str]
) -> None:
    url, ws, _ = world
    crashed = driver(world, "run", "go", env=crash)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    before = load(url)  # the committed prefix always loads
    kind = next(iter(crash.values())).split(":")[0]
    count = [e.type for e in before.events].count(kind)
    if "KILL_INSIDE" in crash:
        assert count == 0  # the batch holding the first such record was rolled back whole
    else:
        assert count == int(crash["KISO_FAILPOINT"].split(":")[1])  # committed, nothing after
    resumed = driver(world, "resume")
    assert resumed.returncode == 0, resumed.stderr
    final = load(url)
    assert [e.seq for e in final.events] == list(range(1, len(final.events) + 1))
    assert final.events[: len(before.events)] == before.events  # the prefix is kept as it was
    ends = [e for e in final.events if isinstance(e, RunEnded)]
    assert len(ends) == 1 and ends[0].outcome.kind == "completed"
    assert sorted(effects(ws)) == ["a", "b"]  # each side effect exactly once
    finished = {e.call_id for e in before.events if e.type == "execution_finished"}  # type: ignore[union-attr]
    starts = Counter(e.call_id for e in final.events if isinstance(e, ExecutionStarted))
    assert all(starts[call] == 1 for call in finished)  # nothing confirmed ran again
    (row,) = listed(url, ws)
    assert row.state.value == "completed"


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_a_kill_inside_the_receipts_transaction_asks_about_the_effect(
    world: tuple[str, Path, Path],
) -> None:
    """The effect ran, its receipt's transaction never committed: resume cannot know, so it
    asks (the driver answers as a person who checked: applied), and does not run it again."""
    url, ws, _ = world
    assert driver(world, "run", "go", env={"KILL_INSIDE": "execution_finished"}).returncode == (
        -signal.SIGKILL
    )
    assert effects(ws) == ["a"]
    out = driver(world, "resume")
    assert out.returncode == 0, out.stderr
    assert "uncertain" in [e["type"] for e in lines(out.stdout)]
    final = load(url)
    rulings = [e for e in final.events if e.type == "execution_resolved"]
    assert [(r.resolution, r.decided_by) for r in rulings] == [("applied", "user")]  # type: ignore[attr-defined]
    assert effects(ws) == ["a", "b"]
