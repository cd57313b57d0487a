"""The HTTP API in process (Starlette's TestClient over httpx2): shapes, errors, isolation."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from sqlalchemy import select, update

from kyronix import kml
from kyronix.server import billing
from kyronix.server.agents import AGENTS, builtin_persona
from kyronix.server.db import ledger, runs

from .helpers import ON_BOTH, auth, project_with_key, sse_events, tools_of

PROMPTS = {
    "coding": "Create a React component called Button in src/components/Button.tsx",
    "research": "Summarize latest developments in WebAssembly",
    "database": "Write a Postgres migration script for users table",
    "sales": "Draft a cold outreach email for enterprise software",
}


@pytest.mark.parametrize("agent", AGENTS)
def test_each_agent_answers_valid_kml_with_only_its_tools(make_client: Any, agent: str) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    r = client.post(f"/api/agents/{agent}", json={"input": PROMPTS[agent]}, headers=auth(key))
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) >= {"response", "sessionId", "creditsRemaining", "usage", "cost"}
    assert body["creditsRemaining"] == 99.5 and body["cost"] == 0.5
    plan = kml.parse(body["response"])
    assert body["response"].lstrip().startswith("<kyronix>")
    assert plan.plan and plan.summary and plan.status == "complete"
    allowed = {t.name for t in builtin_persona(agent).tools}
    assert plan.tools and {t.name for t in plan.tools} <= allowed
    assert [t.execution_id for t in plan.tools] == body["executionIds"]
    assert all(e.startswith("exec_") and len(e) == 37 for e in body["executionIds"])
    assert body["usage"]["input"] > 0 and body["usage"]["output"] > 0
    assert body["sessionId"].startswith("sess_")


def test_the_tool_sets_are_the_documents(make_client: Any) -> None:
    coding = {t.name for t in builtin_persona("coding").tools}
    assert {"write_file", "terminal", "git_commit", "read_lines"} <= coding
    assert not coding & {"navigate", "http_request"}
    assert {t.name for t in builtin_persona("research").tools} == {
        "navigate", "click", "type", "screenshot", "http_request",
    }  # fmt: skip
    assert "terminal" in {t.name for t in builtin_persona("database").tools}
    assert "http_request" in {t.name for t in builtin_persona("sales").tools}
    assert "SQL" in builtin_persona("database").instructions


def test_an_unknown_agent_is_404_listing_the_agents(make_client: Any) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    r = client.post("/api/agents/poetry", json={"input": "x"}, headers=auth(key))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "agent_not_found"
    assert r.json()["error"]["details"]["agents"] == list(AGENTS)


@ON_BOTH
def test_sessions_keep_history_and_chat_is_a_projection(make_client: Any) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    made = client.post("/api/sessions", json={"agent": "coding"}, headers=auth(key))
    assert made.status_code == 201
    sid = made.json()["id"]
    assert made.json()["agentId"] == "coding"
    first = client.post(
        "/api/agents/coding",
        json={"input": "Create a database migration script", "sessionId": sid},
        headers=auth(key),
    )
    second = client.post(
        "/api/agents/coding", json={"input": "Add an index on email", "sessionId": sid},
        headers=auth(key),
    )  # fmt: skip
    assert first.json()["sessionId"] == second.json()["sessionId"] == sid
    for verb in ("GET", "POST"):
        view = client.request(verb, f"/api/sessions/{sid}", headers=auth(key))
        assert view.status_code == 200
        data = view.json()
        assert data["id"] == sid and data["agentId"] == "coding"
        chat = data["chat"]
        assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant"]
        assert chat[0]["content"] == "Create a database migration script"
        assert chat[1]["content"] == first.json()["response"]
        assert chat[3]["content"] == second.json()["response"]
    # the kiso session log is where it came from
    log = app.state.kx.store.load(sid)
    assert any(getattr(e, "key", None) == "kyronix.result" for e in log.events)
    # the model saw the first turn when answering the second (multi-turn context)
    users = [e for e in log.events if type(e).__name__ == "User"]
    assert len(users) == 2


def test_a_session_of_another_project_is_404(make_client: Any) -> None:
    client, app = make_client()
    _, key_a = project_with_key(app, "a")
    _, key_b = project_with_key(app, "b")
    sid = client.post("/api/agents/coding", json={"input": "x"}, headers=auth(key_a)).json()[
        "sessionId"
    ]
    for verb in ("GET", "POST"):
        r = client.request(verb, f"/api/sessions/{sid}", headers=auth(key_b))
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    r = client.post(
        "/api/agents/coding", json={"input": "x", "sessionId": sid}, headers=auth(key_b)
    )
    assert r.status_code == 404 and sid not in json.dumps(r.json().get("details", {}))


def test_a_project_id_that_is_not_the_keys_is_404(make_client: Any) -> None:
    client, app = make_client()
    _, key_a = project_with_key(app, "a")
    project_b, _ = project_with_key(app, "b")
    r = client.post(
        "/api/agents/coding", json={"input": "x", "projectId": project_b}, headers=auth(key_a)
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "project_not_found"


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "missing_api_key"),
        ({"Authorization": "Bearer nope"}, "invalid_api_key"),
        ({"Authorization": "Basic a2V5Og=="}, "invalid_api_key"),
        ({"Authorization": "Bearer kyr_" + "A" * 43}, "invalid_api_key"),
    ],
)
def test_a_missing_malformed_or_unknown_key_is_401(
    make_client: Any, headers: dict[str, str], code: str
) -> None:
    client, _ = make_client()
    r = client.post("/api/agents/coding", json={"input": "x"}, headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == code
    assert set(r.json()["error"]) == {"code", "message", "details"}


def test_a_revoked_key_is_401(make_client: Any) -> None:
    from kyronix.server import accounts

    client, app = make_client()
    _, key = project_with_key(app)
    assert client.get("/api/customagents", headers=auth(key)).status_code == 200
    state = app.state.kx
    (info,) = state.db.read(accounts.list_keys)
    state.db.write(lambda c: accounts.revoke_key(c, info.id))
    r = client.get("/api/customagents", headers=auth(key))
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_keys_are_stored_hashed_with_a_prefix_and_last_use_is_recorded(make_client: Any) -> None:
    from kyronix.server import accounts
    from kyronix.server.db import api_keys

    client, app = make_client()
    _, key = project_with_key(app)
    assert accounts.KEY_PATTERN.fullmatch(key)
    client.get("/api/credits", headers=auth(key))
    state = app.state.kx
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        (row,) = state.db.read(lambda c: list(c.execute(select(api_keys))))
        if row.last_used_at is not None:
            break
        time.sleep(0.02)
    assert row.last_used_at is not None
    assert key not in json.dumps([str(v) for v in row])  # never the key itself
    assert row.prefix == key[:12] and len(row.hash) == 64
    db_bytes = (state.config.home / "kyronix.sqlite3").read_bytes()
    assert key.encode() not in db_bytes


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"input": 5}',
        b'{"input": ""}',
        b'{"input": "x", "sessionId": 7}',
        b'{"input": "x", "sessionId": "not-a-session"}',
        b'{"input": "x", "projectId": null, "surprise": 1}',
        b'{"input": ["x"]}',
        b"",
        b'"just a string"',
        b'{"input": "\\ud800"}',
    ],
)
def test_malformed_json_or_wrong_types_are_400_never_500(make_client: Any, body: bytes) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    r = client.post(
        "/api/agents/coding",
        content=body,
        headers={**auth(key), "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and "Traceback" not in r.text


def test_over_one_mib_is_413(make_client: Any) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    big = json.dumps({"input": "x" * (1024 * 1024)}).encode()
    r = client.post(
        "/api/agents/coding", content=big, headers={**auth(key), "Content-Type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

    def chunks() -> Any:
        for _ in range(20):
            yield b"x" * 65536

    r = client.post("/api/agents/coding", content=chunks(), headers=auth(key))
    assert r.status_code == 413


@ON_BOTH
def test_credits_run_out_with_402_and_the_ledger_explains_the_balance(make_client: Any) -> None:
    client, app = make_client()
    project, key = project_with_key(app, credits=1000)  # 1 credit: two runs
    codes = [
        client.post("/api/agents/coding", json={"input": "x"}, headers=auth(key)).status_code
        for _ in range(3)
    ]
    assert codes == [200, 200, 402]
    r = client.post("/api/agents/coding", json={"input": "x"}, headers=auth(key))
    err = r.json()["error"]
    assert err["code"] == "insufficient_credits" and err["details"]["available"] == 0
    state = app.state.kx
    kinds = state.db.read(
        lambda c: [r.kind for r in c.execute(select(ledger).where(ledger.c.project_id == project))]
    )
    assert kinds == ["grant", "hold", "release", "settle", "hold", "release", "settle"]
    assert state.db.read(lambda c: billing.ledger_sum(c, project)) == 0
    assert state.db.read(lambda c: billing.balance(c, project)) == 0
    assert client.get("/api/credits", headers=auth(key)).json() == {
        "projectId": project, "credits": 0.0, "held": 0.0,
    }  # fmt: skip


def test_the_multiplier_and_minimum_are_configurable(make_client: Any) -> None:
    client, app = make_client(minimum_charge=2000)
    _, key = project_with_key(app)
    r = client.post("/api/agents/coding", json={"input": "x"}, headers=auth(key))
    assert r.json()["cost"] == 2.0 and r.json()["creditsRemaining"] == 98.0


@ON_BOTH
def test_an_idempotency_key_retry_is_charged_once_and_another_body_is_422(
    make_client: Any,
) -> None:
    client, app = make_client()
    project, key = project_with_key(app)
    h = {**auth(key), "Idempotency-Key": "retry-1"}
    first = client.post("/api/agents/coding", json={"input": "make a file"}, headers=h)
    again = client.post("/api/agents/coding", json={"input": "make a file"}, headers=h)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert app.state.kx.db.read(lambda c: billing.balance(c, project)) == 99_500
    other = client.post("/api/agents/coding", json={"input": "another"}, headers=h)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    # the same key on another route with its own body is "another body" too
    other = client.post("/api/agents/sales", json={"input": "make a file"}, headers=h)
    assert other.status_code == 422
    bad = client.post(
        "/api/agents/coding", json={"input": "x"}, headers={**auth(key), "Idempotency-Key": ""}
    )
    assert bad.status_code == 400


@ON_BOTH
def test_a_busy_session_is_409_session_busy(make_client: Any) -> None:
    client, app = make_client(scripted_delay_ms=1500)
    _, key = project_with_key(app)
    sid = client.post("/api/sessions", json={}, headers=auth(key)).json()["id"]
    results: list[Any] = []

    def run() -> None:
        results.append(
            client.post(
                "/api/agents/coding", json={"input": "slow", "sessionId": sid}, headers=auth(key)
            )
        )

    t = threading.Thread(target=run)
    t.start()
    import time

    state = app.state.kx
    deadline = time.monotonic() + 10
    while not state.runs.running and time.monotonic() < deadline:
        time.sleep(0.01)
    r = client.post(
        "/api/agents/coding", json={"input": "now", "sessionId": sid}, headers=auth(key)
    )
    t.join()
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy"
    assert results[0].status_code == 200
    after = client.post(
        "/api/agents/coding", json={"input": "later", "sessionId": sid}, headers=auth(key)
    )
    assert after.status_code == 200


@ON_BOTH
def test_streaming_sends_chunks_with_ids_then_complete(make_client: Any) -> None:
    client, app = make_client(scripted_delay_ms=200)
    _, key = project_with_key(app)
    with client.stream(
        "POST", "/api/agents/coding/stream", json={"input": "x"}, headers=auth(key)
    ) as s:
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        events = sse_events(s.read().decode())
    chunks = [e for e in events if e["event"] == "chunk"]
    assert len(chunks) > 3  # streamed as generated, not in one piece
    assert all(e.get("id") for e in events)
    final = events[-1]
    assert final["event"] == "complete" and final["id"] == "end"
    assert [e for e in events if e["event"] in ("complete", "error")] == [final]
    text = "".join(e["data"]["text"] for e in chunks)
    assert kml.parse(text).tools  # the chunks are the model's KML
    assert tools_of(final["data"]["response"]) == [t.name for t in kml.parse(text).tools]
    # reconnecting with Last-Event-ID gets the rest, and only the rest
    middle = chunks[1]["id"]
    run_id = final["data"]["runId"]
    with client.stream(
        "GET", f"/api/runs/{run_id}/stream", headers={**auth(key), "Last-Event-ID": middle}
    ) as s:
        rest = sse_events(s.read().decode())
    offset = int(middle.split(":")[1])
    assert "".join(e["data"]["text"] for e in rest if e["event"] == "chunk") == text[offset:]
    assert rest[-1]["event"] == "complete"
    with client.stream(
        "GET", f"/api/runs/{run_id}/stream", headers={**auth(key), "Last-Event-ID": "end"}
    ) as s:
        assert sse_events(s.read().decode()) == []


@ON_BOTH
def test_custom_agents_crud_and_run(make_client: Any) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    h = auth(key)
    assert client.get("/api/customagents", headers=h).json() == []
    spec = {
        "name": "Database Assistant",
        "description": "Queries analytics database and summarizes reports",
        "tools": [
            {"name": "execute_sql", "description": "Executes SQL query on analytics engine",
             "params": ["sql_query", "limit"], "disabled": False},
            {"name": "drop_everything", "description": "never", "params": [], "disabled": True},
        ],
    }  # fmt: skip
    made = client.post("/api/customagents", json=spec, headers=h)
    assert made.status_code == 201
    agent = made.json()
    assert len(agent["id"]) == 64 and int(agent["id"], 16) >= 0
    assert agent["tools"][0] == spec["tools"][0]
    assert client.get("/api/customagents", headers=h).json() == [agent]
    assert client.get(f"/api/customagents/{agent['id']}", headers=h).json() == agent
    run = client.post(
        "/api/customagents/run",
        json={"agentId": agent["id"], "input": "top active users"},
        headers=h,
    )
    assert run.status_code == 200, run.text
    assert tools_of(run.json()["response"]) == ["execute_sql"]  # never the disabled tool
    plan = kml.parse(run.json()["response"])
    assert set(plan.tools[0].args) <= {"sql_query", "limit"}
    patched = client.patch(f"/api/customagents/{agent['id']}", json={"name": "DB"}, headers=h)
    assert patched.json()["name"] == "DB" and patched.json()["tools"] == agent["tools"]
    # the session created with a custom agent runs it
    sess = client.post("/api/sessions", json={"customAgentId": agent["id"]}, headers=h).json()
    assert sess["agentId"] == agent["id"]
    r = client.post("/api/agents/coding", json={"input": "go", "sessionId": sess["id"]}, headers=h)
    assert tools_of(r.json()["response"]) == ["execute_sql"]
    with client.stream(
        "POST",
        "/api/customagents/run/stream",
        json={"agentId": agent["id"], "input": "x"},
        headers=h,
    ) as s:
        assert sse_events(s.read().decode())[-1]["event"] == "complete"
    gone = client.delete(f"/api/customagents/{agent['id']}", headers=h)
    assert gone.json() == {"id": agent["id"], "deleted": True}
    assert client.get(f"/api/customagents/{agent['id']}", headers=h).status_code == 404
    r = client.post("/api/customagents/run", json={"agentId": agent["id"], "input": "x"}, headers=h)
    assert r.status_code == 404 and r.json()["error"]["code"] == "agent_not_found"


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "x", "tools": [{"name": "bad name", "params": []}]},
        {"name": "x", "tools": [{"name": "t", "params": ["a", "a"]}]},
        {"name": "x", "tools": [{"name": "t"}, {"name": "t"}]},
        {"name": "", "tools": []},
        {"tools": []},
        {"name": "x", "tools": "execute_sql"},
    ],
)
def test_invalid_custom_agents_are_400(make_client: Any, spec: dict[str, Any]) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    r = client.post("/api/customagents", json=spec, headers=auth(key))
    assert r.status_code == 400, r.text


def test_rate_limit_is_429_with_retry_after(make_client: Any) -> None:
    client, app = make_client(rate_per_minute=60.0, rate_burst=3)
    _, key = project_with_key(app)
    codes = [client.get("/api/credits", headers=auth(key)).status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
    r = client.get("/api/credits", headers=auth(key))
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["code"] == "rate_limited"
    _, other = project_with_key(app, "other")  # per key: another key is not limited
    assert client.get("/api/credits", headers=auth(other)).status_code == 200


def test_draining_is_503(make_client: Any) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    app.state.kx.begin_drain()
    r = client.post("/api/agents/coding", json={"input": "x"}, headers=auth(key))
    assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
    assert client.get("/healthz").status_code == 503


def test_unknown_routes_and_methods_use_the_error_body(make_client: Any) -> None:
    client, app = make_client()
    _, key = project_with_key(app)
    r = client.get("/api/nothing", headers=auth(key))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = client.delete("/api/agents/coding", headers=auth(key))
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_openapi_and_docs_are_published(make_client: Any) -> None:
    client, _ = make_client()
    spec = client.get("/openapi.json").json()
    paths = set(spec["paths"])
    assert {
        "/api/agents/{agent}", "/api/agents/{agent}/stream", "/api/customagents",
        "/api/customagents/{agent_id}", "/api/customagents/run", "/api/customagents/run/stream",
        "/api/sessions", "/api/sessions/{session_id}",
    } <= paths  # fmt: skip
    assert client.get("/docs").status_code == 200
    schemas = spec["components"]["schemas"]
    assert schemas["RunBody"]["properties"]["sessionId"]["anyOf"][0]["pattern"].startswith("^sess_")


def test_cors_is_off_unless_configured(make_client: Any) -> None:
    client, _ = make_client()
    r = client.options(
        "/api/agents/coding",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers
    client, _ = make_client(cors=("https://app.example",))
    r = client.options(
        "/api/agents/coding",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert r.headers["access-control-allow-origin"] == "https://app.example"


@ON_BOTH
def test_an_interrupted_run_found_at_start_is_released_and_shown(
    make_client: Any, kx_home: Any
) -> None:
    """What a killed server leaves (a run row ``running``, a hold, an open kiso run) is settled
    by the start sweep (the SIGKILL test does it for real)."""
    client, app = make_client()
    project, key = project_with_key(app)
    state = app.state.kx
    sid = client.post("/api/sessions", json={}, headers=auth(key)).json()["id"]
    from kyronix.server.runs import RunRequest

    # admit a run but never execute it, and open its kiso run as the loop would
    handle, persona, _ = state.runs.admission.admit(RunRequest(project, "coding", "lost", sid))
    agent = state.runs.driver.plan.agent(persona, project)
    with agent.session(sid) as session:
        from kiso.kernel import ModelRef, RunStarted, User

        session.append(
            RunStarted(run="r1", trigger="api", model=ModelRef("x", "y"), mode="default"),
            User(run="r1", content="lost"),
        )
    assert state.db.read(lambda c: billing.held(c, project)) == 500
    # the run is a dead server's (a replica id no live server has)
    state.db.write(
        lambda c: c.execute(update(runs).where(runs.c.id == handle.id).values(owner="srv_gone"))
    )
    assert state.runs.recovery.at_start() == (1, [])  # interrupted; none to resume
    assert state.db.read(lambda c: billing.held(c, project)) == 0
    assert state.db.read(lambda c: billing.balance(c, project)) == 100_000
    row = state.db.read(lambda c: c.execute(select(runs).where(runs.c.id == handle.id)).one())
    assert row.status == "interrupted"
    chat = client.get(f"/api/sessions/{sid}", headers=auth(key)).json()["chat"]
    assert chat[-1]["status"] == "interrupted"
    assert (
        client.post(
            "/api/agents/coding", json={"input": "x", "sessionId": sid}, headers=auth(key)
        ).status_code
        == 200
    )
