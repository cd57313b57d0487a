"""The sync client against a real ``kyronix serve``: runs, sessions, errors, retries.

Retries are proven on the wire: a loopback proxy between the client and the server loses a
response after the server answered it, answers 5xx/429 in the server's place, and records every
request; the server's database then shows what was charged.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from kyronix import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    ConflictError,
    InsufficientCreditsError,
    Kyronix,
    KyronixUsageError,
    NotFoundError,
    ProjectNotFoundError,
    RateLimitError,
    RunResponse,
    Session,
    kml,
)
from tests.kyronix.server.helpers import auth

from .conftest import Served, start
from .proxy import Answer, Drop, Pass, Proxy, Request

pytestmark = pytest.mark.timeout(120)


def client(served: Served, url: str | None = None, **kw: object) -> Kyronix:
    return Kyronix(api_key=served.key, base_url=url or served.url, **kw)  # type: ignore[arg-type]


def error_body(code: str, message: str = "injected") -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "details": {}}}).encode()


# --------------------------------------------------------------------------- runs


def test_run_returns_the_servers_result(server: Served) -> None:
    with client(server) as kx:
        before = kx.run(input="Create src/hello.py")
        got = kx.run(agent="database", input="Write a Postgres migration for users")
    assert isinstance(got, RunResponse)
    plan = kml.parse(got.response)
    assert [t.execution_id for t in plan.tools] == got.execution_ids and got.execution_ids
    assert got.cost == 0.5 and got.credits_remaining == before.credits_remaining - 0.5
    assert got.usage.input > 0 and got.usage.output > 0
    assert re.fullmatch(r"run_\w+", got.run_id) and re.fullmatch(r"sess_\w+", got.session_id)
    assert got.results is None and got.raw["runId"] == got.run_id
    assert (got.run_id, "completed") in [(r[0], r[1]) for r in server.runs()]
    assert server.ledger(got.run_id)[-1] == ("settle", -500, got.run_id)


def test_every_run_request_carries_its_own_idempotency_key(server: Served) -> None:
    with Proxy(server.url) as proxy, client(server, proxy.url, project_id=server.project) as kx:
        kx.run(input="one")
        kx.run(input="two", project_id=server.project)
    keys = [r.headers["idempotency-key"] for r in proxy.requests]
    assert len(keys) == 2 and len(set(keys)) == 2
    assert all(re.fullmatch(r"idem_[0-9a-f]{32}", k) for k in keys)
    sent = [json.loads(r.body) for r in proxy.requests]
    assert sent == [
        {"input": "one", "projectId": server.project},
        {"input": "two", "projectId": server.project},
    ]
    assert all(r.headers["authorization"] == f"Bearer {server.key}" for r in proxy.requests)
    assert [r[2] for r in server.runs()][-2:] == keys


def test_a_response_lost_after_the_server_answered_is_retried_and_charged_once(
    server: Served,
) -> None:
    """The proxy lets the first request through, reads the server's whole answer (the run is
    done and settled), and drops the connection. The retry carries the same Idempotency-Key:
    the server replays the first result and the ledger has one settle."""
    settles_before = [r for r in server.ledger() if r[0] == "settle"]
    runs_before = len(server.runs())

    def plan(index: int, _request: Request) -> Drop | Pass:
        return Drop() if index == 0 else Pass()

    with Proxy(server.url, plan) as proxy, client(server, proxy.url) as kx:
        got = kx.run(input="Create src/once.py")
    first, retry = proxy.requests
    assert first.headers["idempotency-key"] == retry.headers["idempotency-key"]
    assert first.body == retry.body
    lost, replayed = proxy.responses
    assert lost.status == 200 and json.loads(lost.body)["runId"] == got.run_id  # answered...
    assert replayed.headers.get("idempotent-replayed") == "true"  # ...and replayed
    assert json.loads(replayed.body) == json.loads(lost.body)
    assert len(server.runs()) == runs_before + 1
    settles = [r for r in server.ledger() if r[0] == "settle"]
    assert settles == [*settles_before, ("settle", -500, got.run_id)]


def test_5xx_and_connection_drops_are_retried_with_the_same_key(server: Served) -> None:
    def plan(index: int, _request: Request) -> Answer | Pass:
        if index == 0:
            return Answer(503, error_body("draining", "the server is shutting down"))
        if index == 1:
            return Answer(502, b"<html>Bad Gateway</html>", {"content-type": "text/html"})
        return Pass()

    with Proxy(server.url, plan) as proxy, client(server, proxy.url) as kx:
        got = kx.run(input="Create src/retry.py")
    assert len(proxy.requests) == 3
    assert len({r.headers["idempotency-key"] for r in proxy.requests}) == 1
    assert [r.status for r in proxy.responses] == [503, 502, 200]
    assert server.ledger(got.run_id)[-1][0] == "settle"


def test_5xx_after_every_retry_is_an_api_error(server: Served) -> None:
    def plan(_index: int, _request: Request) -> Answer:
        return Answer(500, error_body("internal_error", "a bug"))

    with (
        Proxy(server.url, plan) as proxy,
        client(server, proxy.url, max_retries=2) as kx,
        pytest.raises(APIError) as info,
    ):
        kx.run(input="x")
    assert (info.value.status_code, info.value.code, info.value.message) == (
        500,
        "internal_error",
        "a bug",
    )
    assert len(proxy.requests) == 3  # the first and two retries
    assert len({r.headers["idempotency-key"] for r in proxy.requests}) == 1


def test_a_failed_runs_recorded_error_is_not_retried(server: Served) -> None:
    def plan(_index: int, _request: Request) -> Answer:
        return Answer(502, error_body("model_error", "the model failed"))

    with (
        Proxy(server.url, plan) as proxy,
        client(server, proxy.url) as kx,
        pytest.raises(APIError) as info,
    ):
        kx.run(input="x")
    assert info.value.code == "model_error" and len(proxy.requests) == 1


def test_a_429_waits_its_retry_after_then_goes_again(server: Served) -> None:
    def plan(index: int, _request: Request) -> Answer | Pass:
        if index == 0:
            return Answer(429, error_body("rate_limited"), {"retry-after": "0"})
        return Pass()

    with Proxy(server.url, plan) as proxy, client(server, proxy.url) as kx:
        kx.run(input="x")
    assert [r.status for r in proxy.responses] == [429, 200]


def test_the_real_rate_limit_is_a_rate_limit_error_with_retry_after(tmp_path: Path) -> None:
    # One token, refilled every 5 s: the second run is refused unless the machine stalls for
    # 5 s between two requests (at one a second, a busy machine did refill it in time).
    for served in start(tmp_path / "home", {"rateLimit": {"perMinute": 12, "burst": 1}}):
        with Proxy(served.url) as proxy, client(served, proxy.url) as kx:
            kx.run(input="first")  # the bucket's one token
            kx.run(input="second")  # 429 Retry-After: 5, waited, then served
            assert [r.status for r in proxy.responses] == [200, 429, 200]
            assert 1 <= int(proxy.responses[1].headers["retry-after"]) <= 5
        with client(served, max_retries=0) as impatient, pytest.raises(RateLimitError) as info:
            impatient.run(input="third")
        err = info.value
        assert (err.status_code, err.code) == (429, "rate_limited")
        assert err.retry_after is not None and err.retry_after >= 1
        assert "slow down" in err.message


# --------------------------------------------------------------------------- errors


def test_the_servers_errors_are_the_documented_exceptions(server: Served) -> None:
    with (
        Kyronix(api_key="kyr_" + "x" * 43, base_url=server.url) as bad,
        pytest.raises(AuthenticationError) as unauthorized,
    ):
        bad.run(input="x")
    assert (unauthorized.value.status_code, unauthorized.value.code) == (401, "invalid_api_key")
    with client(server) as kx:
        with pytest.raises(ProjectNotFoundError) as project:
            kx.run(input="x", project_id="proj_nothere1")
        assert project.value.code == "project_not_found" and "proj_nothere1" in str(project.value)
        with pytest.raises(NotFoundError) as agent:
            kx.run(agent="poetry", input="x")
        assert agent.value.code == "agent_not_found"
        assert agent.value.details["agents"] == ["coding", "research", "database", "sales"]
        assert not isinstance(agent.value, ProjectNotFoundError)
        with pytest.raises(NotFoundError) as session:
            kx.run(input="x", session_id="sess_nothere1")
        assert session.value.code == "session_not_found"
        with pytest.raises(APIError) as invalid:
            kx.run(input="x", session_id="not-a-session")
        assert (invalid.value.status_code, invalid.value.code) == (400, "invalid_request")


def test_no_credits_is_insufficient_credits_with_the_numbers(tmp_path: Path) -> None:
    for served in start(tmp_path / "home", {"initialCredits": 0}):
        with client(served) as kx, pytest.raises(InsufficientCreditsError) as info:
            kx.run(input="x")
        err = info.value
        assert (err.status_code, err.code) == (402, "insufficient_credits")
        assert err.details == {"required": 0.5, "available": 0.0, "held": 0.0}
        assert served.ledger() == []  # refused before anything: nothing held, nothing charged


def test_a_busy_session_is_a_conflict(tmp_path: Path) -> None:
    for served in start(tmp_path / "home", KYRONIX_SCRIPTED_DELAY_MS="3000"):
        with client(served) as kx:
            session = kx.create_session()
            stream = kx.stream(input="a long one", session_id=session.id)
            with stream, pytest.raises(ConflictError) as info:
                kx.run(input="meanwhile", session_id=session.id)
            assert (info.value.status_code, info.value.code) == (409, "session_busy")
            assert info.value.details["sessionId"] == session.id


def test_an_unreachable_server_is_a_connection_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    with (
        Kyronix(api_key="kyr_x", base_url=f"http://127.0.0.1:{port}", max_retries=1) as kx,
        pytest.raises(APIConnectionError) as info,
    ):
        kx.run(input="x")
    err = info.value
    assert err.code == "connection_error" and not isinstance(err, APITimeoutError)
    assert f"127.0.0.1:{port}" in err.message and "tried 2 times" in err.message
    assert isinstance(err.__cause__, httpx2.ConnectError)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A socket that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()
    for sock in accepted:
        sock.close()


def test_no_answer_in_time_is_a_timeout_error(silent_server: str) -> None:
    with (
        Kyronix(api_key="kyr_x", base_url=silent_server, timeout=0.3, max_retries=1) as kx,
        pytest.raises(APITimeoutError) as info,
    ):
        kx.run(input="x")
    assert info.value.code == "timeout" and "within 0.3 s" in info.value.message
    with (
        Kyronix(api_key="kyr_x", base_url=silent_server, max_retries=0) as kx,
        pytest.raises(APITimeoutError),
    ):
        kx.run(input="x", timeout=0.2)  # the call's own timeout


def test_misuse_raises_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KyronixUsageError, match="KYRONIX_API_KEY"):
        Kyronix()
    monkeypatch.setenv("KYRONIX_API_KEY", "kyr_fromenv")
    monkeypatch.setenv("KYRONIX_BASE_URL", "http://127.0.0.1:1/")
    with Kyronix() as kx:
        assert kx.base_url == "http://127.0.0.1:1"
        with pytest.raises(KyronixUsageError, match="input"):
            kx.run(input="   ")
    kx = Kyronix()
    kx.close()
    kx.close()  # idempotent
    with pytest.raises(KyronixUsageError, match="closed"):
        kx.run(input="x")


# --------------------------------------------------------------------------- sessions, agents


def test_a_session_keeps_the_conversation(server: Served) -> None:
    with Proxy(server.url) as proxy, client(server, proxy.url) as kx:
        session = kx.create_session(agent="database")
        assert isinstance(session, Session) and session.get_id() == session.id
        one = session.send("Create a migration for users")
        two = session.send("Add an index on email")
        history = session.get_history()
        messages = session.get_messages()
    assert one.session_id == two.session_id == session.id
    assert history["id"] == session.id and history["agentId"] == "database"
    assert [(m["role"], m.get("runId")) for m in messages] == [
        ("user", None),
        ("assistant", one.run_id),
        ("user", None),
        ("assistant", two.run_id),
    ]
    assert messages[2]["content"] == "Add an index on email"
    assert messages[3]["content"] == two.response
    paths = [(r.method, r.path) for r in proxy.requests]
    assert paths == [
        ("POST", "/api/sessions"),
        ("POST", "/api/agents/database"),
        ("POST", "/api/agents/database"),
        ("GET", f"/api/sessions/{session.id}"),
        ("GET", f"/api/sessions/{session.id}"),
    ]
    assert json.loads(proxy.requests[2].body) == {
        "input": "Add an index on email",
        "sessionId": session.id,
    }


def _custom_agent(served: Served) -> str:
    made = httpx2.post(
        f"{served.url}/api/customagents",
        headers=auth(served.key),
        json={"name": "notes", "tools": [{"name": "note", "params": ["text"]}]},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    agent_id: str = made.json()["id"]
    return agent_id


def test_custom_agents_run_and_hold_sessions(server: Served) -> None:
    agent_id = _custom_agent(server)
    with Proxy(server.url) as proxy, client(server, proxy.url) as kx:
        once = kx.run_custom_agent(agent_id, "Write a note")
        session = kx.create_session(custom_agent_id=agent_id)
        turn = session.send("and another")
        plain = kx.session(session.id)  # an existing session by id: no request
        assert plain.get_messages()[-1]["runId"] == turn.run_id
    assert [t.name for t in kml.parse(once.response).tools] == ["note"]
    assert [t.name for t in kml.parse(turn.response).tools] == ["note"]
    assert turn.session_id == session.id
    posts = [(r.path, json.loads(r.body)) for r in proxy.requests if r.method == "POST"]
    assert posts == [
        ("/api/customagents/run", {"agentId": agent_id, "input": "Write a note"}),
        ("/api/sessions", {"agent": "coding", "customAgentId": agent_id}),
        (
            "/api/customagents/run",
            {"agentId": agent_id, "input": "and another", "sessionId": session.id},
        ),
    ]
