"""Shared pieces for the MCP tests: the test server's command, an Agent run, log reading."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kiso.kernel import ExecutionFinished, JsonlSessionStore
from kiso.mcp import McpManager, ServerConfig, mcp_tools
from kiso.providers.faux import FauxAdapter
from kiso.runtime import Agent
from kiso.tools.base import Tool

SERVER = str(Path(__file__).with_name("server.py"))


def stdio_server(name: str = "t", **kw: Any) -> ServerConfig:
    return ServerConfig(name, "test", command=sys.executable, args=(SERVER, "stdio"), **kw)


def manager(home: Path, servers: Mapping[str, ServerConfig], env: Mapping[str, str]) -> McpManager:
    m = McpManager(servers, env=env, home=home)
    m.start()
    assert m.wait_ready(60)
    return m


def run_agent(
    home: Path,
    workspace: Path,
    m: McpManager,
    turns: list[dict[str, Any]],
    *,
    mode: str = "bypass",
    tools: list[Tool] | None = None,
) -> list[ExecutionFinished]:
    """Run one prompt through a real Agent with the scripted model; the receipts in its log."""
    agent = Agent(
        tools=mcp_tools(m) if tools is None else tools,
        store=JsonlSessionStore(home),
        adapter=FauxAdapter(turns),
        workspace=workspace,
        mode=mode,
        home=home,
    )
    with agent.session(id="s1") as session:
        events = list(session.run_sync("go"))
        assert events[-1].type == "terminal"
    return receipts(home, "s1")


def receipts(home: Path, session_id: str) -> list[ExecutionFinished]:
    log = JsonlSessionStore(home).load(session_id)
    return [e for e in log.events if isinstance(e, ExecutionFinished)]
