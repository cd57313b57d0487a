"""An MCP stdio server runs in the session's OS sandbox: it writes in the workspace, nowhere
else, unless your own mcp.json takes it out (a project's may not)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kiso.mcp import McpConfigError, McpManager, parse_config
from kiso.tools.sandbox import SandboxPolicy
from tests.mcp.helpers import run_agent, stdio_server


def _manager(home: Path, workspace: Path, runs: Path, **kw: object) -> McpManager:
    env = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
        "MCP_TEST_RUNS": str(runs),
        "MCP_TEST_PIDFILE": str(runs.with_suffix(".pid")),
    }
    m = McpManager(
        {"t": stdio_server(**kw)}, env=env, home=home, cwd=workspace, sandbox=SandboxPolicy()
    )
    m.start()
    assert m.wait_ready(60)
    return m


CALL = [{"tool_calls": [{"name": "mcp__t__slow_write", "input": {"seconds": 0}}]}, {"text": "ok"}]


@pytest.mark.parametrize("inside", [True, False])
def test_a_sandboxed_server_writes_only_in_the_workspace(
    home: Path, workspace: Path, tmp_path: Path, inside: bool
) -> None:
    runs = (workspace if inside else tmp_path) / "runs.txt"
    m = _manager(home, workspace, runs)
    try:
        (receipt,) = run_agent(home, workspace, m, CALL)
    finally:
        m.close()
    if inside:
        assert not receipt.is_error and runs.read_text() == "write\n"
    else:
        assert receipt.is_error  # the server could not write there (see the next test)
        assert not runs.exists()


def test_your_own_config_may_take_a_server_out_of_the_sandbox(
    home: Path, workspace: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.txt"
    m = _manager(home, workspace, runs, sandbox=False)
    try:
        (receipt,) = run_agent(home, workspace, m, CALL)
    finally:
        m.close()
    assert not receipt.is_error and runs.read_text() == "write\n"


def test_only_your_own_mcp_json_may_loosen_a_servers_sandbox() -> None:
    data = json.dumps(
        {
            "mcpServers": {
                "x": {"command": "x", "sandbox": {"network": True, "writableRoots": ["/srv"]}}
            }
        }
    )
    (server,) = parse_config(data, "user mcp.json").values()
    assert (server.sandbox, server.network, server.writable_roots) == (True, True, ("/srv",))
    off = parse_config(json.dumps({"mcpServers": {"x": {"command": "x", "sandbox": False}}}), "u")
    assert off["x"].sandbox is False
    with pytest.raises(McpConfigError, match=r"a project's mcp\.json may not loosen"):
        parse_config(data, "project mcp.json", project=True)
    with pytest.raises(McpConfigError, match=r"sandbox\.net: unknown key"):
        parse_config(
            json.dumps({"mcpServers": {"x": {"command": "x", "sandbox": {"net": 1}}}}), "u"
        )
