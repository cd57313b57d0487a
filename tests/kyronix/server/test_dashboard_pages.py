"""The dashboard's pages through the app (TestClient, a real SQLite database): projects, API
keys shown once and usable against the API, custom agents made in the dashboard and run by the
API, usage, sessions and their timeline and raw log; CSRF, other users' projects and escaping on
every route."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import pytest
from sqlalchemy import select, text

from kiso.kernel import (
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    Compacted,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    ModelRef,
    Outcome,
    RunEnded,
    RunStarted,
    SettingChanged,
    TextBlock,
    ToolCall,
    Usage,
    User,
)
from kyronix.server import users
from kyronix.server.db import api_keys, custom_agents, executions, now_ms, projects, sessions

from .browser import SignedIn
from .helpers import auth, project_with_key, tools_of


class Browser(SignedIn):
    """A signed-in user's browser, at their first project."""

    def __init__(self, client: Any, app: Any, login: str) -> None:
        super().__init__(client, app, login)
        uid = self.uid
        self.project_id = db(app).read(lambda c: users.projects_of(c, uid))[0].id

    @property
    def p(self) -> str:
        return f"/dashboard/projects/{self.project_id}"


def db(app: Any) -> Any:
    return app.state.kx.db


def count(app: Any, table: Any) -> int:
    return len(db(app).read(lambda c: list(c.execute(select(table)))))


@pytest.fixture
def alice(make_client: Any) -> Browser:
    client, app = make_client()
    return Browser(client, app, "alice")


def new_key(b: Browser, name: str = "backend") -> str:
    made = b.post(f"{b.p}/keys", {"name": name})
    assert made.status_code == 201, made.text
    m = re.search(r'<code id="new-key">(kyr_[A-Za-z0-9_-]{43})</code>', made.text)
    assert m, made.text
    assert 'data-copy="#new-key"' in made.text and "will not be shown again" in made.text
    return m.group(1)


AGENT = {
    "name": "Database Assistant",
    "description": "Queries analytics tables and generates summary reports",
    "rows": "3",
    "tool-0-name": "execute_sql",
    "tool-0-description": "Executes a SQL query on analytical database",
    "tool-0-params": "sql_query, limit",
    "tool-1-name": "summarize",
    "tool-1-description": "Summarizes rows",
    "tool-1-params": "rows",
    "tool-2-name": "",
    "tool-2-description": "",
    "tool-2-params": "",
    "action": "save",
}


def new_agent(b: Browser, **changes: str) -> str:
    made = b.post(f"{b.p}/agents", {**AGENT, **changes})
    assert made.status_code == 303, made.text
    m = re.fullmatch(rf"{b.p}/agents/([0-9a-f]{{64}})", made.headers["location"])
    assert m, made.headers["location"]
    return m.group(1)


# --------------------------------------------------------------------------- projects


