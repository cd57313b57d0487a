"""A run's transactions (ADR 0017): the admission, then the turn's batch with its charge; and the
kiso session kept open between a session's runs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import event, select

from kiso.kernel import SettingChanged
from kiso.kernel.replay import SYSTEM_PROMPT_KEY
from kiso.kernel.sql import SqlWriter
from kiso.kernel.sql import writers as writer_rows
from kyronix.server import billing
from kyronix.server.accounts import list_keys
from kyronix.server.db import ledger, runs
from kyronix.server.runs import RESULT_KEY

from .helpers import ON_BOTH, auth, project_with_key


def _wait_for_last_use(app: Any, project: str) -> None:
    deadline = time.monotonic() + 30
    while not all(k.last_used_at for k in app.state.kx.db.read(lambda c: list_keys(c, project))):
        assert time.monotonic() < deadline, "the key's last use was never written"
        time.sleep(0.01)


def _kinds(app: Any, project: str) -> list[str]:
    return app.state.kx.db.read(
        lambda c: [r.kind for r in c.execute(select(ledger).where(ledger.c.project_id == project))]
    )


def _lease_token(app: Any, session_id: str) -> str | None:
    row = app.state.kx.db.read(
        lambda c: c.execute(
            select(writer_rows.c.token).where(writer_rows.c.session_id == session_id)
        ).first()
    )
    return None if row is None else str(row.token)


@ON_BOTH
def test_a_run_on_a_new_session_commits_twice(
    make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, app = make_client()
    project, key = project_with_key(app)
    client.post("/api/agents/coding", json={"input": "warm"}, headers=auth(key))  # key's last use
    _wait_for_last_use(app, project)  # written off the request's path: not in the count below
    writes: list[int] = []

    def count(conn: Any) -> None:
        if conn.get_execution_options().get("kiso_write"):
            writes.append(1)

    batches: list[tuple[str, ...]] = []
    monkeypatch.setattr(
        SqlWriter, "_before_commit", lambda w, batch: batches.append(tuple(e.type for e in batch))
    )
    engine = app.state.kx.db.engine
    event.listen(engine, "commit", count)
    try:
        r = client.post("/api/agents/coding", json={"input": "x"}, headers=auth(key))
    finally:
        event.remove(engine, "commit", count)
    assert r.status_code == 200, r.text
    # the admission (hold, rows, the new session's header), then the turn's one batch with the
    # settle in it: its input, the model's answer, the result, run_ended
    assert len(writes) == 2
    assert len(batches) == 1 and batches[0][0] == "run_started" and batches[0][-1] == "run_ended"
    assert _kinds(app, project)[-3:] == ["hold", "release", "settle"]
    assert r.json()["creditsRemaining"] == 99.0


@ON_BOTH
def test_the_answer_and_its_charge_commit_together_or_not_at_all(
    make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, app = make_client()
    project, key = project_with_key(app)

    def fail_the_answer(writer: SqlWriter, batch: Any) -> None:
        if any(isinstance(e, SettingChanged) and e.key == RESULT_KEY for e in batch):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(SqlWriter, "_before_commit", fail_the_answer)
    r = client.post("/api/agents/coding", json={"input": "x"}, headers=auth(key))
    # the disk refused the answer: the one clear error (issue 29), not a 500
    assert r.status_code == 503 and r.json()["error"]["code"] == "storage_unavailable"
    # the batch rolled back with the settle in it: no charge, the hold given back
    assert _kinds(app, project) == ["grant", "hold", "release"]
    state = app.state.kx
    assert state.db.read(lambda c: billing.balance(c, project)) == 100_000
    assert state.db.read(lambda c: billing.ledger_sum(c, project)) == 100_000
    statuses = state.db.read(lambda c: [row.status for row in c.execute(select(runs))])
    assert statuses == ["failed"]
    session_id = state.db.read(lambda c: c.execute(select(runs.c.session_id)).scalar_one())
    chat = client.get(f"/api/sessions/{session_id}", headers=auth(key)).json()["chat"]
    assert all(m["role"] != "assistant" for m in chat)  # no answer that was never charged
    # the failed writer was not kept: the next run opens the session again and succeeds
    monkeypatch.setattr(SqlWriter, "_before_commit", None)
    again = client.post(
        "/api/agents/coding", json={"input": "y", "sessionId": session_id}, headers=auth(key)
    )
    assert again.status_code == 200, again.text
    assert _kinds(app, project)[-3:] == ["hold", "release", "settle"]
    assert (
        client.get(f"/api/sessions/{session_id}", headers=auth(key)).json()["chat"][-1]["role"]
        == "assistant"
    )


@ON_BOTH
def test_a_sessions_writer_stays_open_between_its_runs(make_client: Any) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    h = auth(key)
    first = client.post("/api/agents/coding", json={"input": "one"}, headers=h).json()
    sid = first["sessionId"]
    token = _lease_token(app, sid)
    assert token is not None  # held while idle: the next run needs no open
    second = client.post("/api/agents/coding", json={"input": "two", "sessionId": sid}, headers=h)
    assert second.status_code == 200
    assert _lease_token(app, sid) == token  # the same writer, not a new lease
    assert app.state.kx.runs.close_idle() >= 1  # the sweep (or shutdown) closes idle ones
    assert _lease_token(app, sid) is None
    third = client.post("/api/agents/coding", json={"input": "three", "sessionId": sid}, headers=h)
    assert third.status_code == 200
    assert _lease_token(app, sid) not in (None, token)
    chat = client.get(f"/api/sessions/{sid}", headers=h).json()["chat"]
    assert [m["content"] for m in chat if m["role"] == "user"] == ["one", "two", "three"]


def test_shutdown_closes_the_idle_sessions(make_client: Any, kx_home: Any) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    sid = client.post("/api/agents/coding", json={"input": "x"}, headers=auth(key)).json()[
        "sessionId"
    ]
    assert _lease_token(app, sid) is not None
    engine = app.state.kx.db.engine
    client.__exit__(None, None, None)  # lifespan shutdown (the fixture's exit is then a no-op)
    with engine.connect() as conn:
        left = conn.execute(select(writer_rows).where(writer_rows.c.session_id == sid)).first()
    assert left is None


def test_an_edited_custom_agent_reopens_its_session_and_records_the_new_prompt(
    make_client: Any,
) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    h = auth(key)
    spec = {
        "name": "Reports",
        "description": "Summarizes the weekly sales report",
        "tools": [{"name": "fetch_report", "description": "Fetch a report", "params": ["week"]}],
    }
    agent = client.post("/api/customagents", json=spec, headers=h).json()
    body = {"agentId": agent["id"], "input": "week 12"}
    sid = client.post("/api/customagents/run", json=body, headers=h).json()["sessionId"]
    token = _lease_token(app, sid)
    edited = client.patch(
        f"/api/customagents/{agent['id']}",
        json={"description": "Summarizes the monthly churn report"},
        headers=h,
    )
    assert edited.status_code == 200
    r = client.post("/api/customagents/run", json={**body, "sessionId": sid}, headers=h)
    assert r.status_code == 200, r.text
    assert _lease_token(app, sid) != token  # opened again, not the writer of the old persona
    prompts = [
        e.value
        for e in app.state.kx.store.load(sid).events
        if isinstance(e, SettingChanged) and e.key == SYSTEM_PROMPT_KEY
    ]
    assert len(prompts) == 2
    assert "weekly sales" in prompts[0] and "monthly churn" in prompts[1]
