"""The tunnel (``/ws``) through a real ``kyronix serve``, with raw WebSocket clients on each side:
authentication, the documented frames verbatim, errors, projects kept apart, pending requests
surviving dropped connections, and results recorded in the session that issued the plan."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from kyronix import kml

from .helpers import ServerProcess, auth, bootstrap


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str, str]]:
    """(server, project, key, another project's key)."""
    home = tmp_path / "home"
    project, key = bootstrap(home)
    _, other = bootstrap(home, "other")
    with ServerProcess(home) as srv:
        yield srv, project, key, other


def ws_url(srv: ServerProcess, query: str = "") -> str:
    return srv.url.replace("http://", "ws://") + "/ws" + (f"?{query}" if query else "")


def dial(
    srv: ServerProcess, key: str, role: str = "runtime", executer_id: str | None = None
) -> ClientConnection:
    query = f"role={role}" + (f"&executerId={executer_id}" if executer_id else "")
    ws = connect(ws_url(srv, query), additional_headers=auth(key), open_timeout=30).__enter__()
    ready = recv(ws)
    assert ready["type"] == "ready" and ready["role"] == role, ready
    return ws


def recv(ws: ClientConnection, timeout: float = 30) -> dict[str, Any]:
    frame = json.loads(ws.recv(timeout))
    assert isinstance(frame, dict)
    return frame


def send(ws: ClientConnection, frame: dict[str, Any]) -> None:
    ws.send(json.dumps(frame))


READ = '<tool name="read_file" executionId="exec_' + "a" * 32 + '"><path>package.json</path></tool>'


def answer(frame: dict[str, Any], output: str = "ok") -> dict[str, Any]:
    """What an executer would answer: one successful entry per tool, ids kept."""
    plan = kml.parse(frame["kmlResponse"])
    return {
        "type": "kml_result",
        "executionId": frame["executionId"],
        "results": [
            {"tool": t.name, "args": t.args,
             "result": {"success": True, "output": output, "executionId": t.execution_id}}
            for t in plan.tools
        ],
    }  # fmt: skip


# --------------------------------------------------------------------------- authentication


def test_a_bearer_header_or_an_auth_frame_authenticates_and_a_bad_key_is_4401(
    server: tuple[ServerProcess, str, str, str],
) -> None:
    srv, project, key, _ = server
    with dial(srv, key, "executer", "laptop") as ws:
        pass
    with connect(ws_url(srv), open_timeout=30) as ws:
        send(ws, {"type": "auth", "apiKey": key, "role": "executer", "executerId": "box"})
        ready = recv(ws)
        assert ready == {
            "type": "ready",
            "role": "executer",
            "projectId": project,
            "executerId": "box",
        }
    bad_key = "kyr_" + "A" * 43
    for how in ("header", "frame", "not-auth-first", "bad-role"):
        headers = auth(bad_key) if how == "header" else {}
        with connect(ws_url(srv), additional_headers=headers, open_timeout=30) as ws:
            if how == "frame":
                send(ws, {"type": "auth", "apiKey": bad_key, "role": "runtime"})
            elif how == "not-auth-first":
                send(ws, {"type": "ping"})
            elif how == "bad-role":
                send(ws, {"type": "auth", "apiKey": key, "role": "admin"})
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401, how


# --------------------------------------------------------------------------- the relay


def test_a_request_reaches_the_executer_verbatim_and_its_result_comes_back(
    server: tuple[ServerProcess, str, str, str],
) -> None:
    srv, _, key, _ = server
    with dial(srv, key, "executer") as ex, dial(srv, key) as rt:
        send(rt, {"type": "kml_request", "executionId": "req_1", "kmlResponse": READ})
        got = recv(ex)
        assert got == {"type": "kml_request", "executionId": "req_1", "kmlResponse": READ}
        progress = {"type": "kml_progress", "executionId": "req_1", "event": "tool_started",
                    "tool": "read_file", "toolExecutionId": "exec_" + "a" * 32}  # fmt: skip
        send(ex, progress)
        assert recv(rt) == progress
        result = answer(got)
        send(ex, result)
        assert recv(rt) == result


def test_errors_are_frames_and_the_connection_lives_on(
    server: tuple[ServerProcess, str, str, str],
) -> None:
    srv, _, key, _ = server
    with dial(srv, key) as rt:
        send(rt, {"type": "kml_request", "executionId": "req_2", "kmlResponse": READ})
        err = recv(rt)
        assert (
            err["type"] == "error"
            and err["code"] == "no_executer"
            and err["executionId"] == "req_2"
        )
        assert "kyronix executer" in err["message"]
        bad_frames = [
            "not json",
            "[1, 2]",
            '{"no": "type"}',
            '{"type": "nonsense"}',
            '{"type": "kml_request", "executionId": "bad id!", "kmlResponse": "x"}',
            '{"type": "kml_request", "executionId": "r", "kmlResponse": "x", "timeout": -1}',
        ]
        for bad in bad_frames:
            rt.send(bad)
            err = recv(rt)
            assert err["type"] == "error" and err["code"] == "bad_frame", (bad, err)
        send(rt, {"type": "kml_result", "executionId": "req_2", "results": []})
        assert recv(rt)["code"] == "forbidden"
        send(rt, {"type": "ping", "ts": 7})
        assert recv(rt) == {"type": "pong", "ts": 7}
    with dial(srv, key, "executer") as ex:
        send(ex, {"type": "kml_request", "executionId": "r", "kmlResponse": READ})
        assert recv(ex)["code"] == "forbidden"


def test_a_runtime_of_another_project_never_reaches_this_executer(
    server: tuple[ServerProcess, str, str, str],
) -> None:
    srv, _, key, other = server
    with dial(srv, key, "executer") as ex, dial(srv, other) as stranger:
        send(stranger, {"type": "kml_request", "executionId": "req_x", "kmlResponse": READ})
        err = recv(stranger)
        assert err["code"] == "no_executer"
        # and naming this project's executer id changes nothing
        send(stranger, {"type": "kml_request", "executionId": "req_y", "kmlResponse": READ,
                        "executerId": "default"})  # fmt: skip
        assert recv(stranger)["code"] == "no_executer"
        send(stranger, {"type": "resolve", "executionId": "exec_" + "a" * 32,
                        "resolution": "rerun"})  # fmt: skip
        assert recv(stranger)["code"] == "no_executer"
        with pytest.raises(TimeoutError):
            ex.recv(1)  # nothing of the stranger's ever arrived


def test_a_pending_request_is_sent_again_when_its_executer_reconnects(
    server: tuple[ServerProcess, str, str, str],
) -> None:
    srv, _, key, _ = server
    with dial(srv, key) as rt:
        ex = dial(srv, key, "executer", "laptop")
        send(rt, {"type": "kml_request", "executionId": "req_3", "kmlResponse": READ,
                  "executerId": "laptop"})  # fmt: skip
        first = recv(ex)
        ex.close()  # the connection drops mid-envelope; the request stays pending
        with dial(srv, key, "executer", "laptop") as again:
            resent = recv(again)
            assert resent == first  # the same frame, the same ids
            send(again, answer(resent, "after the reconnect"))
            result = recv(rt)
        assert result["executionId"] == "req_3"
        assert result["results"][0]["result"]["output"] == "after the reconnect"


def test_a_runtime_that_reconnects_and_sends_again_gets_the_kept_result(
    server: tuple[ServerProcess, str, str, str],
) -> None:
    srv, _, key, _ = server
    with dial(srv, key, "executer") as ex:
        rt = dial(srv, key)
        frame = {"type": "kml_request", "executionId": "req_4", "kmlResponse": READ}
        send(rt, frame)
        got = recv(ex)
        rt.close()  # the backend's connection drops; the run goes on at the executer
        send(ex, answer(got, "kept"))
        with dial(srv, key) as back:
            send(back, frame)  # the same request again
            result = recv(back)
        assert result["results"][0]["result"]["output"] == "kept"
        with pytest.raises(TimeoutError):
            ex.recv(1)  # it was not sent to the executer a second time


def test_a_second_connection_of_an_executer_replaces_the_first(
    server: tuple[ServerProcess, str, str, str],
) -> None:
    srv, _, key, _ = server
    old = dial(srv, key, "executer")
    with dial(srv, key, "executer") as new, dial(srv, key) as rt:
        with pytest.raises(ConnectionClosed) as closed:
            old.recv(30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4000
        send(rt, {"type": "kml_request", "executionId": "req_5", "kmlResponse": READ})
        assert recv(new)["executionId"] == "req_5"


def test_resolve_is_relayed_to_the_executer_and_its_answer_back(
    server: tuple[ServerProcess, str, str, str],
) -> None:
    srv, _, key, _ = server
    with dial(srv, key, "executer") as ex, dial(srv, key) as rt:
        eid = "exec_" + "b" * 32
        send(
            rt, {"type": "resolve", "executionId": eid, "resolution": "skipped", "requestId": "q1"}
        )
        got = recv(ex)
        assert got == {
            "type": "resolve",
            "executionId": eid,
            "resolution": "skipped",
            "requestId": "q1",
        }
        send(
            ex, {"type": "resolved", "executionId": eid, "resolution": "skipped", "requestId": "q1"}
        )
        assert recv(rt) == {"type": "resolved", "executionId": eid, "resolution": "skipped",
                            "requestId": "q1"}  # fmt: skip
        send(rt, {"type": "resolve", "executionId": eid, "resolution": "maybe"})
        assert recv(rt)["code"] == "bad_frame"


# --------------------------------------------------------------------------- sessions


def test_results_are_recorded_in_the_session_that_issued_the_plan(
    server: tuple[ServerProcess, str, str, str],
) -> None:
    srv, _, key, _ = server
    with srv.client(headers=auth(key)) as http:
        run = http.post("/api/agents/coding", json={"input": "Create src/app.py"}).json()
        sid = run["sessionId"]
        with dial(srv, key, "executer") as ex, dial(srv, key) as rt:
            send(
                rt, {"type": "kml_request", "executionId": "req_6", "kmlResponse": run["response"]}
            )
            got = recv(ex)
            send(ex, answer(got, "wrote it"))
            assert recv(rt)["type"] == "kml_result"

        def recorded() -> list[dict[str, Any]]:
            chat = http.get(f"/api/sessions/{sid}").json()["chat"]
            return [m for m in chat if m["role"] == "tool"]

        tools = recorded()  # recorded before the result was relayed: no waiting needed
        assert tools, "the results were relayed before they were recorded in the session"
        assert tools[0]["requestId"] == "req_6"
        assert [r["result"]["executionId"] for r in tools[0]["results"]] == run["executionIds"]
        # the next send tells the model what happened; chat still shows only what was asked
        nxt = http.post("/api/agents/coding", json={"input": "now test it", "sessionId": sid})
        assert nxt.status_code == 200, nxt.text
        chat = http.get(f"/api/sessions/{sid}").json()["chat"]
        assert [m["content"] for m in chat if m["role"] == "user"] == [
            "Create src/app.py",
            "now test it",
        ]
    from kiso.kernel import User
    from kiso.kernel.sql import SqlSessionStore

    store = SqlSessionStore(f"sqlite:///{srv.home / 'kyronix.sqlite3'}")
    try:
        inputs = [e for e in store.load(sid).events if isinstance(e, User)]
    finally:
        store.close()
    assert "wrote it" in inputs[-1].text and "Results of the tools" in inputs[-1].text