def test_signed_out_pages_go_to_sign_in_and_home_opens_the_current_project(
    make_client: Any,
) -> None:
    client, app = make_client()
    r = client.get("/dashboard/projects", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/dashboard/signin")
    b = Browser(client, app, "alice")
    home = b.get("/dashboard")
    assert home.status_code == 303 and home.headers["location"] == f"{b.p}/agents"
    page = b.get(f"{b.p}/agents")
    assert page.status_code == 200
    assert f'href="{b.p}/agents" aria-current="page"' in page.text


def test_create_rename_and_select_projects(alice: Browser) -> None:
    b = alice
    made = b.post("/dashboard/projects", {"name": "second"})
    assert made.status_code == 303
    second = made.headers["location"].split("/")[3]
    page = b.get("/dashboard/projects")
    assert "second" in page.text and second in page.text and ">100<" in page.text
    # the current project is the new one; /dashboard opens it
    assert b.get("/dashboard").headers["location"] == f"/dashboard/projects/{second}/agents"
    taken = b.post("/dashboard/projects", {"name": "second"})
    assert taken.status_code == 400 and "already exists" in taken.text
    bad = b.post("/dashboard/projects", {"name": "no spaces!"})
    assert bad.status_code == 400 and "invalid project name" in bad.text
    assert 'value="no spaces!"' in bad.text  # the value is kept
    assert len(b.get("/dashboard/projects").text.split("<tr>")) == 4  # header + 2 projects
    # rename, and a taken name is the settings page with the problem
    renamed = b.post(f"/dashboard/projects/{second}/rename", {"name": "renamed"})
    assert renamed.status_code == 303
    assert "renamed" in b.get(f"/dashboard/projects/{second}/settings").text
    clash = b.post(f"/dashboard/projects/{second}/rename", {"name": "alice"})
    assert clash.status_code == 400 and "already exists" in clash.text
    # the header's selector
    chosen = b.post("/dashboard/select", {"project_id": b.project_id})
    assert chosen.status_code == 303 and chosen.headers["location"] == f"{b.p}/agents"
    assert b.get("/dashboard").headers["location"] == f"{b.p}/agents"
    assert b.post("/dashboard/select", {"project_id": "proj_nothere"}).status_code == 404


# --------------------------------------------------------------------------- keys


def test_a_key_is_shown_once_works_against_the_api_and_is_revoked(alice: Browser) -> None:
    b = alice
    client = b.client
    key = new_key(b)
    settings = b.get(f"{b.p}/settings")
    assert key[:12] in settings.text and key not in settings.text and "backend" in settings.text
    for url in (f"{b.p}/agents", f"{b.p}/usage", f"{b.p}/sessions", "/dashboard/projects"):
        assert key not in b.get(url).text
    stored = db(b.app).read(lambda c: list(c.execute(select(api_keys))))
    assert all(key not in str(tuple(row)) for row in stored)  # only its hash and prefix
    assert client.get("/api/agents", headers=auth(key)).status_code == 200
    (row,) = stored
    revoked = b.post(f"{b.p}/keys/{row.id}/revoke")
    assert revoked.status_code == 303
    assert "revoked" in b.get(f"{b.p}/settings").text
    assert client.get("/api/agents", headers=auth(key)).status_code == 401


def test_a_key_of_another_project_is_not_revoked_through_this_projects_url(
    alice: Browser,
) -> None:
    b = alice
    other = b.post("/dashboard/projects", {"name": "other"}).headers["location"].split("/")[3]
    key = new_key(b)
    (row,) = db(b.app).read(lambda c: list(c.execute(select(api_keys))))
    r = b.post(f"/dashboard/projects/{other}/keys/{row.id}/revoke")
    assert r.status_code == 404
    assert b.client.get("/api/agents", headers=auth(key)).status_code == 200
    # nor by its prefix, nor a made-up id
    assert b.post(f"{b.p}/keys/{row.prefix}/revoke").status_code == 404
    assert b.post(f"{b.p}/keys/key_000000000000/revoke").status_code == 404
    assert b.client.get("/api/agents", headers=auth(key)).status_code == 200


# --------------------------------------------------------------------------- agents


def test_the_new_agent_form_adds_tool_rows_without_javascript_and_keeps_values(
    alice: Browser,
) -> None:
    b = alice
    form = b.get(f"{b.p}/agents/new")
    assert form.status_code == 200
    assert form.text.count('<label for="tool-') == 3 * 4  # name, description, params, disabled
    for field in ("agent-name", "agent-description", "tool-2-params"):
        assert f'<label for="{field}">' in form.text and f'id="{field}"' in form.text
    more = b.post(f"{b.p}/agents", {**AGENT, "action": "add_tool"})
    assert more.status_code == 200 and 'id="tool-3-name"' in more.text
    assert 'name="rows" value="4"' in more.text and 'value="execute_sql"' in more.text
    assert count(b.app, custom_agents) == 0
    bad = b.post(f"{b.p}/agents", {**AGENT, "tool-1-name": "bad name"})
    assert bad.status_code == 400 and "tool 2: Tool Name" in bad.text
    assert 'value="bad name"' in bad.text and "Database Assistant" in bad.text
    dup = b.post(f"{b.p}/agents", {**AGENT, "tool-1-name": "execute_sql"})
    assert dup.status_code == 400 and "unique" in dup.text
    nameless = b.post(f"{b.p}/agents", {**AGENT, "name": ""})
    assert nameless.status_code == 400 and "Agent Name" in nameless.text
    assert count(b.app, custom_agents) == 0


def test_a_custom_agent_made_in_the_dashboard_runs_through_the_api(alice: Browser) -> None:
    b = alice
    key = new_key(b)
    h = auth(key)
    agent_id = new_agent(b)
    page = b.get(f"{b.p}/agents/{agent_id}")
    assert page.status_code == 200
    assert f'<code class="id" id="agent-id">{agent_id}</code>' in page.text
    assert 'data-copy="#agent-id"' in page.text and "Copy ID" in page.text
    assert "saved" in page.text  # the notice after the redirect
    listed = b.get(f"{b.p}/agents")
    assert agent_id in listed.text and "execute_sql" in listed.text and "Copy ID" in listed.text
    api = b.client.get(f"/api/customagents/{agent_id}", headers=h).json()
    assert [t["name"] for t in api["tools"]] == ["execute_sql", "summarize"]
    assert api["tools"][0]["params"] == ["sql_query", "limit"]
    run = b.client.post(
        "/api/customagents/run", json={"agentId": agent_id, "input": "top users"}, headers=h
    )
    assert run.status_code == 200, run.text
    assert set(tools_of(run.json()["response"])) <= {"execute_sql", "summarize"}
    # disable a tool: the API sees it, the model is never offered it
    toggled = b.post(f"{b.p}/agents/{agent_id}/tools/execute_sql/toggle")
    assert toggled.status_code == 303
    api = b.client.get(f"/api/customagents/{agent_id}", headers=h).json()
    assert [t["disabled"] for t in api["tools"]] == [True, False]
    run = b.client.post(
        "/api/customagents/run", json={"agentId": agent_id, "input": "again"}, headers=h
    )
    assert tools_of(run.json()["response"]) == ["summarize"]
    assert b.post(f"{b.p}/agents/{agent_id}/tools/nosuch/toggle").status_code == 404
    assert b.post(f"{b.p}/agents/{agent_id}/tools/execute_sql/toggle").status_code == 303
    # edit: rename, drop a tool (its row emptied)
    edited = b.post(
        f"{b.p}/agents/{agent_id}",
        {**AGENT, "name": "DB", "tool-1-name": "", "tool-1-description": "", "tool-1-params": ""},
    )
    assert edited.status_code == 303
    api = b.client.get(f"/api/customagents/{agent_id}", headers=h).json()
    assert api["name"] == "DB" and [t["name"] for t in api["tools"]] == ["execute_sql"]
    # delete, with a confirm step
    confirm = b.get(f"{b.p}/agents/{agent_id}/delete")
    assert confirm.status_code == 200 and "cannot be undone" in confirm.text
    gone = b.post(f"{b.p}/agents/{agent_id}/delete")
    assert gone.status_code == 303 and gone.headers["location"] == f"{b.p}/agents"
    assert b.client.get(f"/api/customagents/{agent_id}", headers=h).status_code == 404
    assert b.get(f"{b.p}/agents/{agent_id}").status_code == 404
    assert b.post(f"{b.p}/agents/{agent_id}/delete").status_code == 404


# --------------------------------------------------------------------------- usage, sessions


def test_usage_shows_the_balance_each_runs_tokens_and_charge_and_the_chart(
    alice: Browser,
) -> None:
    b = alice
    key = new_key(b)
    run = b.client.post("/api/agents/coding", json={"input": "make a file"}, headers=auth(key))
    assert run.status_code == 200, run.text
    body = run.json()
    page = b.get(f"{b.p}/usage")
    assert page.status_code == 200
    html = page.text
    assert body["runId"] in html and body["sessionId"] in html
    row = html.split(f"<code>{body['runId']}</code>", 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert cells[:2] == [str(body["usage"]["input"]), str(body["usage"]["output"])]
    assert cells[2] == f"{body['cost']:g}"
    balance = re.search(r'<p class="balance" id="balance">([^ ]+) ', html)
    assert balance and float(balance.group(1)) == pytest.approx(body["creditsRemaining"])
    assert "<svg" in html and 'role="img"' in html and "<title" in html
    assert 'id="spend-table"' in html and ">settle<" in html and ">grant<" in html


def test_sessions_list_and_the_timeline_of_a_run(alice: Browser) -> None:
    b = alice
    key = new_key(b)
    run = b.client.post(
        "/api/agents/coding", json={"input": "Create <b>src/app.py</b>"}, headers=auth(key)
    ).json()
    sid = run["sessionId"]
    listed = b.get(f"{b.p}/sessions")
    assert sid in listed.text and "coding" in listed.text and "completed" in listed.text
    page = b.get(f"{b.p}/sessions/{sid}")
    assert page.status_code == 200
    html = page.text
    assert "Create &lt;b&gt;src/app.py&lt;/b&gt;" in html  # the user input, escaped
    assert 'data-kind="user"' in html and 'data-kind="assistant"' in html
    kml_start = run["response"].split("\n", 1)[0]
    assert kml_start.replace("<", "&lt;").replace(">", "&gt;") in html  # the model's KML
    assert "&lt;kyronix&gt;" in html and "<kyronix>" not in html
    for exec_id in run["executionIds"]:
        assert exec_id in html
    assert re.search(r"seq \d+", html)
    # the raw log, exactly the kiso log's lines
    log = b.get(f"{b.p}/sessions/{sid}/log.jsonl")
    assert log.status_code == 200 and "attachment" in log.headers["content-disposition"]
    assert log.content == raw_log(b.app, sid)
    first = json.loads(log.content.splitlines()[0])
    assert first["type"] == "session" and first["id"] == sid


def raw_log(app: Any, sid: str) -> bytes:
    """The session's log as the SQL store holds it: its header line and each event's line."""

    def load(c: Any) -> bytes:
        header = c.execute(
            text("select header from kiso_sessions where id = :s"), {"s": sid}
        ).scalar_one()
        lines = c.execute(
            text("select line from kiso_events where session_id = :s order by seq"), {"s": sid}
        ).scalars()
        return "".join(f"{x}\n" for x in [header, *lines]).encode()

    result: bytes = db(app).read(load)
    return result


def written_session(b: Browser) -> tuple[str, str, str]:
    """A session of b's project whose log has every kind of event: a server-driven tool call
    with its receipt, an uncertain one and its ruling, an approval, a compaction, an executer's
    results. Returns (session id, the receipt's executionId, the uncertain one's)."""
    state = b.app.state.kx
    sid = "sess_" + secrets.token_hex(12)
    done, doubtful = "exec_" + "a" * 32, "exec_" + "b" * 32
    state.db.write(
        lambda c: c.execute(
            sessions.insert().values(
                id=sid, project_id=b.project_id, agent="coding", created_at=now_ms()
            )
        )
    )
    state.db.write(
        lambda c: c.execute(
            executions.insert().values(
                id=done,
                project_id=b.project_id,
                session_id=sid,
                run_id="run_abcdef",
                created_at=now_ms(),
            )
        )
    )
    writer = state.store.create("/tmp", session_id=sid)
    run = "r1"
    result = {"success": True, "output": "wrote 12 bytes", "executionId": done}
    entry = {"tool": "write_file", "args": {"path": "a.py"}, "result": result}
    try:
        writer.append(
            RunStarted(run=run, trigger="api", model=ModelRef("kyronix", "x"), mode="tunnel"),
            User(run=run, content="write a.py please"),
            Assistant(
                run=run,
                blocks=(
                    TextBlock("<kyronix><plan>write it</plan></kyronix>"),
                    ToolCall("c1", "write_file", {"path": "a.py"}),
                    ToolCall("c2", "run_command", {"command": "make"}),
                ),
                stop="tool_use", usage=Usage(input=11, output=7), model="scripted", ms=5,
            ),
            ApprovalRequested(
                run=run, call_id="c2", name="run_command", input={"command": "make"},
                speaker="policy",
            ),
            ApprovalDecided(
                run=run, call_id="c2", decision="approved", decided_by="alice", reason="fine",
                input_sha256="0" * 64,
            ),
            ExecutionStarted(
                run=run, execution_id="x1", call_id="c1", name="write_file",
                input={"path": "a.py"},
            ),
            ExecutionFinished(
                run=run, execution_id="x1", call_id="c1", ok=True, content=json.dumps(entry),
                is_error=False, ms=3,
            ),
            ExecutionStarted(
                run=run, execution_id="x2", call_id="c2", name="run_command",
                input={"command": "make"},
            ),
            ExecutionResolved(
                run=run, execution_id="x2", call_id="c2", resolution="skipped",
                decided_by="bob-the-operator",
            ),
            SettingChanged(
                key="kyronix.results", run=run,
                value={"requestId": "req_1", "results": [
                    {"tool": "run_command",
                     "result": {"success": False, "uncertain": True, "executionId": doubtful}}]},
            ),
            Compacted(
                run=run, covers_to_seq=3, summary="they wrote a.py", trigger="auto",
                tokens_before=900, tokens_after=100,
            ),
            RunEnded(run=run, outcome=Outcome("completed")),
        )  # fmt: skip
    finally:
        writer.close()
    return sid, done, doubtful


def test_the_timeline_shows_tool_calls_receipts_uncertain_rulings_and_the_raw_log(
    alice: Browser,
) -> None:
    b = alice
    sid, done, doubtful = written_session(b)
    html = b.get(f"{b.p}/sessions/{sid}").text
    for kind in (
        "user", "assistant", "approval_requested", "approval_decided", "tool_call", "receipt",
        "resolved", "results", "compacted", "run_started", "run_ended",
    ):  # fmt: skip
        assert f'data-kind="{kind}"' in html, kind
    receipt = html.split('data-kind="receipt"', 1)[1].split("</li>", 1)[0]
    assert done in receipt and "wrote 12 bytes" in receipt and "run_abcdef" in receipt
    ruled = html.split('data-kind="resolved"', 1)[1].split("</li>", 1)[0]
    assert "bob-the-operator" in ruled and "skipped" in ruled
    assert doubtful in html and "uncertain" in html
    assert "they wrote a.py" in html and "write a.py please" in html
    assert "&lt;kyronix&gt;&lt;plan&gt;write it" in html
    log = b.get(f"{b.p}/sessions/{sid}/log.jsonl")
    assert log.content == raw_log(b.app, sid)
    assert len(log.content.splitlines()) == 13


# --------------------------------------------------------------------------- refusals


def project_routes(p: str, agent_id: str, key_id: str, sid: str) -> list[tuple[str, str]]:
    return [
        ("GET", p), ("GET", f"{p}/settings"), ("GET", f"{p}/agents"),
        ("GET", f"{p}/agents/new"), ("GET", f"{p}/agents/{agent_id}"),
        ("GET", f"{p}/agents/{agent_id}/delete"), ("GET", f"{p}/usage"),
        ("GET", f"{p}/sessions"), ("GET", f"{p}/sessions/{sid}"),
        ("GET", f"{p}/sessions/{sid}/log.jsonl"),
        ("POST", f"{p}/rename"), ("POST", f"{p}/keys"), ("POST", f"{p}/keys/{key_id}/revoke"),
        ("POST", f"{p}/agents"), ("POST", f"{p}/agents/{agent_id}"),
        ("POST", f"{p}/agents/{agent_id}/tools/execute_sql/toggle"),
        ("POST", f"{p}/agents/{agent_id}/delete"),
    ]  # fmt: skip


def snapshot(app: Any) -> Any:
    def load(c: Any) -> Any:
        return (
            [tuple(r) for r in c.execute(select(projects).order_by(projects.c.id))],
            [tuple(r) for r in c.execute(select(api_keys).order_by(api_keys.c.id))],
            [tuple(r) for r in c.execute(select(custom_agents).order_by(custom_agents.c.id))],
        )

    return db(app).read(load)


def test_every_post_without_the_csrf_token_is_403_and_changes_nothing(alice: Browser) -> None:
    b = alice
    new_key(b)
    agent_id = new_agent(b)
    (key,) = db(b.app).read(lambda c: list(c.execute(select(api_keys))))
    sid, _, _ = written_session(b)
    before = snapshot(b.app)
    posts = [u for m, u in project_routes(b.p, agent_id, key.id, sid) if m == "POST"]
    posts += ["/dashboard/projects", "/dashboard/select"]
    form = {**AGENT, "name": "changed", "project_id": b.project_id}
    for url in posts:
        r = b.post(url, form, csrf=False)
        assert r.status_code == 403, url
        assert "CSRF" in r.text and "Traceback" not in r.text
        wrong = b.post(url, {**form, "csrf": "x" * 43}, csrf=False)
        assert wrong.status_code == 403, url
    assert snapshot(b.app) == before


def test_another_users_project_is_404_on_every_route(make_client: Any) -> None:
    client, app = make_client()
    a = Browser(client, app, "alice")
    new_key(a)
    agent_id = new_agent(a)
    (key,) = db(app).read(lambda c: list(c.execute(select(api_keys))))
    sid, _, _ = written_session(a)
    bob = Browser(client, app, "bob")
    before = snapshot(app)
    for method, url in project_routes(a.p, agent_id, key.id, sid):
        r = bob.get(url) if method == "GET" else bob.post(url, {**AGENT, "name": "mine"})
        assert r.status_code == 404, (method, url)
        assert "Traceback" not in r.text and agent_id not in r.text
    assert bob.post("/dashboard/select", {"project_id": a.project_id}).status_code == 404
    assert snapshot(app) == before
    # alice's session or agent through bob's own project: 404 too
    for url in (
        f"{bob.p}/sessions/{sid}", f"{bob.p}/sessions/{sid}/log.jsonl",
        f"{bob.p}/agents/{agent_id}",
    ):  # fmt: skip
        assert bob.get(url).status_code == 404, url
    assert bob.post(f"{bob.p}/keys/{key.id}/revoke").status_code == 404
    assert bob.post(f"{bob.p}/agents/{agent_id}/delete").status_code == 404
    assert snapshot(app) == before
    assert "alice" not in bob.get("/dashboard/projects").text.split("Signed in as")[1]


def test_names_are_escaped_everywhere(alice: Browser) -> None:
    b = alice
    evil = "<script>alert(1)</script>"
    key = new_key(b, name=evil)
    agent_id = new_agent(b, name=evil, description=evil)
    run = b.client.post(
        "/api/customagents/run", json={"agentId": agent_id, "input": evil}, headers=auth(key)
    ).json()
    pages = [
        f"{b.p}/agents", f"{b.p}/agents/{agent_id}", f"{b.p}/agents/{agent_id}/delete",
        f"{b.p}/settings", f"{b.p}/usage", f"{b.p}/sessions", f"{b.p}/sessions/{run['sessionId']}",
    ]  # fmt: skip
    for url in pages:
        html = b.get(url).text
        assert evil not in html, url
        assert "<script>alert" not in html, url
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in b.get(f"{b.p}/agents").text
    bad = b.post(f"{b.p}/agents", {**AGENT, "name": evil, "tool-0-name": evil})
    assert bad.status_code == 400 and evil not in bad.text


def test_an_unexpected_failure_is_a_500_page_without_a_trace(
    alice: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kyronix.server import custom_agents as module

    def broken(*_: Any) -> Any:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(module, "list_agents", broken)
    r = alice.get(f"{alice.p}/agents")
    assert r.status_code == 500
    assert "secret detail" not in r.text and "Traceback" not in r.text


def test_a_form_that_cannot_be_read_is_a_400_page_and_changes_nothing(alice: Browser) -> None:
    b = alice
    before = count(b.app, projects)
    junk = {f"f{n}": "x" for n in range(1_200)}  # more fields than any dashboard form has
    r = b.post("/dashboard/projects", {"name": "many", **junk})
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    assert "could not be read" in r.text and "Traceback" not in r.text
    b._use()
    r = b.client.post(
        "/dashboard/projects",
        content=b"--x\r\n",
        headers={"content-type": "multipart/form-data"},  # no boundary
        follow_redirects=False,
    )
    assert r.status_code == 400 and "could not be read" in r.text
    r = b.client.post(
        "/dashboard/projects",
        content=b"name=" + b"a" * (2 << 20),
        headers={"content-type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert r.status_code == 413 and r.headers["content-type"].startswith("text/html")
    assert "over the limit" in r.text and "HTTP 413" in r.text
    assert count(b.app, projects) == before
    api = b.client.post("/api/agents/coding", content=b"x" * (2 << 20))
    assert api.status_code == 401  # no key: refused before a byte of the body is read
    _, key = project_with_key(b.app, "api-limit")
    api = b.client.post("/api/agents/coding", content=b"x" * (2 << 20), headers=auth(key))
    assert api.status_code == 413 and api.json()["error"]["code"] == "payload_too_large"
