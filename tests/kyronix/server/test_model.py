"""A configured model, through kiso's provider adapters, against a local OpenAI-compatible SSE
server (the wire format of Chat Completions, driven through the official SDK)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kyronix import kml
from kyronix.server.agents import builtin_persona
from kyronix.server.models import kml_grammar
from tests.providers.sse import SSEServer
from tests.providers.test_openai_compat import api_error, chunk, sse, text_reply, usage_chunk

from .helpers import auth, project_with_key

GOOD = (
    "Sure, here it is:\n```xml\n<kyronix>\n  <plan>Write the file.</plan>\n"
    '  <tool name="write_file">\n    <path>a.py</path>\n    <content>\nprint(1)\n</content>\n'
    "  </tool>\n  <summary>Wrote a.py.</summary>\n</kyronix>\n```"
)
SNAPSHOT = "gpt-4o-2024-08-06"  # the stream names the model it ran: priced as gpt-4o
BAD = '<kyronix><plan>p</plan><tool name="launch_rockets"><when>now</when></tool></kyronix>'


def _configure(
    home: Path, url: str, monkeypatch: pytest.MonkeyPatch, model: str = "gpt-4o"
) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.json").write_text(
        json.dumps(
            {
                "model": "local",
                "models": {
                    "local": {
                        "kind": "openai-compat",
                        "model": model,
                        "baseUrl": url + "/v1",
                        "apiKeyEnv": "LOCAL_MODEL_KEY",
                    }
                },
            }
        )
    )
    monkeypatch.setenv("LOCAL_MODEL_KEY", "sk-local-test")


def test_a_configured_model_answers_through_kisos_adapter(
    make_client: Any, kx_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    priced = sse(
        chunk({"role": "assistant", "content": ""}, model=SNAPSHOT),
        *(chunk({"content": GOOD[i : i + 20]}, model=SNAPSHOT) for i in range(0, len(GOOD), 20)),
        chunk({}, "stop", model=SNAPSHOT),
        usage_chunk(100_000, 50_000),
    )
    with SSEServer([priced]) as server:
        _configure(kx_home, server.url, monkeypatch)
        client, app = make_client()
        _, key = project_with_key(app)
        r = client.post("/api/agents/coding", json={"input": "make a.py"}, headers=auth(key))
        assert r.status_code == 200, r.text
        body = r.json()
        plan = kml.parse(body["response"])
        assert [t.name for t in plan.tools] == ["write_file"]
        assert plan.tools[0].args["content"] == "print(1)\n"
        assert plan.status == "complete"  # the server completes the envelope
        # gpt-4o: 100k in x $2.50/M + 50k out x $10/M = $0.75; x 85 credits/$ x 1.5
        assert body["cost"] == pytest.approx(95.625)
        assert body["creditsRemaining"] == pytest.approx(100 - 95.625)
        assert body["usage"] == {"input": 100_000, "output": 50_000}
        (request,) = server.requests
        assert request.credential == "sk-local-test"
        sent = request.json
        assert sent["model"] == "gpt-4o"
        system = sent["messages"][0]
        assert system["role"] == "system" and "write_file" in system["content"]
        assert "navigate" not in system["content"]  # only the coding agent's tools
        assert sent["messages"][-1] == {"role": "user", "content": "make a.py"}


def test_a_bad_answer_is_sent_back_once_then_accepted(
    make_client: Any, kx_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SSEServer([text_reply(BAD), text_reply(GOOD)]) as server:
        _configure(kx_home, server.url, monkeypatch, model="local-model")
        client, app = make_client()
        _, key = project_with_key(app)
        r = client.post("/api/agents/coding", json={"input": "go"}, headers=auth(key))
        assert r.status_code == 200, r.text
        assert [t.name for t in kml.parse(r.json()["response"]).tools] == ["write_file"]
        assert r.json()["cost"] == 0.5  # an unpriced model costs the minimum
        correction = server.requests[1].json["messages"][-1]
        assert correction["role"] == "user"
        assert "launch_rockets" in correction["content"] and "not accepted" in correction["content"]
        chat = client.get(f"/api/sessions/{r.json()['sessionId']}", headers=auth(key)).json()[
            "chat"
        ]
        assert [m["role"] for m in chat] == ["user", "assistant"]  # the correction is not chat
        assert chat[1]["content"] == r.json()["response"]


def test_an_answer_still_bad_after_the_correction_is_an_error_and_costs_nothing(
    make_client: Any, kx_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SSEServer([text_reply(BAD), text_reply("no kml at all")]) as server:
        _configure(kx_home, server.url, monkeypatch, model="local-model")
        client, app = make_client()
        _, key = project_with_key(app)
        r = client.post("/api/agents/coding", json={"input": "go"}, headers=auth(key))
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "invalid_kml"
        assert r.json()["error"]["details"]["problems"]
        assert len(server.requests) == 2
        assert client.get("/api/credits", headers=auth(key)).json()["credits"] == 100.0


def test_a_provider_failure_is_502_model_error_and_releases_the_hold(
    make_client: Any, kx_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SSEServer([api_error(401, "bad key")]) as server:
        _configure(kx_home, server.url, monkeypatch, model="local-model")
        client, app = make_client()
        _, key = project_with_key(app)
        r = client.post("/api/agents/coding", json={"input": "go"}, headers=auth(key))
        assert r.status_code == 502 and r.json()["error"]["code"] == "model_error"
        assert "sk-local-test" not in r.text
        assert client.get("/api/credits", headers=auth(key)).json() == {
            "projectId": r.json()["error"]["details"].get("projectId", _pid(client, key)),
            "credits": 100.0,
            "held": 0.0,
        }


def _pid(client: Any, key: str) -> str:
    return str(client.get("/api/credits", headers=auth(key)).json()["projectId"])


def test_with_no_model_configured_an_openai_key_in_the_environment_is_not_used(
    make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-be-used")
    client, app = make_client()
    assert app.state.kx.runs.models.scripted
    _, key = project_with_key(app)
    assert (
        client.post("/api/agents/coding", json={"input": "x"}, headers=auth(key)).status_code == 200
    )


def test_the_kml_grammar_names_only_the_agents_tools() -> None:
    grammar = kml_grammar(builtin_persona("research"))
    assert '<tool name=\\"navigate\\">' in grammar
    assert "write_file" not in grammar and grammar.startswith("root ::=")
