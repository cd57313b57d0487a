"""examples/kyronix/ run as real programs against a real ``kyronix serve``.

The Getting Started flow is the document's three processes (the server, ``backend.py``,
``client.py``); the other examples run as subprocesses against the same server, each test with a
project of its own. Every child is waited for by the lines it prints, and ended by the pid this
test recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from kyronix import Kyronix
from kyronix.server.agents import builtin_persona
from kyronix.server.scripted import scripted_plan
from tests.kyronix.server.helpers import ServerProcess, auth, bootstrap, wait_until

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kyronix"
KYRONIX = str(Path(sys.executable).with_name("kyronix"))
PROMPT = "Create a React component called Button in src/components/Button.tsx"
CONNECTED = "Local executor connected and listening for remote KML requests over WebSocket..."
DEADLINE = 90.0


class Child:
    """A child process whose stdout and stderr lines are collected as they come."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=cwd,
        )
        self.pid = self.proc.pid
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    @property
    def stdout(self) -> str:
        return "\n".join(self.out)

    @property
    def log(self) -> str:
        return f"$ {' '.join(self.argv)}\n--- stdout\n{self.stdout}\n--- stderr\n" + "\n".join(
            self.err
        )

    def wait_line(self, predicate: Callable[[str], bool], *, stderr: bool = False) -> str:
        """The first line that satisfies ``predicate``, polled until a deadline; fails if the
        process ended without printing it."""
        lines = self.err if stderr else self.out
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            for line in list(lines):
                if predicate(line):
                    return line
            if self.proc.poll() is not None and not any(r.is_alive() for r in self._readers):
                break
            time.sleep(0.02)
        pytest.fail(f"the line never came:\n{self.log}")

    def wait(self) -> int:
        try:
            code = self.proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            pytest.fail(f"it did not end:\n{self.log}")
        self._close()
        return code

    def _close(self) -> None:
        for reader in self._readers:
            reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def stop(self) -> None:
        """Teardown: SIGTERM by pid, then SIGKILL by pid if it is still there."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("examples") / "server-home"
    with ServerProcess(home) as served:
        yield served


class Project:
    """A project of the module's server, its key, and how to start an example for it."""

    def __init__(self, server: ServerProcess, tmp: Path, name: str, children: list[Child]):
        self.server = server
        self.tmp = tmp
        self.id, self.key = bootstrap(server.home, name)
        self.base = tmp / "project"
        self.base.mkdir()
        self.children = children
        home = tmp / "home"  # the children's HOME: npm's logs and the like stay in the test
        home.mkdir()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("KYRONIX_")}
        self.env = {
            **clean,
            "HOME": str(home),
            "KYRONIX_HOME": str(server.home),  # the executers' receipts, beside the server's db
            "KYRONIX_API_KEY": self.key,
            "KYRONIX_BASE_URL": server.url,
            "KYRONIX_WS_URL": server.url.replace("http://", "ws://") + "/ws",
            "NPM_CONFIG_UPDATE_NOTIFIER": "false",  # the plan's `npm test` asks no registry
            "NPM_CONFIG_OFFLINE": "true",
            "PYTHONUNBUFFERED": "1",
        }

    def start(self, *argv: str) -> Child:
        child = Child(list(argv), self.env, self.tmp)
        self.children.append(child)
        return child

    def example(self, name: str, *args: str) -> Child:
        return self.start(sys.executable, str(EXAMPLES / name), *args)

    def http(self) -> httpx2.Client:
        return httpx2.Client(base_url=self.server.url, headers=auth(self.key), timeout=60)

    def tool_entries(self, session_id: str, count: int) -> list[dict[str, Any]]:
        """The session's `tool` chat entries, once there are ``count`` of them (the server
        records an executer's results just after relaying them)."""
        found: list[dict[str, Any]] = []

        def recorded() -> bool:
            with self.http() as http:
                chat = http.get(f"/api/sessions/{session_id}").json()["chat"]
            found[:] = [m for m in chat if m["role"] == "tool"]
            return len(found) >= count

        assert wait_until(recorded, timeout=30), found
        return found


