"""Build KML for tests with the real serializer, so arguments arrive exactly as given."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kyronix.executer import KyronixExecuter
from kyronix.kml import Plan, ToolCall, serialize


def kml(*calls: tuple[str, dict[str, str]] | tuple[str, dict[str, str], str]) -> str:
    tools = []
    for c in calls:
        eid = c[2] if len(c) == 3 else uuid.uuid4().hex  # type: ignore[misc]
        tools.append(ToolCall(c[0], dict(c[1]), eid))
    return serialize(Plan(tuple(tools)))


def run(ex: KyronixExecuter, base: Path, tool: str, **args: str) -> dict[str, Any]:
    """Run one tool call and return its ``result`` dict."""
    [entry] = ex.execute_sync(kml((tool, args)), base)
    assert entry["tool"] == tool
    result: dict[str, Any] = entry["result"]
    return result


def ok(ex: KyronixExecuter, base: Path, tool: str, **args: str) -> dict[str, Any]:
    result = run(ex, base, tool, **args)
    assert result["success"], result
    return result


def fail(ex: KyronixExecuter, base: Path, tool: str, **args: str) -> dict[str, Any]:
    result = run(ex, base, tool, **args)
    assert not result["success"], result
    assert result["error"]
    return result
