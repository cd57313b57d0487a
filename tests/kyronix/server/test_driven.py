"""The server-driven loop (``"execute": "tunnel"``) through a real ``kyronix serve``: every tool
call goes over the tunnel with ``execution_started`` already durable, and a server SIGKILLed
mid-run resumes at its restart and sends the same ids again, so nothing runs twice."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from kyronix import kml

from .helpers import ServerProcess, auth, bootstrap

TASK = "Create src/app.py and run it"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeExecuter(threading.Thread):
    """A raw WebSocket executer: answers each request, running each tool id at most once (as the
    real executer's receipts do), and checks the server's log already has the call started."""

    def __init__(self, url: str, key: str, home: Path, *, hold: int | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.home = url, key, home
        self.sent: Counter[str] = Counter()  # tool execution id -> requests that carried it
        self.requests: list[dict[str, Any]] = []
        self.started_first: list[bool] = []
        self.hold = hold  # don't answer the request with this index (1-based): a run in flight
        self.holding = threading.Event()
        self.connected = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with connect(
                    self.url + "?role=executer", additional_headers=auth(self.key), open_timeout=5
                ) as ws:
                    assert json.loads(ws.recv(10))["type"] == "ready"
                    self.connected.set()
                    while not self.stop.is_set():
                        try:
                            frame = json.loads(ws.recv(0.2))
                        except TimeoutError:
                            continue
                        if frame["type"] == "kml_request":
                            self._answer(ws, frame)
            except (ConnectionClosed, OSError, TimeoutError):
                self.stop.wait(0.2)  # the server went away: connect again

    def _answer(self, ws: Any, frame: dict[str, Any]) -> None:
        self.requests.append(frame)
        plan = kml.parse(frame["kmlResponse"])
        self.sent.update(t.execution_id for t in plan.tools)
        self.started_first.append(all(self._started_in_log(t.name) for t in plan.tools))
        if self.hold is not None and len(self.requests) == self.hold:
            self.holding.set()
            return  # never answered: the server dies with it pending
        results = []
        for t in plan.tools:
            results.append({"tool": t.name, "args": t.args,
                            "result": {"success": True, "output": f"did {t.name}",
                                       "executionId": t.execution_id}})  # fmt: skip
        ws.send(
            json.dumps(
                {"type": "kml_result", "executionId": frame["executionId"], "results": results}
            )
        )

    def _started_in_log(self, name: str) -> bool:
        with sqlite3.connect(self.home / "kyronix.sqlite3") as db:
            rows = db.execute(
                "SELECT line FROM kiso_events WHERE type = 'execution_started'"
            ).fetchall()
        return any(json.loads(r[0])["name"] == name for r in rows)


def test_the_server_runs_each_tool_over_the_tunnel_with_its_start_durable_first(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _, key = bootstrap(home)
    with ServerProcess(home) as srv:
        ex = FakeExecuter(srv.url.replace("http", "ws") + "/ws", key, home)
        ex.start()
        try:
            assert ex.connected.wait(60)
            with srv.client(headers=auth(key)) as http:
                r = http.post("/api/agents/coding", json={"input": TASK, "execute": "tunnel"})
                assert r.status_code == 200, r.text
                body = r.json()
                plain = http.post("/api/agents/coding", json={"input": TASK}).json()
        finally:
            ex.stop.set()
            ex.join(10)
    planned = [t.name for t in kml.parse(plain["response"]).tools]
    assert len(planned) >= 2
    assert [e["tool"] for e in body["results"]] == planned  # every tool, in order, with a result
    assert all(e["result"]["success"] for e in body["results"])
    assert body["executionIds"] == [e["result"]["executionId"] for e in body["results"]]
    assert len(ex.requests) == len(planned)  # one request a tool call
    assert all(ex.started_first)  # execution_started was durable before each request
    assert kml.parse(body["response"]).status == "complete"


def test_a_server_killed_mid_run_resumes_and_nothing_runs_twice(tmp_path: Path) -> None:
    home = tmp_path / "home"
    project, key = bootstrap(home)
    port = _free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    ex = FakeExecuter(url, key, home, hold=2)  # the second tool's request is in flight at the kill
    server = ServerProcess(home, None, "--port", str(port))
    replies: list[Any] = []
    try:
        ex.start()

        def run() -> None:
            try:
                with server.client(headers=auth(key)) as http:
                    replies.append(
                        http.post("/api/agents/coding", json={"input": TASK, "execute": "tunnel"})
                    )
            except httpx2.HTTPError as exc:
                replies.append(exc)

        assert ex.connected.wait(60)
        t = threading.Thread(target=run)
        t.start()
        assert ex.holding.wait(60), (replies, server.log)
        held = ex.requests[-1]
        server.signal(9)
        server.wait()
        t.join(30)
        assert isinstance(replies[0], httpx2.HTTPError)
        ex.hold = None  # the executer now answers everything
        with ServerProcess(home, None, "--port", str(port)) as again:
            with sqlite3.connect(home / "kyronix.sqlite3") as db:
                (run_id,) = db.execute("SELECT id FROM kx_runs").fetchone()
            with again.client(headers=auth(key)) as http:
                for _ in range(600):
                    done = http.get(f"/api/runs/{run_id}")
                    if done.status_code == 200:
                        break
                    threading.Event().wait(0.1)
                assert done.status_code == 200, (done.text, again.log)
                result = done.json()
    finally:
        ex.stop.set()
        ex.join(10)
        server.kill()
    # the request in flight went out again, the same frame with the same ids; the one answered
    # before the kill was not sent again; no new id was made for any call
    resent = [f for f in ex.requests if f["executionId"] == held["executionId"]]
    assert len(resent) == 2 and resent[0] == resent[1]
    (held_id,) = [t.execution_id for t in kml.parse(held["kmlResponse"]).tools]
    assert ex.sent[held_id] == 2
    assert all(n == 1 for eid, n in ex.sent.items() if eid != held_id), ex.sent
    assert [e["result"]["executionId"] for e in result["results"]] == list(ex.sent)
    assert all(e["result"]["success"] for e in result["results"])
    with sqlite3.connect(home / "kyronix.sqlite3") as db:
        kinds = [
            r[0] for r in db.execute("SELECT kind FROM kx_ledger WHERE project_id = ?", (project,))
        ]
        (status,) = db.execute("SELECT status FROM kx_runs WHERE id = ?", (run_id,)).fetchone()
    assert status == "completed" and kinds == ["grant", "hold", "release", "settle"]


def test_a_tunnel_run_with_no_executer_connected_is_refused_before_anything_is_charged(
    make_client: Any,
) -> None:
    from .helpers import project_with_key

    client, app = make_client()
    project, key = project_with_key(app)
    r = client.post(
        "/api/agents/coding", json={"input": TASK, "execute": "tunnel"}, headers=auth(key)
    )
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_executer"
    assert "kyronix executer" in r.json()["error"]["message"]
    from kyronix.server import billing

    assert app.state.kx.db.read(lambda c: billing.balance(c, project)) == 100_000
    bad = client.post(
        "/api/agents/coding", json={"input": TASK, "execute": "remote"}, headers=auth(key)
    )
    assert bad.status_code == 400
