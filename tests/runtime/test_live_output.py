"""Live tool output: ``tool_output`` events while a tool runs, shown and never logged."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from kiso.kernel import ExecutionFinished, RunEnded
from kiso.providers import FauxAdapter
from kiso.runtime import Agent, RunEvent, ToolEnd, ToolOutput, ToolStart
from kiso.tools import builtin_tools
from kiso.tools.base import Tool, ToolContext, define_tool

from .helpers import OBJ, assert_runs_end_once, store, types

SLOW_LINES = "for i in 1 2 3; do echo line$i; sleep 0.2; done"


def shell_agent(tmp_path: Path, command: str) -> Agent:
    return Agent(
        adapter=FauxAdapter(
            [{"tool_calls": [{"name": "shell", "input": {"command": command}}]}, {"text": "done"}]
        ),
        tools=builtin_tools(),
        store=store(tmp_path),
        workspace=tmp_path,
        mode="bypass",
    )


def test_a_slow_command_streams_its_output_between_start_and_end(tmp_path: Path) -> None:
    seen: list[tuple[float, RunEvent]] = []
    with shell_agent(tmp_path, SLOW_LINES).session("s") as session:
        for event in session.run_sync("count"):
            seen.append((time.monotonic(), event))
        log = types(session.events)
    tool_events = [(at, e) for at, e in seen if e.type.startswith("tool_")]
    kinds = [e.type for _, e in tool_events]
    assert kinds[0] == "tool_start" and kinds[-1] == "tool_end"
    assert set(kinds[1:-1]) == {"tool_output"}, kinds
    (_, start), *outputs, (end_at, end) = tool_events
    assert isinstance(start, ToolStart) and isinstance(end, ToolEnd)
    texts = []
    for _, out in outputs:
        assert isinstance(out, ToolOutput)
        assert out.call == start.call
        assert out.execution_id == start.event.execution_id
        texts.append(out.text)
    assert "".join(texts) == "line1\nline2\nline3\n"
    assert end.event.content == "line1\nline2\nline3\nexit 0"
    first_at = outputs[0][0]
    assert end_at - first_at > 0.3, "the first output arrived only when the command ended"

    # The log holds what it held before live output existed: no record of the chunks.
    assert log == [
        "run_started",
        "user",
        "assistant",
        "approval_decided",
        "execution_started",
        "execution_finished",
        "assistant",
        "run_ended",
    ]
    reloaded = store(tmp_path).load("s").events
    assert types(reloaded) == log
    mentions = [e.type for e in reloaded if "line1" in json.dumps(e.to_json())]
    assert mentions == ["execution_finished"]


def talker(name: str, *, threaded: bool) -> Tool:
    """A read-only tool that reports three lines through ``ctx.on_output`` as it goes."""

    def execute_sync(args: dict[str, Any], ctx: ToolContext) -> str:
        for i in range(3):
            ctx.progress(f"{name}{i}\n")
            time.sleep(0.05)
        return f"{name} done"

    async def execute_async(args: dict[str, Any], ctx: ToolContext) -> str:
        for i in range(3):
            ctx.progress(f"{name}{i}\n")
            await asyncio.sleep(0.05)
        return f"{name} done"

    return define_tool(
        name,
        "Talk while reading",
        {**OBJ, "properties": {}},
        execute_sync if threaded else execute_async,
        effects="read",
    )


def test_reads_in_a_parallel_batch_both_stream_their_output(tmp_path: Path) -> None:
    agent = Agent(
        adapter=FauxAdapter(
            [
                {"tool_calls": [{"name": "left", "input": {}}, {"name": "right", "input": {}}]},
                {"text": "done"},
            ]
        ),
        tools=[talker("left", threaded=True), talker("right", threaded=False)],
        store=store(tmp_path),
        workspace=tmp_path,
    )
    with agent.session("s") as session:
        seen = [e for e in session.run_sync("talk") if e.type.startswith("tool_")]
        assert "tool_output" not in types(session.events)
    assert [e.type for e in seen].count("tool_end") == 2
    for name in ("left", "right"):
        mine = [e for e in seen if isinstance(e, ToolStart | ToolOutput | ToolEnd)]
        mine = [e for e in mine if e.call.name == name]
        outputs = [e for e in mine if isinstance(e, ToolOutput)]
        assert [e.type for e in mine] == ["tool_start"] + ["tool_output"] * len(outputs) + [
            "tool_end"
        ]
        assert "".join(e.text for e in outputs) == f"{name}0\n{name}1\n{name}2\n"


def test_abort_during_live_output_still_kills_the_command(tmp_path: Path) -> None:
    agent = shell_agent(tmp_path, "while true; do echo tick; sleep 0.05; done")
    with agent.session("s") as session:
        outputs = 0
        for event in session.run_sync("tick"):
            if isinstance(event, ToolOutput):
                outputs += 1
                if outputs == 1:
                    threading.Timer(0.2, session.abort).start()
        assert outputs >= 1
        ended = session.events[-1]
        assert isinstance(ended, RunEnded) and ended.outcome.kind == "aborted"
        finished = next(e for e in session.events if isinstance(e, ExecutionFinished))
        assert finished.error_kind == "aborted" and finished.content.startswith("tick\n")
        assert_runs_end_once(session.events)
