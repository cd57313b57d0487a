"""A key sees only its own project: every route, given another project's ids, answers 404 and
says nothing about what it holds."""

from __future__ import annotations

import json
from typing import Any

from .helpers import auth, project_with_key


def test_every_route_with_a_second_projects_key_is_404_and_leaks_nothing(make_client: Any) -> None:
    client, app = make_client()
    project_a, key_a = project_with_key(app, "alpha")
    _, key_b = project_with_key(app, "beta")
    a = auth(key_a)
    agent = client.post(
        "/api/customagents",
        json={"name": "Secret Agent", "description": "alpha's own", "tools": [
            {"name": "secret_tool", "description": "alpha only", "params": ["q"]}]},
        headers=a,
    ).json()  # fmt: skip
    run = client.post(
        "/api/agents/coding", json={"input": "alpha's private prompt"}, headers=a
    ).json()
    sid, run_id, aid = run["sessionId"], run["runId"], agent["id"]
    secrets = [sid, run_id, aid, project_a, "Secret Agent", "alpha's private prompt", "secret_tool"]

    routes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", f"/api/sessions/{sid}", None),
        ("POST", f"/api/sessions/{sid}", None),
        ("POST", "/api/agents/coding", {"input": "x", "sessionId": sid}),
        ("POST", "/api/agents/coding/stream", {"input": "x", "sessionId": sid}),
        ("POST", "/api/agents/coding", {"input": "x", "customAgentId": aid}),
        ("POST", "/api/agents/coding", {"input": "x", "projectId": project_a}),
        ("POST", "/api/sessions", {"customAgentId": aid}),
        ("POST", "/api/sessions", {"projectId": project_a}),
        ("GET", f"/api/customagents/{aid}", None),
        ("PATCH", f"/api/customagents/{aid}", {"name": "stolen"}),
        ("DELETE", f"/api/customagents/{aid}", None),
        ("POST", "/api/customagents/run", {"agentId": aid, "input": "x"}),
        ("POST", "/api/customagents/run/stream", {"agentId": aid, "input": "x"}),
        ("POST", "/api/customagents/run", {"agentId": aid, "input": "x", "sessionId": sid}),
        ("GET", f"/api/runs/{run_id}", None),
        ("GET", f"/api/runs/{run_id}/stream", None),
    ]
    for method, path, body in routes:
        r = client.request(method, path, json=body, headers=auth(key_b))
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        assert set(r.json()) == {"error"}
        leaked = [s for s in secrets if s in r.text and s not in path and s not in json.dumps(body)]
        assert not leaked, (method, path, leaked)
    # the listings of the second project hold nothing of the first
    assert client.get("/api/customagents", headers=auth(key_b)).json() == []
    credits = client.get("/api/credits", headers=auth(key_b)).json()
    assert credits["credits"] == 100.0 and credits["projectId"] != project_a
    # and nothing of the first project changed
    assert client.get(f"/api/customagents/{aid}", headers=a).json() == agent
    assert client.get("/api/credits", headers=a).json()["credits"] == 99.5
    assert len(client.get(f"/api/sessions/{sid}", headers=a).json()["chat"]) == 2
