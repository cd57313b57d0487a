"""MCP servers as kiso tools (docs/mcp.md).

    manager, tools, notices = load_mcp(home, workspace, gate.project_files, strip_env)
    agent = Agent(tools=[*builtin, *tools], strip_env=strip_env, ...)
    ...
    manager.close()

``$KISO_HOME/mcp.json`` and, once the project is trusted, ``<project>/.kiso/mcp.json`` (read
from the trust gate's snapshot, never from disk again) list the servers; each tool becomes
``mcp__<server>__<tool>``. A server that fails is a soft failure shown by
:func:`banner_line` and :func:`describe_mcp`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from kiso.mcp.cache import CACHE_FILE, McpToolInfo, ToolCache
from kiso.mcp.client import DEFAULT_CONNECT_TIMEOUT, McpManager, ServerState, ServerStatus
from kiso.mcp.config import (
    DEFAULT_TIMEOUT,
    MCP_FILE,
    McpConfigError,
    ServerConfig,
    merge_layers,
    parse_config,
)
from kiso.mcp.tools import make_tool, mcp_tool_name, mcp_tools
from kiso.runtime.trust import PROJECT_DIR, Snapshot
from kiso.tools.base import Tool
from kiso.tools.env import child_env
from kiso.tools.sandbox import SandboxPolicy

__all__ = [
    "CACHE_FILE",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "MCP_FILE",
    "McpConfigError",
    "McpManager",
    "McpToolInfo",
    "ServerConfig",
    "ServerState",
    "ServerStatus",
    "ToolCache",
    "banner_line",
    "describe_mcp",
    "load_configs",
    "load_mcp",
    "make_tool",
    "mcp_tool_name",
    "mcp_tools",
    "merge_layers",
    "parse_config",
]

FIRST_CONNECT_WAIT = 15.0
"""Seconds :func:`load_mcp` waits for servers with no cached tool list (their first start)."""


def load_configs(
    home: Path,
    workspace: Path,
    project_files: Snapshot | Mapping[str, bytes] | None,
) -> dict[str, ServerConfig]:
    """The servers of ``$KISO_HOME/mcp.json`` and of the project's ``.kiso/mcp.json`` (taken
    from ``project_files``: the trust gate's bytes, None when the project is not applied)."""
    user: dict[str, ServerConfig] = {}
    path = Path(home) / MCP_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    except OSError as exc:
        raise McpConfigError(f"{path}: cannot be read ({exc.strerror}); fix or remove it") from None
    if data is not None:
        user = parse_config(data, str(path))
    files = project_files.contents if isinstance(project_files, Snapshot) else project_files
    project: dict[str, ServerConfig] = {}
    if files is not None and MCP_FILE in files:
        source = str(Path(workspace) / PROJECT_DIR / MCP_FILE)
        project = parse_config(files[MCP_FILE], source, project=True)
    return merge_layers(user, project)


def load_mcp(
    home: Path,
    workspace: Path,
    project_files: Snapshot | Mapping[str, bytes] | None,
    strip_env: Iterable[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
    first_connect_wait: float = FIRST_CONNECT_WAIT,
    sandbox: SandboxPolicy | None = None,
) -> tuple[McpManager, list[Tool], list[str]]:
    """Read the configs, start every server in the background and return the manager, the
    tools to register and the notices to show (one banner line when a server failed).

    Servers with a cached tool list register those tools at once; those without one (a first
    start, or a changed config) are waited for, up to ``first_connect_wait`` seconds. Raises
    :class:`McpConfigError` for a bad ``mcp.json`` (the message names the file and key).
    ``sandbox``: the session's OS sandbox, which stdio servers run in (docs/sandbox.md).
    """
    servers = load_configs(home, workspace, project_files)
    env = child_env(os.environ if environ is None else environ, also_strip=strip_env)
    manager = McpManager(servers, env=env, home=Path(home), cwd=Path(workspace), sandbox=sandbox)
    manager.start()
    uncached = [n for n, cfg in servers.items() if not cfg.disabled and not manager.has_cache(n)]
    if uncached:
        manager.wait_ready(first_connect_wait, uncached)
    tools = mcp_tools(manager)
    line = banner_line(manager)
    return manager, tools, [line] if line else []


def banner_line(manager: McpManager) -> str | None:
    """One line for the banner when something needs saying: failed or still-connecting
    servers. None when every enabled server is ready (or none is configured)."""
    statuses = [s for s in manager.status() if s.state is not ServerState.DISABLED]
    failed = [s.name for s in statuses if s.state is ServerState.FAILED]
    connecting = [s.name for s in statuses if s.state is ServerState.CONNECTING]
    if not failed and not connecting:
        return None
    ready = sum(s.state is ServerState.READY for s in statuses)
    parts = [f"{ready} ready"]
    if connecting:
        parts.append(f"{len(connecting)} connecting")
    if failed:
        parts.append(f"{len(failed)} failed ({', '.join(failed)})")
    return f"MCP: {', '.join(parts)}; /mcp for details"


def describe_mcp(manager: McpManager) -> list[str]:
    """The lines ``/mcp`` prints: each server's state, transport, tools and last error."""
    statuses = manager.status()
    if not statuses:
        return [f"no MCP servers configured (add them to $KISO_HOME/{MCP_FILE})"]
    lines: list[str] = []
    for s in statuses:
        lines.append(f"{s.name}: {s.state.value} ({s.transport}, from {s.source})")
        if s.tools:
            names = ", ".join(mcp_tool_name(s.name, t) for t in s.tools)
            lines.append(f"  tools: {names}")
        elif s.state is ServerState.READY:
            lines.append("  tools: none")
        if s.error and s.state is ServerState.FAILED:
            lines.append(f"  error: {s.error}")
    return lines
