"""Real MCP servers over stdio and streamable HTTP, called through a real kiso Agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiso.mcp import (
    McpManager,
    ServerConfig,
    ServerState,
    banner_line,
    describe_mcp,
    load_mcp,
    mcp_tools,
)
from kiso.tools.base import AbortSignal, Effects
from tests.mcp.helpers import SERVER, manager, run_agent, stdio_server


def test_time_server_through_an_agent_run(home: Path, workspace: Path) -> None:
    servers = {
        "time": ServerConfig("time", "t", command=sys.executable, args=("-m", "mcp_server_time"))
    }
    with manager(home, servers, os.environ) as m:
        tools = {t.name: t for t in mcp_tools(m)}
        assert tools["mcp__time__get_current_time"].effects is Effects.READ
        turns = [
            {
                "tool_calls": [
                    {"name": "mcp__time__get_current_time", "input": {"timezone": "Asia/Tokyo"}}
                ]
            },
            {"text": "done"},
        ]
        [receipt] = run_agent(home, workspace, m, turns, mode="default")
    assert not receipt.is_error, receipt.content
    assert json.loads(receipt.content)["timezone"] == "Asia/Tokyo"


def test_git_server_through_an_agent_run(home: Path, workspace: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("hello\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first commit"], check=True)
    (repo / "b.txt").write_text("new\n")
    args = ("-m", "mcp_server_git", "--repository", str(repo))
    servers = {"git": ServerConfig("git", "t", command=sys.executable, args=args)}
    with manager(home, servers, os.environ) as m:
        tools = {t.name: t for t in mcp_tools(m)}
        assert tools["mcp__git__git_status"].effects is Effects.READ
        assert tools["mcp__git__git_commit"].effects is Effects.OTHER
        assert not tools["mcp__git__git_commit"].idempotent
        assert tools["mcp__git__git_add"].idempotent
        turns = [
            {
                "tool_calls": [
                    {"name": "mcp__git__git_status", "input": {"repo_path": str(repo)}},
                    {"name": "mcp__git__git_log", "input": {"repo_path": str(repo)}},
                ]
            },
            {"text": "done"},
        ]
        status, log = run_agent(home, workspace, m, turns)
    assert "b.txt" in status.content, status.content
    assert "first commit" in log.content, log.content


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    portfile = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(portfile)])
    try:
        for _ in range(600):
            if portfile.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert portfile.exists(), "the HTTP test server did not start"
        yield f"http://127.0.0.1:{portfile.read_text()}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def test_http_server_with_headers(home: Path, workspace: Path, http_server: str) -> None:
    servers = {
        "web": ServerConfig("web", "t", url=http_server, headers={"X-Test-Token": "t0k"}),
        "nohdr": ServerConfig("nohdr", "t", url=http_server),
    }
    with manager(home, servers, os.environ) as m:
        states = {s.name: s for s in m.status()}
        assert states["web"].state is ServerState.READY
        assert states["nohdr"].state is ServerState.FAILED  # the server refuses it: 401
        assert states["nohdr"].error
        turns = [
            {"tool_calls": [{"name": "mcp__web__echo", "input": {"text": "over http"}}]},
            {"text": "done"},
        ]
        [receipt] = run_agent(home, workspace, m, turns)
    assert receipt.content == "echo: over http"


def test_stdio_child_gets_the_stripped_environment(
    home: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leak")
    monkeypatch.setenv("SOME_VENDOR_API_KEY", "leak")
    monkeypatch.setenv("CLAUDE_CODE_AUTH_TOKEN", "leak")
    monkeypatch.setenv("MY_PROFILE_SECRETLESS_NAME", "leak")  # named by a profile's apiKeyEnv
    monkeypatch.setenv("KISO_MCP_VISIBLE", "yes")
    (home / "mcp.json").parent.mkdir(parents=True, exist_ok=True)
    (home / "mcp.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "t": {
                        "command": sys.executable,
                        "args": [SERVER, "stdio"],
                        "env": {"PER_SERVER": "1", "GITHUB_TOKEN": "explicit"},
                    }
                }
            }
        )
    )
    m, tools, notices = load_mcp(home, workspace, None, ["MY_PROFILE_SECRETLESS_NAME"])
    with m:
        assert notices == []
        assert "mcp__t__env_keys" in {t.name for t in tools}
        turns = [{"tool_calls": [{"name": "mcp__t__env_keys", "input": {}}]}, {"text": "ok"}]
        [receipt] = run_agent(home, workspace, m, turns)
    keys = set(json.loads(receipt.content))
    assert "KISO_MCP_VISIBLE" in keys and "PATH" in keys
    assert {"PER_SERVER", "GITHUB_TOKEN"} <= keys  # the per-server env wins, explicitly
    for leaked in ("OPENAI_API_KEY", "SOME_VENDOR_API_KEY", "CLAUDE_CODE_AUTH_TOKEN"):
        assert leaked not in keys
    assert "MY_PROFILE_SECRETLESS_NAME" not in keys
    assert not [k for k in keys - {"GITHUB_TOKEN"} if k.endswith(("_API_KEY", "_AUTH_TOKEN"))]


def test_a_server_that_cannot_start_is_a_soft_failure(home: Path, workspace: Path) -> None:
    servers = {
        "broken": ServerConfig("broken", "/x/mcp.json", command="kiso-no-such-mcp-server-exe"),
        "t": stdio_server(),
        "off": stdio_server("off", disabled=True),
    }
    with manager(home, servers, os.environ) as m:
        states = {s.name: s for s in m.status()}
        assert states["broken"].state is ServerState.FAILED
        assert "kiso-no-such-mcp-server-exe" in (states["broken"].error or "")
        assert states["t"].state is ServerState.READY
        assert states["off"].state is ServerState.DISABLED
        line = banner_line(m)
        assert line is not None and "1 failed (broken)" in line and "/mcp" in line
        lines = describe_mcp(m)
        assert any(ln.startswith("broken: failed") for ln in lines)
        assert any("error:" in ln and "no such program" in ln for ln in lines)
        assert any("mcp__t__echo" in ln for ln in lines)
        turns = [
            {"tool_calls": [{"name": "mcp__t__echo", "input": {"text": "hi"}}]},
            {"text": "ok"},
        ]
        [receipt] = run_agent(home, workspace, m, turns)
    assert receipt.content == "echo: hi"


def test_cached_tools_register_at_start_and_vanished_ones_fail_clearly(
    home: Path, workspace: Path
) -> None:
    servers = {"t": stdio_server()}
    with manager(home, servers, os.environ):
        pass
    cache = json.loads((home / "mcp-cache.json").read_text())
    assert "echo" in [t["name"] for t in cache["servers"]["t"]["tools"]]
    cache["servers"]["t"]["tools"].append(
        {"name": "gone", "description": "", "inputSchema": {"type": "object"}, "readOnly": True}
    )
    (home / "mcp-cache.json").write_text(json.dumps(cache))
    later = McpManager(servers, env=os.environ, home=home)  # not started: tools from the cache
    at_start = mcp_tools(later)
    assert "mcp__t__gone" in {t.name for t in at_start}
    with later:
        assert later.wait_ready(60)
        turns = [{"tool_calls": [{"name": "mcp__t__gone", "input": {}}]}, {"text": "ok"}]
        [receipt] = run_agent(home, workspace, later, turns, tools=at_start)
    assert receipt.is_error
    assert 'no longer offers the tool "gone"' in receipt.content
    changed = {"t": stdio_server(env={"X": "1"})}  # a changed config: the cache no longer applies
    assert mcp_tools(McpManager(changed, env=os.environ, home=home)) == []


def test_timeout_and_abort(home: Path, tmp_path: Path) -> None:
    import asyncio

    env = {
        **os.environ,
        "MCP_TEST_RUNS": str(tmp_path / "runs"),
        "MCP_TEST_PIDFILE": str(tmp_path / "pid"),
    }
    servers = {"t": stdio_server(timeout=0.5), "u": stdio_server("u")}
    with manager(home, servers, env) as m:
        timed_out = asyncio.run(m.call("t", "slow_read", {"seconds": 30}))
        assert timed_out.error_kind == "timeout" and "timeout" in timed_out.content
        abort = AbortSignal()

        async def aborted_call():  # type: ignore[no-untyped-def]
            task = asyncio.create_task(m.call("u", "slow_read", {"seconds": 30}, abort=abort))
            while not (tmp_path / "pid").exists():
                await asyncio.sleep(0.02)
            abort.set()
            return await task

        result = asyncio.run(aborted_call())
        assert result.error_kind == "aborted"
        # the server is still usable after both
        assert asyncio.run(m.call("u", "echo", {"text": "x"})).content == "echo: x"
    assert not _alive(int((tmp_path / "pid").read_text()))  # close() stopped the children


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
