"""``kyronix executer`` as a real daemon process: against the loopback server of test_daemon.py,
killed by SIGKILL in the middle of a command, and end to end through a real ``kyronix serve``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

from kiso.kernel.execution import ExecutionId
from kyronix.executer import ReceiptStore
from tests.kyronix.server.helpers import ServerProcess, auth, bootstrap
from tests.processes import alive

from .kmlkit import kml
from .test_daemon import KEY, FakeServer

KYRONIX = str(Path(sys.executable).with_name("kyronix"))

COMMAND = (
    "echo run >> count; if [ -f go ]; then echo finished > done.txt; "
    "else echo $$ > marker; sleep 60; echo late > late.txt; fi"
)


class Daemon:
    """``kyronix executer ...`` in a child process; its stderr lines are collected."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [KYRONIX, "executer", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, predicate: Callable[[str], bool], count: int = 1) -> list[str]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = [line for line in self.lines if predicate(line)]
            if len(found) >= count:
                return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        pytest.fail(f"no such line (x{count}) from the executer; its stderr:\n{self.log}")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def wait(self) -> int:
        code = self.proc.wait(60)
        self._reader.join(10)
        return code

    def stop(self) -> None:
        """End it if a test left it running (by its pid, never by name)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.communicate(timeout=10)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k != "KYRONIX_API_KEY"}
    return {**clean, "KYRONIX_HOME": str(tmp_path / "home")}


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    yield fake
    fake.close()


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for d in started:
        d.stop()


def _common(server_url: str, base: Path, tmp_path: Path) -> list[str]:
    return ["--ws", server_url, "--base", str(base), "--receipts", str(tmp_path / "r.sqlite3")]


def _connected(url: str, executer: str = "default", project: str = "proj_test") -> str:
    return f"connected to {url} as executer {executer} of project {project}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_daemon_says_where_it_is_connected_and_exits_0_on_a_signal(
    *,
    server: FakeServer,
    base: Path,
    tmp_path: Path,
    env: dict[str, str],
    daemons: list[Daemon],
    sig: int,
) -> None:
    daemon = Daemon(*_common(server.url, base, tmp_path), "--executer-id", "box",
                    env={**env, "KYRONIX_API_KEY": KEY})  # fmt: skip
    daemons.append(daemon)
    daemon.wait_line(lambda line: line == _connected(server.url, "box"))
    [conn] = server.connections
    assert conn["headers"]["Authorization"] == f"Bearer {KEY}"  # the key came from the env
    assert "role=executer&executerId=box" in conn["path"]
    server.request("req_1", kml(("write_file", {"path": "a.txt", "content": "a\n"}, "w-1")))
    assert server.result("req_1")["results"][0]["result"]["success"] is True
    assert (base / "a.txt").read_text() == "a\n"
    daemon.signal(sig)
    assert daemon.wait() == 0, daemon.log
    assert "Traceback" not in daemon.log
    assert daemon.lines[-1] == f"stopped serving {server.url}"


def test_the_daemon_reconnects_and_says_so(
    server: FakeServer, base: Path, tmp_path: Path, env: dict[str, str], daemons: list[Daemon]
) -> None:
    daemon = Daemon(*_common(server.url, base, tmp_path), "--api-key", KEY, env=env)
    daemons.append(daemon)
    daemon.wait_line(lambda line: line == _connected(server.url))
    server.drop()
    [gone] = daemon.wait_line(lambda line: line.startswith(f"disconnected from {server.url} ("))
    assert "reconnecting in" in gone
    daemon.wait_line(lambda line: line == _connected(server.url), count=2)
    assert len(server.connections) == 2
    server.request("req_2", kml(("create_dir", {"path": "again"}, "c-2")))
    assert server.result("req_2")["results"][0]["result"]["success"] is True
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0, daemon.log


def test_sigterm_lets_the_running_request_finish_and_answers_it(
    server: FakeServer, base: Path, tmp_path: Path, env: dict[str, str], daemons: list[Daemon]
) -> None:
    daemon = Daemon(*_common(server.url, base, tmp_path), "--api-key", KEY, "--allow",
                    "tool:terminal", env=env)  # fmt: skip
    daemons.append(daemon)
    daemon.wait_line(lambda line: line == _connected(server.url))
    command = "touch started; while [ ! -f go ]; do sleep 0.02; done; echo done"
    server.request("req_t", kml(("terminal", {"command": command}, "t-t")))
    assert server.wait_for((base / "started").exists)
    daemon.signal(signal.SIGTERM)
    daemon.wait_line(lambda line: "waiting for 1 running request(s) (req_t)" in line)
    assert daemon.proc.poll() is None  # it waits for the command
    (base / "go").touch()
    assert daemon.wait() == 0, daemon.log
    [entry] = server.result("req_t")["results"]
    assert entry["result"]["success"] is True and entry["result"]["output"] == "done\n"


def test_a_second_signal_stops_at_once(
    server: FakeServer, base: Path, tmp_path: Path, env: dict[str, str], daemons: list[Daemon]
) -> None:
    daemon = Daemon(*_common(server.url, base, tmp_path), "--api-key", KEY, "--allow",
                    "tool:terminal", env=env)  # fmt: skip
    daemons.append(daemon)
    daemon.wait_line(lambda line: line == _connected(server.url))
    server.request("req_s", kml(("terminal", {"command": "echo $$ > marker; sleep 60"}, "t-s")))
    marker = base / "marker"
    assert server.wait_for(lambda: marker.exists() and marker.read_text().strip())
    shell_pid = int(marker.read_text())
    daemon.signal(signal.SIGTERM)
    daemon.wait_line(lambda line: "waiting for 1 running request(s) (req_s)" in line)
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 1, daemon.log
    assert "SIGTERM again: stopped at once; interrupted: req_s" in daemon.log
    assert server.wait_for(lambda: not alive(shell_pid)), "the command outlived its executer"
    assert "Traceback" not in daemon.log


def test_sigkill_mid_terminal_then_a_fresh_executer_reports_it_uncertain(
    server: FakeServer, base: Path, tmp_path: Path, env: dict[str, str], daemons: list[Daemon]
) -> None:
    common = [*_common(server.url, base, tmp_path), "--root", "--api-key", KEY]
    plan = kml(
        ("write_file", {"path": "first.txt", "content": "written once\n"}, "w-k"),
        ("terminal", {"command": COMMAND}, "t-k"),
        ("write_file", {"path": "third.txt", "content": "after\n"}, "w-k3"),
    )
    first = Daemon(*common, env=env)
    daemons.append(first)
    first.wait_line(lambda line: line == _connected(server.url))
    server.request("req_k", plan)
    marker = base / "marker"
    assert server.wait_for(lambda: marker.exists() and marker.read_text().strip()), first.log
    shell_pid = int(marker.read_text())
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert server.wait_for(lambda: not alive(shell_pid)), "the command outlived its executer"
    assert server.of("kml_result", "req_k") == []
    (base / "first.txt").write_text("edited since\n")

    # A fresh process; the server sends it the request that is still pending.
    second = Daemon(*common, env=env)
    daemons.append(second)
    second.wait_line(lambda line: line == _connected(server.url))
    results = server.result("req_k")["results"]
    assert [r["tool"] for r in results] == ["write_file", "terminal", "write_file"]
    assert results[0]["result"]["success"] is True  # replayed from its receipt ...
    assert (base / "first.txt").read_text() == "edited since\n"  # ... not written again
    assert results[1]["result"]["uncertain"] is True
    assert results[1]["result"]["errorType"] == "Uncertain"
    assert results[2]["result"]["skipped"] is True
    assert (base / "count").read_text() == "run\n"  # the command did not run again
    assert not (base / "late.txt").exists() and not (base / "third.txt").exists()

    ruled = subprocess.run(
        [KYRONIX, "executer", "resolve", "t-k", "rerun", "--base", str(base),
         "--receipts", str(tmp_path / "r.sqlite3")],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert ruled.returncode == 0, ruled.stderr
    assert ruled.stderr.strip() == "t-k: rerun"
    (base / "go").touch()
    server.request("req_k", plan)
    again = server.result("req_k", 2)["results"]
    assert [r["result"]["success"] for r in again] == [True, True, True]
    assert (base / "count").read_text() == "run\nrun\n"
    assert (base / "done.txt").read_text() == "finished\n"
    assert (base / "third.txt").read_text() == "after\n"
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.log


def test_usage_and_refusals_are_clear_errors(
    base: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    def run(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [KYRONIX, "executer", *args],
            capture_output=True,
            text=True,
            env={**env, **(extra or {})},
            timeout=60,
            check=False,
        )

    outcomes = {
        "no --ws": (run("--base", str(base)), 2, "--ws"),
        "no key": (run("--ws", "ws://127.0.0.1:9/ws", "--base", str(base)), 2,
                   "KYRONIX_API_KEY"),
        "bad url": (run("--ws", "http://127.0.0.1:9/ws", "--api-key", KEY), 2, "ws://"),
        "bad id": (run("--ws", "ws://127.0.0.1:9/ws", "--api-key", KEY, "--executer-id",
                       "a b"), 2, "executer id"),
        "bad allow": (run("--ws", "ws://127.0.0.1:9/ws", "--api-key", KEY, "--allow",
                          "terminal"), 2, "tool:terminal"),
        "bad ruling": (run("resolve", "x", "maybe", "--base", str(base)), 2, "rerun"),
        "unknown id": (run("resolve", "x", "rerun", "--base", str(base)), 1,
                       "no execution 'x'"),
    }  # fmt: skip
    refusing = FakeServer(close_with=(4401, "this API key is unknown or has been revoked"))
    try:
        outcomes["refused"] = (
            run("--ws", refusing.url, "--base", str(base), "--api-key", KEY),
            1,
            "refused the executer's key",
        )
    finally:
        refusing.close()
    for what, (out, code, says) in outcomes.items():
        assert out.returncode == code, (what, out.stderr)
        assert says in out.stderr, (what, out.stderr)
        assert "Traceback" not in out.stderr, (what, out.stderr)


# -- end to end through a real `kyronix serve` --------------------------------------------------


def _runtime_frames(url: str, key: str, frame: dict[str, Any]) -> list[dict[str, Any]]:
    """A raw runtime client: send one frame, collect what comes back until its kml_result."""
    got: list[dict[str, Any]] = []
    with connect(f"{url}?role=runtime", additional_headers=auth(key), open_timeout=10) as ws:
        ready = json.loads(ws.recv(10))
        assert ready["type"] == "ready" and ready["role"] == "runtime", ready
        ws.send(json.dumps(frame))
        while not got or got[-1]["type"] not in ("kml_result", "error"):
            got.append(json.loads(ws.recv(60)))
    return got


def test_end_to_end_through_kyronix_serve(
    tmp_path: Path, base: Path, env: dict[str, str], daemons: list[Daemon]
) -> None:
    home = tmp_path / "server-home"
    project, key = bootstrap(home)
    with ServerProcess(home) as srv:
        url = srv.url.replace("http://", "ws://") + "/ws"
        daemon = Daemon("--ws", url, "--base", str(base), "--api-key", key, "--allow",
                        "tool:terminal", "--executer-id", "laptop", env=env)  # fmt: skip
        daemons.append(daemon)
        daemon.wait_line(lambda line: line == _connected(url, "laptop", project))
        plan = kml(
            ("write_file", {"path": "hello.txt", "content": "hello\n"}, "w-e2e"),
            ("terminal", {"command": "cat hello.txt"}, "t-e2e"),
        )
        request = {"type": "kml_request", "executionId": "req_e2e", "kmlResponse": plan}
        frames = _runtime_frames(url, key, request)
        result = frames[-1]
        assert result["type"] == "kml_result" and result["executionId"] == "req_e2e", frames
        assert [r["result"]["success"] for r in result["results"]] == [True, True]
        assert result["results"][1]["result"]["output"] == "hello\n"
        assert (base / "hello.txt").read_text() == "hello\n"
        progress = [(p["event"], p["toolExecutionId"]) for p in frames[:-1]]
        assert progress[0] == ("tool_started", "w-e2e")
        assert ("tool_finished", "t-e2e") in progress
        assert "".join(p.get("chunk", "") for p in frames[:-1]) == "hello\n"

        # The same request again: the server's kept result or the executer's, never a rerun.
        (base / "hello.txt").write_text("changed\n")
        again = _runtime_frames(url, key, request)[-1]
        assert again["results"] == result["results"]
        assert (base / "hello.txt").read_text() == "changed\n"

        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0, daemon.log
        assert "Traceback" not in daemon.log


def test_the_server_driven_loop_runs_its_tools_in_this_daemon(
    tmp_path: Path, base: Path, env: dict[str, str], daemons: list[Daemon]
) -> None:
    """``"execute": "tunnel"``: the server runs the agent and each tool call is a request to
    this daemon, which really runs it (files, a command, a commit) and keeps its receipt."""
    subprocess.run(["git", "init", "-q", str(base)], check=True, env=env, timeout=60)
    home = tmp_path / "server-home"
    project, key = bootstrap(home)
    receipts = tmp_path / "r.sqlite3"
    with ServerProcess(home) as srv:
        url = srv.url.replace("http://", "ws://") + "/ws"
        daemon = Daemon("--ws", url, "--base", str(base), "--api-key", key, "--root",
                        "--receipts", str(receipts), env=env)  # fmt: skip
        daemons.append(daemon)
        daemon.wait_line(lambda line: line == _connected(url, "default", project))
        with srv.client(headers=auth(key)) as http:
            reply = http.post(
                "/api/agents/coding",
                json={"input": "Create src/app.py and run it", "execute": "tunnel"},
            )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0, daemon.log
    tools = [r["tool"] for r in body["results"]]
    assert "write_file" in tools and "terminal" in tools, body
    assert all(r["result"]["success"] for r in body["results"]), body
    assert (base / "src/app.py").is_file()
    ran = next(r for r in body["results"] if r["tool"] == "terminal")
    assert ran["args"]["cwd"] == str(base)
    store = ReceiptStore(receipts)
    try:
        for eid in body["executionIds"]:
            receipt = store.get(str(base), ExecutionId(eid))
            assert receipt is not None and receipt.settled, eid
    finally:
        store.close()
    assert len(daemon.wait_line(lambda line: line.startswith("req_"))) == len(tools)
