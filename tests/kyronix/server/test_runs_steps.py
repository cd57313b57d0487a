"""Each step of a run on its own (the modules of ``kyronix.server.runs``), on a real SQLite
database and the kernel's SQL session store: no application, no HTTP, no model call.

Admission, settlement (and its fence), recovery (takeover and the hold sweep), recording an
executer's results, and the one typed outcome the answer and the log record are built from.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import SettingChanged
from kiso.kernel.sql import SqlSessionStore
from kyronix.server import accounts, billing, sessions
from kyronix.server.agents import execution_id
from kyronix.server.config import ServerConfig, ensure_home
from kyronix.server.db import Database
from kyronix.server.errors import ApiError
from kyronix.server.migrations import migrate
from kyronix.server.models import choose_model
from kyronix.server.relay import Relay
from kyronix.server.runs import records
from kyronix.server.runs.admit import RunningElsewhere
from kyronix.server.runs.handle import RunRequest
from kyronix.server.runs.outcome import Outcome, charge
from kyronix.server.runs.pool import SessionPool
from kyronix.server.runs.results import ResultsRecorder
from kyronix.server.runs.service import Runs
from kyronix.server.runs.settle import RunLost, Settlement
from kyronix.server.sessions import RESULT_KEY, RESULTS_KEY

from .helpers import config

ID_KEY = b"the server's id key"


@dataclass
class World:
    config: ServerConfig
    db: Database
    store: SqlSessionStore
    pool: SessionPool
    recorder: ResultsRecorder
    runs: Runs
    project: str


@pytest.fixture(name="w")
def world(tmp_path: Path) -> Iterator[World]:
    cfg = config(tmp_path / "home")
    ensure_home(cfg.home)
    db = Database(cfg.database_url)
    migrate(db)
    store = SqlSessionStore(db.engine)
    pool = SessionPool(store, cfg.sessions_dir)
    recorder = ResultsRecorder(db, pool, id_key=ID_KEY)
    runs = Runs(
        cfg, db, store, choose_model(cfg), relay=Relay(on_results=recorder.record), pool=pool,
        recorder=recorder, id_key=ID_KEY, owner="srv_here",
    )  # fmt: skip
    project = db.write(lambda c: accounts.create_project(c, "demo", 100_000)).id
    yield World(cfg, db, store, pool, recorder, runs, project)
    pool.close_idle()
    db.close()


def admit(w: World, **fields: Any) -> Any:
    """Admit a run (closing the new session's writer the admission opened)."""
    req = RunRequest(**{"project_id": w.project, "agent": "coding", "input": "hi", **fields})
    handle, persona, new = w.runs.admission.admit(req)
    if handle.writer is not None:
        handle.writer.close()
        handle.writer = None
    return handle, persona, new


def row_of(w: World, run_id: str) -> Any:
    return w.db.read(lambda c: records.get(c, run_id))


def kinds(w: World) -> list[str]:
    return [e.kind for e in w.db.read(lambda c: billing.entries(c, w.project))]


# --------------------------------------------------------------------------- admission


def test_admission_writes_the_row_the_hold_and_the_session_in_one_transaction(w: World) -> None:
    handle, persona, new = admit(w)
    assert new and persona is not None and persona.id == "coding"
    row = row_of(w, handle.id)
    assert (row.status, row.owner, row.input, row.session_id) == (
        "running", "srv_here", "hi", handle.session_id,
    )  # fmt: skip
    assert w.db.read(lambda c: billing.held(c, w.project)) == w.config.minimum_charge
    session = w.db.read(lambda c: sessions.find(c, w.project, handle.session_id))
    assert session.active_run == handle.id
    assert w.store.load(handle.session_id).header.id == handle.session_id  # its kiso header too


def test_a_second_run_of_a_busy_session_is_refused_and_holds_nothing(w: World) -> None:
    first, _, _ = admit(w)
    with pytest.raises(ApiError) as info:
        admit(w, session_id=first.session_id)
    assert (info.value.status, info.value.code) == (409, "session_busy")
    assert kinds(w) == ["grant", "hold"]  # the refused run's hold rolled back with it


def test_an_idempotency_key_answers_its_run_and_refuses_another_body(w: World) -> None:
    handle, _, _ = admit(w, idem_key="k1", request_hash="h1")
    with pytest.raises(RunningElsewhere) as running:
        admit(w, idem_key="k1", request_hash="h1")  # still running, and not live here
    assert running.value.row.id == handle.id  # the caller follows it where it runs
    with pytest.raises(ApiError) as other:
        admit(w, idem_key="k1", request_hash="h2")
    assert (other.value.status, other.value.code) == (422, "idempotency_key_reused")
    done = Outcome(handle.id, handle.session_id, 200, response="<kyronix/>", cost=500)
    w.db.write(functools.partial(w.runs.settlement.settle_tx, done, w.project))
    replay, persona, new = admit(w, idem_key="k1", request_hash="h1")
    assert not new and persona is None and replay.id == handle.id
    assert replay.status == 200 and replay.body is not None
    assert replay.body["response"] == "<kyronix/>"


def test_no_credits_is_402_before_anything_is_written(w: World) -> None:
    poor = w.db.write(lambda c: accounts.create_project(c, "poor", 0)).id
    with pytest.raises(ApiError) as info:
        admit(w, project_id=poor)
    assert (info.value.status, info.value.code) == (402, "insufficient_credits")
    assert info.value.details == {"required": 0.5, "available": 0.0, "held": 0.0}
    assert w.db.read(lambda c: records.page(c, poor)) == []


def test_a_custom_agent_of_another_project_does_not_exist(w: World) -> None:
    with pytest.raises(ApiError) as info:
        admit(w, agent="custom", custom_agent_id="ca_nope")
    assert (info.value.status, info.value.code) == (404, "agent_not_found")


# --------------------------------------------------------------------------- settlement


def test_settling_charges_finishes_and_frees_the_session(w: World) -> None:
    handle, _, _ = admit(w)
    outcome = Outcome(
        handle.id, handle.session_id, 200, response="<kyronix/>", execution_ids=("exec_a",),
        cost=700, usage=(3, 4), texts=["<kyronix/>"], issues_ids=True, key_id="key_runner",
    )  # fmt: skip
    w.db.write(functools.partial(w.runs.settlement.settle_tx, outcome, w.project))
    row = row_of(w, handle.id)
    assert (row.status, row.http_status, row.cost, row.usage_input) == ("completed", 200, 700, 3)
    assert kinds(w)[-3:] == ["hold", "release", "settle"]
    assert outcome.credits_remaining == 100_000 - 700
    assert outcome.body()["creditsRemaining"] == 99.3
    assert w.db.read(lambda c: sessions.find(c, w.project, handle.session_id)).active_run is None
    issued = w.db.read(lambda c: records.sessions_of_executions(c, ["exec_a"], w.project))
    assert issued == {"exec_a": (handle.session_id, "key_runner")}  # and who may answer it


def test_a_replica_that_lost_the_run_charges_nothing_and_writes_nothing(w: World) -> None:
    handle, _, _ = admit(w)
    elsewhere = Settlement(w.db, w.store, w.pool, "srv_paused", in_tx=True)
    outcome = Outcome(handle.id, handle.session_id, 200, response="<kyronix/>", cost=900)
    with pytest.raises(RunLost):
        w.db.write(functools.partial(elsewhere.settle_tx, outcome, w.project))
    assert row_of(w, handle.id).status == "running"  # rolled back whole
    assert kinds(w) == ["grant", "hold"]
    assert not elsewhere.interrupt(handle.id, "a stale replica")
    assert row_of(w, handle.id).status == "running"


def test_settling_twice_is_refused_the_second_time(w: World) -> None:
    handle, _, _ = admit(w)
    outcome = Outcome(handle.id, handle.session_id, 200, response="x", cost=600)
    w.db.write(functools.partial(w.runs.settlement.settle_tx, outcome, w.project))
    with pytest.raises(RunLost):
        w.db.write(functools.partial(w.runs.settlement.settle_tx, outcome, w.project))
    assert kinds(w).count("settle") == 1


def test_an_interrupted_run_releases_its_hold_frees_its_key_and_says_so_in_its_log(
    w: World,
) -> None:
    handle, _, _ = admit(w, idem_key="k", request_hash="h")
    assert w.runs.settlement.interrupt(handle.id, "test")
    row = row_of(w, handle.id)
    assert (row.status, row.http_status, row.idem_key) == ("interrupted", 503, None)
    assert kinds(w)[-2:] == ["hold", "release"]
    assert w.db.read(lambda c: billing.balance(c, w.project)) == 100_000
    events = w.store.load(handle.session_id).events
    said = [e.value for e in events if isinstance(e, SettingChanged) and e.key == RESULT_KEY]
    assert said == [{"runId": handle.id, "status": "interrupted", "response": ""}]
    assert sessions.chat_of(events)[0] == {"role": "user", "content": "hi"}  # from its row
    assert not w.runs.settlement.interrupt(handle.id, "again")  # once


# --------------------------------------------------------------------------- recovery


def test_takeover_claims_only_runs_of_dead_servers(w: World) -> None:
    plan, _, _ = admit(w)
    tunnel, _, _ = admit(w, execute="tunnel")
    mine, _, _ = admit(w)
    dead = {"plan": plan.id, "tunnel": tunnel.id}
    w.db.write(lambda c: [_own(c, run_id, "srv_dead") for run_id in dead.values()])
    interrupted, resumable = w.runs.recovery.take_over(why="test")
    assert interrupted == 1 and [r.id for r in resumable] == [tunnel.id]
    assert row_of(w, plan.id).status == "interrupted"
    assert (row_of(w, tunnel.id).status, row_of(w, tunnel.id).owner) == ("running", "srv_here")
    assert row_of(w, mine.id).status == "running"  # this server's own: not taken
    assert w.runs.recovery.take_over(why="again") == (0, [])  # claimed once


def test_expired_holds_are_swept_unless_their_run_is_live(w: World) -> None:
    w.runs.admission.config = w.config.with_(hold_ttl=0.0)
    gone, _, _ = admit(w)
    live, _, _ = admit(w)
    assert w.runs.recovery.sweep_holds(live={live.id}) == 1
    assert row_of(w, gone.id).status == "interrupted"
    assert row_of(w, live.id).status == "running"
    assert w.db.read(lambda c: billing.held(c, w.project)) == w.config.minimum_charge


def _own(conn: Any, run_id: str, owner: str) -> None:
    from sqlalchemy import update

    from kyronix.server.db import runs

    conn.execute(update(runs).where(runs.c.id == run_id).values(owner=owner))


# --------------------------------------------------------------------------- results


def _entry(execution_id: str, output: str) -> dict[str, Any]:
    return {
        "tool": "read_file",
        "args": {"path": "a"},
        "result": {"success": True, "output": output, "executionId": execution_id, "ms": 1},
    }


def _recorded(w: World, session_id: str) -> list[Any]:
    events = w.store.load(session_id).events
    return [e.value for e in events if isinstance(e, SettingChanged) and e.key == RESULTS_KEY]


def test_results_go_to_the_session_that_issued_the_plan(w: World) -> None:
    handle, _, _ = admit(w)
    w.runs.settlement.interrupt(handle.id, "done with it")
    w.recorder.remember(w.project, handle.session_id, ["exec_1"])
    entries = [_entry("exec_1", "hello")]
    asyncio.run(w.recorder.record(w.project, "req_1", entries))
    assert _recorded(w, handle.session_id) == [{"requestId": "req_1", "results": entries}]


def test_results_of_a_plan_issued_earlier_are_found_in_the_database(w: World) -> None:
    handle, _, _ = admit(w)
    signed = execution_id("run_earlier", 0, ID_KEY)
    outcome = Outcome(
        handle.id, handle.session_id, 200, response="x", execution_ids=(signed,), cost=500,
        issues_ids=True,
    )  # fmt: skip
    w.db.write(functools.partial(w.runs.settlement.settle_tx, outcome, w.project))

    async def record() -> None:
        await w.recorder.record(w.project, "req_2", [_entry(signed, "found")])
        await w.recorder.record("proj_other", "req_3", [_entry(signed, "not yours")])
        await w.recorder.record(w.project, "req_4", [_entry("exec_unknown", "nobody's")])
        forged = execution_id("run_earlier", 0, b"another server's key")
        await w.recorder.record(w.project, "req_5", [_entry(forged, "not signed here")])

    asyncio.run(record())
    assert [v["requestId"] for v in _recorded(w, handle.session_id)] == ["req_2"]


def test_results_are_recorded_only_for_the_key_that_ran_the_plan(w: World) -> None:
    """In memory and from the database alike: another key's answer to the same tool ids goes
    nowhere; the key that ran the plan records."""
    handle, _, _ = admit(w)
    in_db = execution_id("run_db", 0, ID_KEY)
    outcome = Outcome(
        handle.id, handle.session_id, 200, response="x", execution_ids=(in_db,), cost=500,
        issues_ids=True, key_id="key_runner",
    )  # fmt: skip
    w.db.write(functools.partial(w.runs.settlement.settle_tx, outcome, w.project))
    w.recorder.remember(w.project, handle.session_id, ["exec_mem"], "key_runner")

    async def record() -> None:
        for eid in ("exec_mem", in_db):
            await w.recorder.record(
                w.project, f"req_other_{eid}", [_entry(eid, "forged")], key_id="key_other"
            )
            await w.recorder.record(w.project, f"req_{eid}", [_entry(eid, "true")], key_id=None)
        for eid in ("exec_mem", in_db):
            await w.recorder.record(
                w.project, f"req_runner_{eid}", [_entry(eid, "true")], key_id="key_runner"
            )

    asyncio.run(record())
    assert [v["requestId"] for v in _recorded(w, handle.session_id)] == [
        "req_runner_exec_mem", f"req_runner_{in_db}",
    ]  # fmt: skip


def test_a_recorded_entry_is_bounded_whatever_its_arguments_and_data(w: World) -> None:
    from kyronix.server.runs.results import RECORDED_BYTES

    handle, _, _ = admit(w)
    w.runs.settlement.interrupt(handle.id, "done with it")
    w.recorder.remember(w.project, handle.session_id, ["exec_big"])
    entry = _entry("exec_big", "o" * 100_000)
    entry["args"] = {"content": "a" * 2_000_000}
    entry["result"]["data"] = {"entries": ["d" * 1000] * 1000}
    asyncio.run(w.recorder.record(w.project, "req_big", [entry]))
    (recorded,) = _recorded(w, handle.session_id)
    kept = recorded["results"][0]
    assert len(json.dumps(kept)) <= RECORDED_BYTES
    assert kept["result"]["truncated"] is True and kept["args"] == {}
    assert "data" not in kept["result"] and kept["result"]["executionId"] == "exec_big"
    assert kept["result"]["output"] == "o" * 64 * 1024


# --------------------------------------------------------------------------- the outcome


def test_one_outcome_makes_both_the_answer_and_the_record() -> None:
    ok = Outcome(
        "run_1", "sess_1", 200, response="<kyronix/>", execution_ids=("exec_1",), cost=1500,
        usage=(10, 20), credits_remaining=98_500,
    )  # fmt: skip
    assert ok.body() == {
        "response": "<kyronix/>", "sessionId": "sess_1", "creditsRemaining": 98.5,
        "usage": {"input": 10, "output": 20}, "cost": 1.5, "executionIds": ["exec_1"],
        "runId": "run_1",
    }  # fmt: skip
    assert ok.record() == {
        "runId": "run_1", "status": "completed", "response": "<kyronix/>",
        "executionIds": ["exec_1"], "cost": 1.5,
    }  # fmt: skip
    failed = Outcome.failure(
        "run_2", "sess_1", 502, "model_error", "the model failed: x",
        details={"runId": "run_2", "results": []}, results=[],
    )  # fmt: skip
    assert failed.body()["error"]["code"] == "model_error"
    assert failed.record() == {"runId": "run_2", "status": "failed", "response": "", "results": []}
    bug = Outcome.failure("run_3", "sess_1", 500, "internal_error", "x", recorded_in_log=False)
    assert bug.record() is None and bug.cost is None


def test_a_charge_is_the_minimum_or_the_price_times_the_multiplier(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert charge(cfg, None) == cfg.minimum_charge == charge(cfg, 0.0)
    assert charge(cfg, 1.0) == round(cfg.credits_per_usd * cfg.multiplier * 1000)


def test_a_tool_the_executer_never_answered_is_an_entry_of_the_executers_own_type() -> None:
    from kiso.kernel import ExecutionFinished, ExecutionStarted, RunStarted
    from kiso.kernel.events import ModelRef
    from kyronix.executer.results import ResultEntry
    from kyronix.server.runs.tunnel import failed_entry, results_of_run

    entry = failed_entry("terminal", {"command": "ls"}, "exec_1", "no executer", "no_executer")
    assert ResultEntry.from_dict(entry).to_dict() == entry  # the executer reads it back
    assert entry["result"]["errorType"] == "no_executer" and entry["result"]["success"] is False
    events = [
        RunStarted(run="r1", trigger="api", model=ModelRef("x", "y"), mode="bypass"),
        ExecutionStarted(
            run="r1", execution_id="s:2", call_id="c1", name="read_file", input={"path": "a"}
        ),
        ExecutionFinished(
            run="r1",
            execution_id="s:2",
            call_id="c1",
            ok=False,
            content="the tool crashed",
            is_error=True,
            ms=1,
        ),
    ]
    (only,) = results_of_run(events, "r1")
    assert (only["tool"], only["args"], only["result"]["error"]) == (
        "read_file", {"path": "a"}, "the tool crashed",
    )  # fmt: skip
    assert ResultEntry.from_dict(only).result.error_type == "server_error"


def test_a_run_whose_custom_agent_was_deleted_is_interrupted_not_a_failed_start(w: World) -> None:
    """A server-driven run of a custom agent deleted while it ran, left by a killed server: the
    next start records it interrupted (and starts), instead of failing every start."""
    from kyronix.server import custom_agents
    from kyronix.server.schemas import CustomAgentCreate

    spec = CustomAgentCreate(name="gone", tools=[{"name": "t", "params": ["a"]}])
    agent = w.db.write(lambda c: custom_agents.create_agent(c, w.project, spec))
    handle, _, _ = admit(w, agent="custom", custom_agent_id=agent.id, execute="tunnel")
    w.db.write(lambda c: custom_agents.delete_agent(c, w.project, agent.id))
    w.db.write(lambda c: _own(c, handle.id, "srv_dead"))
    interrupted, resumable = w.runs.recovery.take_over(why="test")
    assert interrupted == 0 and [r.id for r in resumable] == [handle.id]
    asyncio.run(w.runs.recovery.resume(resumable))  # no exception: the start goes on
    assert row_of(w, handle.id).status == "interrupted"
    assert w.db.read(lambda c: billing.held(c, w.project)) == 0


def test_a_plans_tool_ids_are_signed_by_the_server_that_gave_them() -> None:
    """The server tells its own plans' ids from any other without a look-up: the same run
    gives the same ids again, and no other key's (nor a hand-made id) passes for them."""
    from kyronix.server.agents import issued_by

    ids = [execution_id("run_1", n, ID_KEY) for n in range(3)]
    assert ids == [execution_id("run_1", n, ID_KEY) for n in range(3)]  # answered again: same
    assert len(set(ids)) == 3 and all(len(i) == 37 and i.startswith("exec_") for i in ids)
    assert all(issued_by(i, ID_KEY) for i in ids)
    assert not any(issued_by(i, b"another server") for i in ids)
    assert not issued_by("exec_" + "0" * 32, ID_KEY) and not issued_by("exec_1", ID_KEY)
    tampered = ids[0][:6] + ("1" if ids[0][6] == "0" else "0") + ids[0][7:]
    assert not issued_by(tampered, ID_KEY)
