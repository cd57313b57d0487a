"""Several ``kyronix serve`` replicas on one PostgreSQL database, as real processes (issue 18).

A runtime client on one replica reaches the executer connected to another (a mailbox row plus
``NOTIFY``, or the sweep when notifications are lost); a replica SIGKILLed mid-run has its run
taken over by another, resumed from the session log, nothing run twice, and the client's stream
rejoined there with ``Last-Event-ID``; credits hold across replicas.

Each test starts its own replicas (their pids recorded; only those pids are ever signalled) on a
database of its own.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest
from sqlalchemy.engine import URL
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from kyronix import kml
from kyronix.server.cluster import LOCATE_CACHE_S

from .helpers import ServerProcess, auth, kyronix, sse_events, wait_until

TASK = "Create src/app.py and run it"
TIMEOUT = "3"  # seconds without a heartbeat before a replica is dead (same host: at once)


def _plain(url: URL) -> str:
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def _ws(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/ws"


class Executer(threading.Thread):
    """A raw WebSocket executer with receipts: each tool id runs at most once (a repeat gets the
    stored result); ``hold`` (1-based) keeps that request unanswered until ``release`` is set."""

    def __init__(self, url: str, key: str, *, hold: int | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.hold = url, key, hold
        self.ran: Counter[str] = Counter()  # tool id -> times it really ran (must stay 1)
        self.asked: Counter[str] = Counter()  # tool id -> requests that carried it
        self.requests: list[dict[str, Any]] = []
        self.resolves: list[dict[str, Any]] = []
        self.receipts: dict[str, dict[str, Any]] = {}
        self.holding = threading.Event()
        self.release = threading.Event()
        self.connected = threading.Event()
        self.stop = threading.Event()
        self._held: dict[str, Any] | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with connect(
                    self.url + "?role=executer", additional_headers=auth(self.key), open_timeout=5
                ) as ws:
                    assert json.loads(ws.recv(10))["type"] == "ready"
                    self.connected.set()
                    while not self.stop.is_set():
                        if self._held is not None and self.release.is_set():
                            held, self._held = self._held, None
                            self._answer(ws, held)
                        try:
                            frame = json.loads(ws.recv(0.05))
                        except TimeoutError:
                            continue
                        if frame["type"] == "kml_request":
                            self.requests.append(frame)
                            for t in kml.parse(frame["kmlResponse"]).tools:
                                self.asked[t.execution_id] += 1
                            if self.hold is not None and len(self.requests) == self.hold:
                                self._held = frame
                                self.holding.set()
                                continue
                            self._answer(ws, frame)
                        elif frame["type"] == "resolve":
                            self.resolves.append(frame)
                            ws.send(json.dumps({**frame, "type": "resolved", "ok": True}))
            except (ConnectionClosed, OSError, TimeoutError):
                self.connected.clear()
                self.stop.wait(0.2)  # the server went away: connect again

    def _answer(self, ws: ClientConnection, frame: dict[str, Any]) -> None:
        results = []
        for t in kml.parse(frame["kmlResponse"]).tools:
            if t.execution_id not in self.receipts:
                self.ran[t.execution_id] += 1
                self.receipts[t.execution_id] = {
                    "success": True, "output": f"did {t.name}", "executionId": t.execution_id,
                }  # fmt: skip
            results.append(
                {"tool": t.name, "args": t.args, "result": self.receipts[t.execution_id]}
            )
        ws.send(
            json.dumps(
                {"type": "kml_result", "executionId": frame["executionId"], "results": results}
            )
        )


def _plan(tag: str, n: int = 2) -> str:
    tools = "".join(
        f'<tool name="read_file" executionId="exec_{tag}{i}"><path>f{i}.txt</path></tool>'
        for i in range(n)
    )
    return f"<kyronix>{tools}</kyronix>"


def _request(server: ServerProcess, key: str, request_id: str, plan: str) -> dict[str, Any]:
    """A runtime client's request on ``server``: its ``kml_result`` (or ``error``) frame."""
    with connect(_ws(server), additional_headers=auth(key), open_timeout=10) as ws:
        assert json.loads(ws.recv(10))["type"] == "ready"
        ws.send(json.dumps({"type": "kml_request", "executionId": request_id,
                            "kmlResponse": plan, "timeout": 60}))  # fmt: skip
        while True:
            frame = json.loads(ws.recv(60))
            if frame["type"] in ("kml_result", "error"):
                return frame