@pytest.fixture
def project(server: ServerProcess, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    children: list[Child] = []
    name = re.sub(r"\W", "-", request.node.name)[:60]
    yield Project(server, tmp_path, name, children)
    for child in reversed(children):
        child.stop()


def json_after(text: str, marker: str) -> Any:
    """The JSON value printed right after ``marker``."""
    assert marker in text, text
    rest = text.split(marker, 1)[1].lstrip()
    value, _ = json.JSONDecoder().raw_decode(rest)
    return value


def start_backend(project: Project) -> tuple[Child, str]:
    backend = project.example("backend.py", "--port", "0")
    line = backend.wait_line(lambda s: s.startswith("Kyronix Backend running on port "))
    return backend, "http://127.0.0.1:" + line.rsplit(" ", 1)[1]


def button_content() -> str:
    plan = scripted_plan(builtin_persona("coding"), PROMPT)
    assert plan.tools[0].name == "write_file"
    return plan.tools[0].args["content"]


# ---------------------------------------------------------------------------- Getting Started


def test_getting_started_three_processes(project: Project) -> None:
    """`kyronix serve`, backend.py and client.py, exactly as the document runs them: the plan
    is made at the server, sent over the tunnel to the client's executer, runs there once, and
    its results are recorded in the run's session."""
    backend, url = start_backend(project)

    # with no executer connected the backend answers the document's 500 {"error": ...}
    refused = httpx2.post(url + "/api/run", json={"prompt": PROMPT}, timeout=60)
    assert refused.status_code == 500, refused.text
    assert "executer" in refused.json()["error"]

    client = project.example("client.py", "--root", "--base", str(project.base), "--backend", url)
    assert client.wait() == 0, client.log
    printed = client.stdout
    assert CONNECTED in printed
    assert printed.index(CONNECTED) < printed.index("Sending run request to backend...")
    data = json_after(printed, "Agent execution complete:")
    assert data["success"] is True
    assert isinstance(data["creditsRemaining"], int | float)
    results = data["executionResults"]
    assert [e["tool"] for e in results] == ["write_file", "terminal", "git_commit"]
    for entry in results[1:]:  # --root: the terminal and git ran (whatever they then said)
        assert entry["result"].get("errorType") not in ("SecurityError", "Skipped"), entry

    # the file is there, with the scripted model's content, written once: one write_file, which
    # created it (no git here, maybe no npm: those entries may fail; the example still prints)
    button = project.base / "src" / "components" / "Button.tsx"
    assert button.read_text() == button_content()
    writes = [e for e in results if e["tool"] == "write_file" and e["result"]["success"]]
    assert len(writes) == 1
    assert writes[0]["result"]["data"]["created"] is True
    assert writes[0]["args"]["path"] == str(button.resolve())

    # the server recorded the executer's results in the run's session: one `tool` entry
    (entry,) = project.tool_entries(data["sessionId"], 1)
    ids = [e["result"]["executionId"] for e in results]
    assert [e["result"]["executionId"] for e in entry["results"]] == ids
    assert f"write_file ({ids[0]}): succeeded" in entry["content"]
    with project.http() as http:
        chat = http.get(f"/api/sessions/{data['sessionId']}").json()["chat"]
    assert [m["role"] for m in chat] == ["user", "assistant", "tool"]
    assert chat[0]["content"] == PROMPT
    assert all(i in chat[1]["content"] for i in ids)  # the plan that issued those ids

    assert "2. Dispatching KML plan over WebSocket tunnel..." in backend.stdout
    backend.signal(signal.SIGTERM)
    assert backend.wait() == 0, backend.log


def test_client_serve_runs_a_resent_plan_once_and_stops_on_sigterm(project: Project) -> None:
    """client.py --serve stays connected: the same plan sent again is answered from the
    executer's receipts (the file is not written again), and SIGTERM ends it with status 0."""
    _, url = start_backend(project)
    client = project.example(
        "client.py", "--root", "--base", str(project.base), "--backend", url, "--serve"
    )
    client.wait_line(lambda s: s == "Serving until Ctrl-C...")
    data = json_after(client.stdout, "Agent execution complete:")
    first = data["executionResults"]
    button = project.base / "src" / "components" / "Button.tsx"
    assert button.read_text() == button_content()

    with project.http() as http:
        chat = http.get(f"/api/sessions/{data['sessionId']}").json()["chat"]
    plan = next(m["content"] for m in chat if m["role"] == "assistant")
    button.write_text("changed by the test\n")
    with Kyronix(api_key=project.key, base_url=project.server.url) as kx:
        again = kx.execute_kml_over_ws(plan, timeout=60)
    assert [e["result"]["executionId"] for e in again] == [
        e["result"]["executionId"] for e in first
    ]
    assert again[0]["result"]["success"] is True
    assert button.read_text() == "changed by the test\n"  # the receipt answered; nothing ran

    client.signal(signal.SIGTERM)
    assert client.wait() == 0, client.log


# ---------------------------------------------------------------------------- custom agents


def test_custom_agent_runs_sql_on_the_local_database(project: Project) -> None:
    """custom_agent.py: the custom agent's plan calls execute_sql, which the example's executer
    runs on its SQLite table; the printed outcomes are that table's rows. A second run finds
    the agent by its name instead of making another."""
    ran = project.example("custom_agent.py", "--base", str(project.base))
    assert ran.wait() == 0, ran.log
    printed = ran.stdout
    agent_id = re.search(r"^Custom agent: Database Assistant ([0-9a-f]{64})$", printed, re.M)
    assert agent_id, printed
    assert "Custom Agent local executor listening over WebSocket tunnel..." in printed
    assert '<tool name="execute_sql"' in printed  # the plan, as the example printed it
    (outcome,) = json_after(printed, "4. Execution Outcomes from local executor:")
    assert outcome["tool"] == "execute_sql"
    assert outcome["result"]["success"] is True, outcome

    with sqlite3.connect(project.base / "signup.db") as db:
        expected = [
            {"id": i, "name": n, "email": e, "signed_up_at": s}
            for i, n, e, s in db.execute(
                "SELECT id, name, email, signed_up_at FROM signup WHERE active = 1 "
                "ORDER BY signed_up_at DESC LIMIT 5"
            )
        ]
    db.close()
    assert len(expected) == 5
    assert outcome["result"]["data"]["results"] == expected
    assert "Ken Thompson" not in printed  # inactive: not among the rows
    assert "Executing SQL Query: SELECT" in printed  # the handler ran, in the example's process

    again = project.example("custom_agent.py", "--base", str(project.base))
    assert again.wait() == 0, again.log
    assert f"Custom agent: Database Assistant {agent_id[1]}" in again.stdout
    with project.http() as http:
        agents = http.get("/api/customagents").json()
    assert [a["name"] for a in agents] == ["Database Assistant"]
    assert [t["name"] for t in agents[0]["tools"]] == ["execute_sql"]
    assert agents[0]["tools"][0]["params"] == ["sql_query", "limit"]


# ---------------------------------------------------------------------------- sessions


def test_multi_turn_session_over_the_daemon(project: Project) -> None:
    """multi_turn.py with `kyronix executer` as the executer: two turns, each plan run at the
    daemon, and the session's messages with both turns' tool results."""
    daemon = project.start(
        KYRONIX,
        "executer",
        "--ws",
        project.env["KYRONIX_WS_URL"],
        "--base",
        str(project.base),
        "--root",
    )
    daemon.wait_line(lambda s: s.startswith("connected to "), stderr=True)

    ran = project.example("multi_turn.py")
    assert ran.wait() == 0, ran.log
    printed = ran.stdout
    session_id = re.search(r"^Session: (sess_\w+)$", printed, re.M)
    assert session_id, printed
    for turn in (1, 2):
        block = printed.split(f"Turn {turn} Outcomes:", 1)[1].split("\n")[1:4]
        assert [line.strip().split(":")[0] for line in block] == [
            "write_file",
            "terminal",
            "git_commit",
        ]
        assert block[0].strip() == "write_file: ok"
    assert (project.base / "src" / "migrate.py").is_file()

    counted = re.search(r"^Messages \((\d+)\):$", printed, re.M)
    assert counted, printed
    count = int(counted[1])
    rest = printed.split(f"Messages ({count}):", 1)[1]
    decoder, messages, at = json.JSONDecoder(), [], 0
    while rest[at:].strip():
        at += len(rest[at:]) - len(rest[at:].lstrip())
        message, at = decoder.raw_decode(rest, at)
        messages.append(message)
    assert len(messages) == count
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"] * 2
    assert messages[0]["content"].startswith("Create src/migrate.py")
    tools = [m for m in messages if m["role"] == "tool"]
    assert all("write_file (exec_" in m["content"] for m in tools)
    assert tools[0]["requestId"] != tools[1]["requestId"]

    # the daemon answered both requests, and stops cleanly on SIGTERM
    assert sum(": 3 tool(s)" in line for line in daemon.err) == 2, daemon.log
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0, daemon.log
