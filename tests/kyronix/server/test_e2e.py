"""The real thing: ``kyronix serve`` under uvicorn on 127.0.0.1, driven with httpx2.

Each test starts its own server process (its pid recorded; only that pid is ever signalled)
and talks to it over a socket. No wall-clock asserts: the tests wait for states, not for times.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2

from kyronix import kml
from tests.processes import alive

from .helpers import ServerProcess, auth, bootstrap, kyronix, sse_events, wait_until


def _db(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(home / "kyronix.sqlite3", timeout=30)


def _ledger(home: Path, project: str) -> list[tuple[str, int, str | None]]:
    with _db(home) as conn:
        return list(
            conn.execute(
                "SELECT kind, amount, run_id FROM kx_ledger WHERE project_id = ? ORDER BY id",
                (project,),
            )
        )


def _balance(home: Path, project: str) -> int:
    with _db(home) as conn:
        return int(
            conn.execute("SELECT credits FROM kx_projects WHERE id = ?", (project,)).fetchone()[0]
        )


def _running(home: Path) -> list[str]:
    with _db(home) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM kx_runs WHERE status = 'running'")]


def _leased(home: Path, session_id: str) -> bool:
    with _db(home) as conn:
        q = "SELECT 1 FROM kiso_writers WHERE session_id = ?"
        return conn.execute(q, (session_id,)).fetchone() is not None


def test_fifty_concurrent_runs_against_credits_for_ten(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "server.json").write_text(
        json.dumps({"initialCredits": 5, "rateLimit": {"burst": 500}})
    )
    project, key = bootstrap(home)
    with ServerProcess(home, {"KYRONIX_SCRIPTED_DELAY_MS": "50"}) as server:
        with server.client(headers=auth(key), limits=httpx2.Limits(max_connections=60)) as client:

            def run(i: int) -> httpx2.Response:
                return client.post("/api/agents/coding", json={"input": f"task {i}"})

            with ThreadPoolExecutor(50) as pool:
                replies = list(pool.map(run, range(50)))
        codes = [r.status_code for r in replies]
        assert set(codes) <= {200, 402}, codes
        assert 1 <= codes.count(200) <= 10
        assert all(
            r.json()["error"]["code"] == "insufficient_credits"
            for r in replies
            if r.status_code == 402
        )
        for r in replies:
            if r.status_code == 200:
                assert kml.parse(r.json()["response"]).tools
    rows = _ledger(home, project)
    running = 0
    for _kind, amount, _ in rows:  # the balance after every ledger row, in commit order
        running += amount
        assert running >= 0, rows
    assert running == _balance(home, project) == 5000 - 500 * codes.count(200)
    assert sum(1 for kind, _, _ in rows if kind == "settle") == codes.count(200)
    assert not _running(home)


def test_sigkill_mid_run_then_restart_releases_the_hold_and_shows_it_interrupted(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    project, key = bootstrap(home)
    slow = {"KYRONIX_SCRIPTED_DELAY_MS": "60000"}
    server = ServerProcess(home, slow)
    try:
        with server.client(headers=auth(key)) as client:
            sid = client.post("/api/sessions", json={"agent": "coding"}).json()["id"]
        done: list[Any] = []

        def run() -> None:
            try:
                with server.client(headers=auth(key)) as c:
                    done.append(
                        c.post("/api/agents/coding", json={"input": "slow one", "sessionId": sid})
                    )
            except httpx2.HTTPError as exc:
                done.append(exc)

        t = threading.Thread(target=run)
        t.start()
        assert wait_until(lambda: bool(_running(home)))
        (run_id,) = _running(home)
        before = _ledger(home, project)
        assert [k for k, _, _ in before] == ["grant", "hold"]
        # the session log already holds the run's input: it is mid-run
        assert wait_until(lambda: _leased(home, sid))  # its kiso session is open: mid-run
        server.signal(signal.SIGKILL)
        server.wait()
        t.join(30)
        assert isinstance(done[0], httpx2.HTTPError)  # the connection died with the server
    finally:
        server.kill()
    assert not alive(server.pid)
    with ServerProcess(home, slow) as again:
        after = _ledger(home, project)
        assert after[: len(before)] == before  # no ledger row lost
        assert after[len(before) :] == [("release", 500, run_id)]
        assert _balance(home, project) == 100_000
        assert not _running(home)
        with again.client(headers=auth(key)) as client:
            chat = client.get(f"/api/sessions/{sid}").json()["chat"]
            assert chat[0] == {"role": "user", "content": "slow one"}
            assert chat[-1]["status"] == "interrupted" and chat[-1]["runId"] == run_id
            shown = kyronix("credits", "show", "demo", home=home)
            assert shown.returncode == 0 and "held by runs in flight: 0" in shown.stdout


def test_sigkill_right_after_the_answer_is_durable_keeps_the_answer_and_its_charge(
    tmp_path: Path,
) -> None:
    """The answer in the session's log and its charge in the ledger are one transaction: killed
    the instant that batch is durable, the restarted server finds the run completed and charged,
    not interrupted and released."""
    home = tmp_path / "home"
    project, key = bootstrap(home)
    server = ServerProcess(home, {"KISO_FAILPOINT": "run_ended"})
    try:
        # the server dies the instant the batch is durable: its answer may or may not have
        # gone out by then (the waiters wake as the failpoint fires), what matters is the log
        with server.client(headers=auth(key)) as client, contextlib.suppress(httpx2.HTTPError):
            client.post("/api/agents/coding", json={"input": "make it so"})
        assert server.wait() == -9
    finally:
        server.kill()
    with ServerProcess(home) as again:
        kinds = [k for k, _, _ in _ledger(home, project)]
        assert kinds == ["grant", "hold", "release", "settle"]
        assert _balance(home, project) == 99_500
        with _db(home) as conn:
            ((sid, status),) = list(conn.execute("SELECT session_id, status FROM kx_runs"))
        assert status == "completed"
        with again.client(headers=auth(key)) as client:
            chat = client.get(f"/api/sessions/{sid}").json()["chat"]
    assert chat[0] == {"role": "user", "content": "make it so"}
    assert chat[-1]["role"] == "assistant" and chat[-1]["status"] == "completed"
    assert kml.parse(chat[-1]["content"]).tools


def test_sigterm_drains_running_turns_finish_and_new_requests_are_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    project, key = bootstrap(home)
    server = ServerProcess(
        home, {"KYRONIX_SCRIPTED_DELAY_MS": "1500", "KYRONIX_DRAIN_TIMEOUT": "30"}
    )
    replies: list[Any] = []

    def run() -> None:
        with server.client(headers=auth(key)) as c:
            replies.append(c.post("/api/agents/coding", json={"input": "finish me"}))

    try:
        t = threading.Thread(target=run)
        t.start()
        assert wait_until(lambda: bool(_running(home)))
        server.signal(signal.SIGTERM)
        t.join(60)
        assert server.wait(60) == 0
    finally:
        server.kill()
    assert replies[0].status_code == 200, replies[0].text  # the running turn finished
    kinds = [k for k, _, _ in _ledger(home, project)]
    assert kinds == ["grant", "hold", "release", "settle"]
    assert _balance(home, project) == 99_500
    assert "draining" in server.log


def test_a_client_waiting_on_a_run_the_drain_interrupts_gets_its_answer(tmp_path: Path) -> None:
    """A client waits on ``POST /api/agents/coding`` for a run that will not end before
    ``drainTimeout``: the run is interrupted in time for the client to get 503
    ``run_interrupted`` (the HTTP server is still waiting for it then), and no request is cut
    off mid-answer with a traceback in the log."""
    home = tmp_path / "home"
    _, key = bootstrap(home)
    server = ServerProcess(
        home, {"KYRONIX_SCRIPTED_DELAY_MS": "120000", "KYRONIX_DRAIN_TIMEOUT": "2"}
    )
    try:
        with server.client(headers=auth(key)) as client, ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.post, "/api/agents/coding", json={"input": "forever"})
            assert wait_until(lambda: bool(_running(home)))
            server.signal(signal.SIGTERM)
            reply = waiting.result(60)
            assert server.wait(60) == 0
    finally:
        server.kill()
    assert reply.status_code == 503, reply.text
    assert reply.json()["error"]["code"] == "run_interrupted"
    assert "Traceback" not in server.log and "Exception in ASGI application" not in server.log


def test_a_drain_timeout_records_what_is_still_running_as_interrupted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    project, key = bootstrap(home)
    server = ServerProcess(
        home, {"KYRONIX_SCRIPTED_DELAY_MS": "120000", "KYRONIX_DRAIN_TIMEOUT": "1"}
    )
    try:
        with server.client(headers=auth(key)) as client:
            with client.stream(
                "POST", "/api/agents/coding/stream", json={"input": "never ends"}
            ) as s:
                run_id = s.headers["x-run-id"]
                assert wait_until(lambda: bool(_running(home)))
            server.signal(signal.SIGTERM)
            assert server.wait(60) == 0
    finally:
        server.kill()
    assert not _running(home)
    assert _ledger(home, project)[-1] == ("release", 500, run_id)
    with _db(home) as conn:
        assert conn.execute("SELECT status FROM kx_runs WHERE id = ?", (run_id,)).fetchone()[0] == (
            "interrupted"
        )


def test_a_client_that_disconnects_does_not_cancel_the_run_and_can_resume(tmp_path: Path) -> None:
    home = tmp_path / "home"
    project, key = bootstrap(home)
    with ServerProcess(home, {"KYRONIX_SCRIPTED_DELAY_MS": "1500"}) as server:
        with server.client(headers=auth(key)) as client:
            seen = ""
            with client.stream(
                "POST", "/api/agents/research/stream", json={"input": "web assembly"}
            ) as s:
                run_id = s.headers["x-run-id"]
                for line in s.iter_lines():
                    if line.startswith("id:"):
                        seen = line.split(":", 1)[1].strip()
                        break
            # the stream is closed mid-run: the run goes on
            assert seen and seen != "end"
            with server.client(headers=auth(key)) as other:
                result = other.get(f"/api/runs/{run_id}")  # waits for the result
                assert result.status_code == 200 and result.json()["cost"] == 0.5
                with other.stream(
                    "GET", f"/api/runs/{run_id}/stream", headers={"Last-Event-ID": seen}
                ) as s:
                    rest = sse_events(s.read().decode())
        assert rest[-1]["event"] == "complete"
        offset = int(seen.split(":")[1])
        text = "".join(e["data"]["text"] for e in rest if e["event"] == "chunk")
        assert len(text) > 0 and offset > 0
        assert _balance(home, project) == 99_500  # charged once, for the run it did
    # nothing secret in the server's log: neither the key nor the prompt
    assert key not in server.log and "web assembly" not in server.log
    assert run_id in server.log


def test_a_second_server_on_the_same_home_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bootstrap(home)
    with ServerProcess(home):
        second = kyronix("serve", "--port", "0", home=home)
        assert second.returncode != 0
        assert "already running" in second.stderr


def test_a_second_server_with_another_home_on_the_same_sqlite_file_is_refused(
    tmp_path: Path,
) -> None:
    """One SQLite database takes one server, whichever homes they run from: the lock is beside
    the database file too, not only in the home."""
    shared = tmp_path / "data" / "kx.sqlite3"
    url = f"sqlite:///{shared}"
    home = tmp_path / "home"
    bootstrap(home)
    with ServerProcess(home, {"KYRONIX_DATABASE_URL": url}):
        second = kyronix("serve", "--port", "0", home=tmp_path / "home2", env={
            "KYRONIX_DATABASE_URL": url})  # fmt: skip
        assert second.returncode != 0
        assert f"already running on the database {shared}" in second.stderr
        assert "Traceback" not in second.stderr
    again = tmp_path / "home3"
    with ServerProcess(again, {"KYRONIX_DATABASE_URL": url}):  # free again once it stopped
        pass


def test_a_non_loopback_host_prints_a_tls_warning(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # 192.0.2.1 (TEST-NET-1) is never this machine's: the bind fails after the warning
    out = kyronix("serve", "--host", "192.0.2.1", "--port", "0", home=home)
    assert "TLS" in out.stderr and "not loopback" in out.stderr
    assert out.returncode != 0