@contextlib.contextmanager
def _replicas(home: Path, url: URL, n: int = 2, **env: str) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    base = {"KYRONIX_DATABASE_URL": _plain(url), "KYRONIX_REPLICA_TIMEOUT": TIMEOUT, **env}
    try:
        for _ in range(n):
            started.append(ServerProcess(home, base))
        yield started
    finally:
        for server in started:
            server.__exit__(None, None, None)


def _sql(url: URL, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        cur = conn.execute(query.encode(), args)
        return list(cur.fetchall()) if cur.description else []


def _bootstrap(home: Path, url: URL, credits: int | None = None) -> tuple[str, str]:
    """(project, key) through the CLI on the database; ``credits``: the project's grant."""
    home.mkdir(mode=0o700, exist_ok=True)
    if credits is not None:
        (home / "server.json").write_text(json.dumps({"initialCredits": credits}))
    env = {"KYRONIX_DATABASE_URL": _plain(url)}
    made = kyronix("projects", "create", "demo", home=home, env=env)
    assert made.returncode == 0, made.stderr
    project = made.stdout.strip()
    key = kyronix("keys", "create", "--project", "demo", home=home, env=env).stdout.strip()
    return project, key


def test_a_client_on_one_replica_reaches_the_executer_on_another(
    pg_url: URL, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    _, key = _bootstrap(home, pg_url)
    with _replicas(home, pg_url) as (a, b):
        ex = Executer(_ws(a), key)
        ex.start()
        try:
            assert ex.connected.wait(30)
            got = _request(b, key, "req_cross_1", _plan("x"))
            assert got["type"] == "kml_result", got
            assert [r["result"]["executionId"] for r in got["results"]] == ["exec_x0", "exec_x1"]
            assert ex.ran == Counter({"exec_x0": 1, "exec_x1": 1})
            # the same request again, on either replica: the results, nothing runs again
            assert _request(b, key, "req_cross_1", _plan("x"))["results"] == got["results"]
            assert _request(a, key, "req_cross_1", _plan("x"))["results"] == got["results"]
            assert ex.ran == Counter({"exec_x0": 1, "exec_x1": 1})
            # a resolve sent on B reaches the executer on A, and its answer comes back
            with connect(_ws(b), additional_headers=auth(key), open_timeout=10) as ws:
                assert json.loads(ws.recv(10))["type"] == "ready"
                ws.send(json.dumps({"type": "resolve", "executionId": "exec_x0",
                                    "resolution": "skipped", "requestId": "res_1"}))  # fmt: skip
                answer = json.loads(ws.recv(30))
            assert answer["type"] == "resolved" and answer["requestId"] == "res_1", answer
            assert ex.resolves and ex.resolves[0]["executionId"] == "exec_x0"
            # a server-driven run admitted on B runs every tool on the executer at A
            with b.client(headers=auth(key)) as http:
                r = http.post("/api/agents/coding", json={"input": TASK, "execute": "tunnel"})
            assert r.status_code == 200, (r.text, b.log)
            assert r.json()["results"] and all(e["result"]["success"] for e in r.json()["results"])
            assert all(n == 1 for n in ex.ran.values()), ex.ran
        finally:
            ex.stop.set()
            ex.join(10)
    # every frame went through the mailbox, and nothing was left in it
    assert _sql(pg_url, "SELECT count(*) FROM kx_mailbox") == [(0,)]


def test_lost_notifications_are_delivered_by_the_sweep_and_a_repeat_runs_nothing_twice(
    pg_url: URL, tmp_path: Path
) -> None:
    """Notifications dropped on purpose: the LISTEN connections are killed by the database, and
    then the replicas send none at all (``KYRONIX_NOTIFY=0``): every frame still arrives, by the
    sweep. A request delivered twice to the executer is answered by its receipts."""
    home = tmp_path / "home"
    project, key = _bootstrap(home, pg_url)
    with _replicas(home, pg_url) as (a, b):
        ex = Executer(_ws(a), key)
        ex.start()
        try:
            assert ex.connected.wait(30)
            assert _request(b, key, "req_n1", _plan("n"))["type"] == "kml_result"
            killed = _sql(
                pg_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE 'kyronix-listen-%%' AND datname = current_database()",
            )
            assert len(killed) == 2  # one LISTEN connection per replica
            got = _request(b, key, "req_n2", _plan("m"))
            assert got["type"] == "kml_result", got
            assert ex.ran["exec_m0"] == 1
        finally:
            ex.stop.set()
            ex.join(10)
        assert "the LISTEN connection failed" in a.log + b.log
    with _replicas(home, pg_url, KYRONIX_NOTIFY="0") as (a, b):
        ex = Executer(_ws(a), key)
        ex.start()
        try:
            assert ex.connected.wait(30)
            got = _request(b, key, "req_s1", _plan("s", 3))
            assert got["type"] == "kml_result", got
            assert ex.ran == Counter({"exec_s0": 1, "exec_s1": 1, "exec_s2": 1})
            assert not _sql(
                pg_url,
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'kyronix-listen-%%'"
                " AND datname = current_database()",
            )  # nobody listens: the sweep delivered everything
            # at least once: the same tools delivered again (a new envelope: no relay kept its
            # result) reach the executer, whose receipts answer them; nothing runs again
            (replica_b,) = _sql(pg_url, "SELECT id FROM kx_replicas WHERE pid = %s", b.pid)[0]
            (replica_a,) = _sql(pg_url, "SELECT id FROM kx_replicas WHERE pid = %s", a.pid)[0]
            body = {"project": project, "requestId": "req_s1_again", "kml": _plan("s", 3),
                    "executerId": "default", "timeout": 30, "origin": replica_b}  # fmt: skip
            for _ in range(2):
                _sql(pg_url, "INSERT INTO kx_mailbox (target, kind, body, created_at) "
                     "VALUES (%s, 'request', %s, 0)", replica_a, json.dumps(body))  # fmt: skip
            assert wait_until(lambda: len(ex.requests) >= 2, 30), ex.requests
            again = _request(b, key, "req_s1_again", _plan("s", 3))  # B kept what came back
            assert again["results"] == got["results"]
            assert ex.asked["exec_s0"] == 2 and ex.ran["exec_s0"] == 1
            assert all(n == 1 for n in ex.ran.values()), ex.ran
        finally:
            ex.stop.set()
            ex.join(10)


def test_an_executer_that_went_silent_is_not_routed_to(pg_url: URL, tmp_path: Path) -> None:
    """An executer its replica last heard from 46 s ago is lost for the others. (A is paused
    with SIGSTOP, well inside its replica timeout, so its next heartbeat cannot write a fresher
    time over the one the test sets.)"""
    home = tmp_path / "home"
    _, key = _bootstrap(home, pg_url)
    with _replicas(home, pg_url) as (a, b):
        ex = Executer(_ws(a), key)
        ex.start()
        try:
            assert ex.connected.wait(30)
            assert wait_until(lambda: _sql(pg_url, "SELECT count(*) FROM kx_presence") == [(1,)])
            assert _request(b, key, "req_heard", _plan("h"))["type"] == "kml_result"
            a.signal(signal.SIGSTOP)
            try:
                stale = int(time.time() * 1000) - 46_000
                _sql(pg_url, "UPDATE kx_presence SET seen_at = %s", stale)
                time.sleep(LOCATE_CACHE_S + 0.1)  # B's memory of the route it just used expires
                got = _request(b, key, "req_silent", _plan("q"))
            finally:
                a.signal(signal.SIGCONT)
            assert got["type"] == "error" and got["code"] == "no_executer", got
        finally:
            ex.stop.set()
            ex.join(10)


def _read_until_closed(ws: ClientConnection) -> None:
    while True:
        ws.recv(60)


def test_an_executer_that_connects_again_to_another_replica_closes_its_old_connection(
    pg_url: URL, tmp_path: Path
) -> None:
    """The same key's executer dials B while its old connection to A still looks alive (a dropped
    TCP connection A has not noticed): A closes the old one (4000), as it would for a new
    connection of its own, so A's clients are routed to the executer at B, not to a dead socket."""
    home = tmp_path / "home"
    _, key = _bootstrap(home, pg_url)
    with (
        _replicas(home, pg_url) as (a, b),
        connect(_ws(a) + "?role=executer", additional_headers=auth(key), open_timeout=30) as old,
    ):
        assert json.loads(old.recv(30))["type"] == "ready"
        ex = Executer(_ws(b), key)
        ex.start()
        try:
            assert ex.connected.wait(30)
            with pytest.raises(ConnectionClosed) as closed:
                _read_until_closed(old)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4000
            got = _request(a, key, "req_moved", _plan("m"))  # asked at A: served from B
            assert got["type"] == "kml_result", got
            assert ex.ran == Counter({"exec_m0": 1, "exec_m1": 1})
        finally:
            ex.stop.set()
            ex.join(10)


def test_a_replica_killed_mid_run_is_taken_over_and_its_stream_rejoined_on_another(
    pg_url: URL, tmp_path: Path
) -> None:
    """Three replicas: the run starts on A, whose stream the client reads; A is SIGKILLed with a
    tool in flight; B or C takes the run over and resumes it; the client rejoins with its
    ``Last-Event-ID`` on the replica that does not run it (which follows the run to its end)
    and, after, on the one that does: the same answer, every tool run once, charged once."""
    home = tmp_path / "home"
    project, key = _bootstrap(home, pg_url)
    env = {"KYRONIX_SCRIPTED_DELAY_MS": "20"}
    with _replicas(home, pg_url, 3, **env) as (a, b, c):
        ex = Executer(_ws(b), key, hold=2)  # the second tool is in flight when A dies
        ex.start()
        try:
            assert ex.connected.wait(30)
            seen: list[dict[str, Any]] = []
            failed: list[BaseException] = []

            def stream() -> None:
                try:
                    with a.client(headers=auth(key)) as http, http.stream(
                        "POST", "/api/agents/coding/stream",
                        json={"input": TASK, "execute": "tunnel"},
                    ) as r:  # fmt: skip
                        buf = ""
                        for chunk in r.iter_text():
                            buf += chunk.replace("\r\n", "\n")
                            *whole, buf = buf.split("\n\n")
                            for block in whole:
                                seen.extend(sse_events(block + "\n\n"))
                except httpx2.HTTPError as exc:
                    failed.append(exc)

            t = threading.Thread(target=stream, daemon=True)
            t.start()
            assert ex.holding.wait(60), a.log
            assert wait_until(lambda: any(e.get("id") for e in seen), 30), seen
            (run_id, first_owner) = _sql(pg_url, "SELECT id, owner FROM kx_runs")[0]
            a.signal(9)
            assert a.wait() == -9
            t.join(30)
            assert failed, "the stream died with its replica"
            last = [e["id"] for e in seen if e.get("id")][-1]

            def owner() -> str:
                return str(_sql(pg_url, "SELECT owner FROM kx_runs")[0][0])

            assert wait_until(lambda: owner() != first_owner, 60), b.log + c.log
            (pid,) = _sql(pg_url, "SELECT pid FROM kx_replicas WHERE id = %s", owner())[0]
            runner, other = (b, c) if pid == b.pid else (c, b)
            assert pid == runner.pid
            followed: list[list[dict[str, Any]]] = []

            def rejoin_elsewhere() -> None:  # while the run is still going, on a replica
                with other.client(headers={**auth(key), "Last-Event-ID": last}) as http:
                    followed.append(sse_events(http.get(f"/api/runs/{run_id}/stream").text))

            follower = threading.Thread(target=rejoin_elsewhere, daemon=True)
            follower.start()
            time.sleep(0.5)
            assert not followed  # it waits for the run, which waits for the held tool
            ex.release.set()  # the executer answers the request that was in flight
            follower.join(60)
            assert _sql(pg_url, "SELECT status FROM kx_runs")[0][0] == "completed"
            with runner.client(headers={**auth(key), "Last-Event-ID": last}) as http:
                rejoined = sse_events(http.get(f"/api/runs/{run_id}/stream").text)
        finally:
            ex.stop.set()
            ex.join(10)
    assert "took over 1 run(s)" in runner.log and "took over" not in other.log
    kinds = [e.get("event") for e in rejoined]
    assert kinds[0] == "attempt" and kinds[-1] == "complete", rejoined
    assert "another resumed it from its session log" in rejoined[0]["data"]["reason"]
    done = rejoined[-1]["data"]
    assert done["runId"] == run_id
    (elsewhere,) = followed
    assert elsewhere[0] == rejoined[0], elsewhere  # the same attempt event, the same reason
    assert elsewhere[-1] == rejoined[-1]  # the same end, whichever replica it was read on
    text = "".join(e["data"]["text"] for e in rejoined if e.get("event") == "chunk")
    assert text == "".join(e["data"]["text"] for e in elsewhere if e.get("event") == "chunk")
    assert [e["result"]["executionId"] for e in done["results"]] == list(ex.ran)
    assert all(n == 1 for n in ex.ran.values()), ex.ran  # nothing ran twice
    assert len(ex.ran) >= 2
    ledger = _sql(pg_url, "SELECT kind, amount FROM kx_ledger WHERE project_id = %s ORDER BY id",
                  project)  # fmt: skip
    assert [k for k, _ in ledger].count("settle") == 1  # charged once
    (balance,) = _sql(pg_url, "SELECT credits FROM kx_projects WHERE id = %s", project)[0]
    assert balance == sum(amount for _, amount in ledger) and balance < 100_000


def test_fifty_concurrent_runs_over_two_replicas_against_credits_for_ten(
    pg_url: URL, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    project, key = _bootstrap(home, pg_url, credits=5)  # 10 runs at 0.5 credits
    with _replicas(home, pg_url, KYRONIX_SCRIPTED_DELAY_MS="200") as servers:
        clients = [
            s.client(headers=auth(key), limits=httpx2.Limits(max_connections=30)) for s in servers
        ]
        try:

            def run(i: int) -> httpx2.Response:
                return clients[i % 2].post("/api/agents/coding", json={"input": f"task {i}"})

            with ThreadPoolExecutor(50) as pool:
                answers = list(pool.map(run, range(50)))
        finally:
            for c in clients:
                c.close()
    codes = Counter(r.status_code for r in answers)
    assert set(codes) <= {200, 402}, [r.text for r in answers if r.status_code not in (200, 402)]
    assert 1 <= codes[200] <= 10 and codes[402] == 50 - codes[200], codes
    assert all(r.json()["error"]["code"] == "insufficient_credits" for r in answers
               if r.status_code == 402)  # fmt: skip
    (balance,) = _sql(pg_url, "SELECT credits FROM kx_projects WHERE id = %s", project)[0]
    rows = _sql(pg_url, "SELECT kind, amount FROM kx_ledger WHERE project_id = %s ORDER BY id",
                project)  # fmt: skip
    running = 0
    for _kind, amount in rows:  # never below zero, whichever replica wrote the row
        running += amount
        assert running >= 0, rows
    (held,) = _sql(pg_url, "SELECT count(*) FROM kx_holds WHERE status = 'held'")[0]
    assert balance == running == 5_000 - 500 * codes[200] and held == 0
    assert sum(1 for kind, _ in rows if kind == "settle") == codes[200]
    assert _sql(pg_url, "SELECT count(*) FROM kx_runs WHERE status = 'running'") == [(0,)]
