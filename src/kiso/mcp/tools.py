"""MCP tools as kiso tools: ``mcp__<server>__<tool>``, the server's input schema, its hints.

The annotations decide kiso's effects, and so the approval and resume rules:

==============================  ===============================================================
``readOnlyHint: true``          effects ``read``: allowed in every mode, re-run after a crash
``idempotentHint: true``        effects ``other``, ``idempotent=True``: asks, re-run after a crash
anything else (or none)         effects ``other``: asks; uncertain after a crash (a human rules)
==============================  ===============================================================
"""

from __future__ import annotations

import re
from typing import Any

from kiso.mcp.cache import McpToolInfo
from kiso.mcp.client import McpManager
from kiso.tools.base import Effects, Tool, ToolContext, ToolResult, define_tool

__all__ = ["PREFIX", "make_tool", "mcp_tool_name", "mcp_tools"]

PREFIX = "mcp__"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def mcp_tool_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>``; characters a tool name cannot hold become ``_``."""
    return f"{PREFIX}{server}__{_UNSAFE.sub('_', tool)}"


def make_tool(manager: McpManager, server: str, info: McpToolInfo) -> Tool:
    async def execute(input: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await manager.call(server, info.name, input, abort=ctx.abort)

    schema = dict(info.input_schema)
    if schema.get("type") != "object":
        schema = {"type": "object", **{k: v for k, v in schema.items() if k != "type"}}
    description = info.description or f"{info.name} (from the MCP server {server})"
    return define_tool(
        mcp_tool_name(server, info.name),
        description,
        schema,
        execute,
        effects=Effects.READ if info.read_only else Effects.OTHER,
        idempotent=info.idempotent,
    )


def mcp_tools(manager: McpManager) -> list[Tool]:
    """A kiso tool for every tool the manager knows (live or cached), skipping a name that two
    of a server's tools would share once made safe."""
    tools: list[Tool] = []
    seen: set[str] = set()
    for status in manager.status():
        for info in manager.tools_of(status.name):
            name = mcp_tool_name(status.name, info.name)
            if name in seen:
                continue
            seen.add(name)
            tools.append(make_tool(manager, status.name, info))
    return tools
