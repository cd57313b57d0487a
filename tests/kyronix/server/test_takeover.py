"""Runs that outlive their server, or their executer's connection, end once and as they ended.

- a keyed retry of a server-driven run whose executer is reconnecting waits for the run (it is
  never refused ``no_executer``), and both answers are the run's;
- a server killed after a run's kiso run ended ``completed`` but before the run was settled:
  the server that takes it over records it ``completed``, charged once, with the answer the log
  holds (nothing is asked of the model or the executer again);
- a replica paused (SIGSTOP) past the replica timeout, while another takes its runs over and
  finishes them, wakes and writes nothing over them: it says so in its log and answers its
  waiting clients with the other replica's answer; every Idempotency-Key answers the same on
  both replicas.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2
import pytest
from sqlalchemy.engine import URL

from .helpers import ServerProcess, auth, bootstrap, wait_until
from .test_driven import TASK, FakeExecuter, _free_port
from .test_replicas import Executer, _bootstrap, _replicas, _sql, _ws

pytestmark = pytest.mark.timeout(240)


def _post(server: ServerProcess, key: str, out: list[Any], idem: str | None = None) -> None:
    headers = {**auth(key), **({"Idempotency-Key": idem} if idem else {})}
    try:
        with server.client(headers=headers) as http:
            out.append(http.post("/api/agents/coding", json={"input": TASK, "execute": "tunnel"}))
    except httpx2.HTTPError as exc:
        out.append(exc)


def test_a_keyed_retry_of_a_tunnel_run_waits_while_its_executer_reconnects(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _, key = bootstrap(home)
    port = _free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    with ServerProcess(home, None, "--port", str(port)) as srv:
        first = FakeExecuter(url, key, home, hold=1)  # the first tool's request stays in flight
        first.start()
        assert first.connected.wait(60)
        original: list[Any] = []
        t1 = threading.Thread(target=_post, args=(srv, key, original, "retry-me"))
        t1.start()
        assert first.holding.wait(60), srv.log
        first.stop.set()  # the executer's connection drops, with the request pending
        first.join(10)
        retry: list[Any] = []
        t2 = threading.Thread(target=_post, args=(srv, key, retry, "retry-me"))
        t2.start()
        t2.join(3)
        assert not retry, retry  # it waits for the run (no 409 no_executer)
        again = FakeExecuter(url, key, home)  # the executer is back: the run goes on
        again.start()
        try:
            t1.join(120)
            t2.join(120)
        finally:
            again.stop.set()
            again.join(10)
    (done,), (replayed,) = original, retry
    assert isinstance(done, httpx2.Response) and done.status_code == 200, done
    assert isinstance(replayed, httpx2.Response) and replayed.status_code == 200, replayed
    assert replayed.json() == done.json()  # the same run, answered once, charged once


def test_a_run_that_ended_before_its_server_died_is_recorded_completed_and_charged_once(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    project, key = bootstrap(home)
    port = _free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    ex = FakeExecuter(url, key, home)
    dies = ServerProcess(home, {"KISO_FAILPOINT": "run_ended:1"}, "--port", str(port))
    replies: list[Any] = []
    try:
        ex.start()
        assert ex.connected.wait(60)
        _post(dies, key, replies)  # SIGKILL right after the kiso run's end is durable
        assert dies.wait() == -signal.SIGKILL
        assert isinstance(replies[0], httpx2.HTTPError)
        asked = Counter(ex.sent)
        with sqlite3.connect(home / "kyronix.sqlite3") as db:
            (run_id, status) = db.execute("SELECT id, status FROM kx_runs").fetchone()
            turns = _turns(db)
        assert status == "running"  # killed between the kiso run's end and the settle
        with ServerProcess(home, None, "--port", str(port)) as again:
            with again.client(headers=auth(key)) as http:
                assert wait_until(lambda: http.get(f"/api/runs/{run_id}").status_code != 404, 60)
                result = http.get(f"/api/runs/{run_id}")
            assert "took over 1 run(s)" in again.log or "resumed" in again.log, again.log
    finally:
        ex.stop.set()
        ex.join(10)
        dies.kill()
    assert result.status_code == 200, result.text
    body = result.json()
    assert body["response"] and body["results"] and all(e["result"]["success"] for e in
                                                         body["results"])  # fmt: skip
    assert Counter(ex.sent) == asked  # nothing was asked of the executer again
    assert all(n == 1 for n in asked.values()), asked
    with sqlite3.connect(home / "kyronix.sqlite3") as db:
        kinds = [r[0] for r in db.execute(
            "SELECT kind FROM kx_ledger WHERE project_id = ? ORDER BY id", (project,))]  # fmt: skip
        (status,) = db.execute("SELECT status FROM kx_runs WHERE id = ?", (run_id,)).fetchone()
        assert _turns(db) == turns  # the model was not asked again
    assert status == "completed" and kinds == ["grant", "hold", "release", "settle"]


def _turns(db: sqlite3.Connection) -> int:
    (n,) = db.execute("SELECT count(*) FROM kiso_events WHERE type = 'assistant'").fetchone()
    return int(n)


def test_a_paused_replica_never_overwrites_the_runs_another_took_over(
    pg_url: URL, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    project, key = _bootstrap(home, pg_url)
    runs = 4
    with _replicas(home, pg_url, KYRONIX_SCRIPTED_DELAY_MS="1500") as (a, b):
        ex = Executer(_ws(b), key)
        ex.start()
        try:
            assert ex.connected.wait(30)
            answers: list[list[Any]] = [[] for _ in range(runs)]
            threads = [
                threading.Thread(target=_post, args=(a, key, answers[i], f"key-{i}"), daemon=True)
                for i in range(runs)
            ]
            for t in threads:
                t.start()
            assert wait_until(lambda: len(ex.requests) >= runs, 120), a.log  # all mid-run
            a.signal(signal.SIGSTOP)
            try:
                done = "SELECT count(*) FROM kx_runs WHERE status = 'completed'"
                assert wait_until(lambda: _sql(pg_url, done) == [(runs,)], 120), b.log
            finally:
                a.signal(signal.SIGCONT)
            for t in threads:
                t.join(120)
            (b_id,) = _sql(pg_url, "SELECT id FROM kx_replicas WHERE pid = %s", b.pid)[0]
            assert wait_until(lambda: a.log.count("was taken over by another replica") >= 1, 60)
            retried = []
            for i in range(runs):
                for server in (a, b):
                    with server.client(headers={**auth(key), "Idempotency-Key": f"key-{i}"}) as h:
                        retried.append(
                            h.post("/api/agents/coding", json={"input": TASK, "execute": "tunnel"})
                        )
        finally:
            ex.stop.set()
            ex.join(10)
    rows = _sql(pg_url, "SELECT status, http_status, owner FROM kx_runs")
    assert [r[:2] for r in rows] == [("completed", 200)] * runs, rows
    assert all(r[2] == b_id for r in rows)  # every run was the other replica's to finish
    ledger = _sql(pg_url, "SELECT kind FROM kx_ledger WHERE project_id = %s", project)
    assert [k for (k,) in ledger].count("settle") == runs  # each charged once
    assert all(n == 1 for n in ex.ran.values()), ex.ran  # and no tool ran twice
    for i in range(runs):  # the clients that waited on the paused replica got the answer
        (got,) = answers[i]
        assert isinstance(got, httpx2.Response) and got.status_code == 200, got
    by_key = [retried[i : i + 2] for i in range(0, len(retried), 2)]
    for (on_a, on_b), (first,) in zip(by_key, answers, strict=True):
        assert on_a.status_code == on_b.status_code == 200
        assert on_a.json() == on_b.json() == first.json()  # one answer, whichever replica
    assert "Traceback" not in a.log
