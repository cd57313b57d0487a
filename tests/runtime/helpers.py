"""Shared pieces for runtime tests: tools with real effects, and log checks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiso.kernel import Event, JsonlSessionStore, RunEnded, RunStarted
from kiso.tools.base import Tool, ToolContext, define_tool

OBJ = {"type": "object", "additionalProperties": False}


def note_tool(path: Path) -> Tool:
    """Appends a line to ``path``: a side effect whose every execution can be counted."""

    def execute(args: dict[str, Any], ctx: ToolContext) -> str:
        with open(path, "a", encoding="utf-8") as f:
            f.write(args["line"] + "\n")
        return f"noted {args['line']}"

    return define_tool(
        "note",
        "Append a line to the notes file",
        {**OBJ, "properties": {"line": {"type": "string"}}, "required": ["line"]},
        execute,
        effects="edit",
    )


def sleepy_read(name: str = "slow_read", seconds: float = 0.3) -> Tool:
    async def execute(args: dict[str, Any], ctx: ToolContext) -> str:
        began = time.monotonic()
        await asyncio.sleep(seconds)
        return f"{args.get('key', '')}@{began:.3f}"

    return define_tool(
        name,
        "Read something slowly",
        {**OBJ, "properties": {"key": {"type": "string"}}},
        execute,
        effects="read",
    )


def store(tmp_path: Path) -> JsonlSessionStore:
    return JsonlSessionStore(tmp_path / "home")


def assert_runs_end_once(events: Sequence[Event]) -> None:
    """Every run that started before the last one ended exactly once, after its start."""
    started = [e.run for e in events if isinstance(e, RunStarted)]
    ended = [e.run for e in events if isinstance(e, RunEnded)]
    assert len(ended) == len(set(ended)), ended
    assert set(ended) <= set(started)
    for run in ended:
        assert [e.type for e in events if e.run == run][-1] == "run_ended"


def types(events: Sequence[Event]) -> list[str]:
    return [e.type for e in events]
