"""The fsync budget (DURABILITY.md): two fsyncs a round with effects, one a read-only round.

fsyncs are counted by wrapping ``os.fsync`` while a real run drives the JSONL store; the session
is created first, so the header's own fsyncs are not counted. The order the budget keeps is
checked too: nothing with effects runs before its turn, verdict and start are on disk.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import JsonlSessionStore
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.tools.base import ToolContext, define_tool

OBJ = {"type": "object", "properties": {"i": {"type": "integer"}}}


class Fsyncs:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = os.fsync

        def counting(fd: int) -> None:
            self.count += 1
            real(fd)

        monkeypatch.setattr(os, "fsync", counting)


def script(rounds: int, tool: str) -> list[dict[str, Any]]:
    return [
        *({"tool_calls": [{"name": tool, "input": {"i": i}}]} for i in range(rounds)),
        {"text": "done"},
    ]


def agent(tmp_path: Path, rounds: int, tool: str, log_path: list[Path] | None = None) -> Agent:
    log_path = log_path if log_path is not None else []

    async def effect(args: dict[str, Any], ctx: ToolContext) -> str:
        # The round's start must already be on disk when a handler with effects runs.
        text = log_path[0].read_text()
        assert f'"execution_id":"{ctx.execution_id}"' in text
        return "done"

    async def peek(args: dict[str, Any]) -> str:
        return "seen"

    tools = [
        define_tool("effect", "An effect", OBJ, effect, effects="other"),
        define_tool("peek", "A read", OBJ, peek, effects="read"),
        define_tool("put", "An idempotent effect", OBJ, peek, effects="other", idempotent=True),
    ]
    return Agent(
        adapter=FauxAdapter(script(rounds, tool)),
        tools=tools,
        store=JsonlSessionStore(tmp_path / "home"),
        workspace=tmp_path,
        mode="bypass",
        max_turns=rounds + 2,
    )


def run_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounds: int, tool: str) -> int:
    log_path: list[Path] = []
    a = agent(tmp_path, rounds, tool, log_path)
    with a.session("s") as session:
        assert session.writer.path is not None
        log_path.append(Path(session.writer.path))
        fsyncs = Fsyncs(monkeypatch)

        async def go() -> None:
            async for _ in session.run("go"):
                pass

        asyncio.run(go())
        counted = fsyncs.count
        assert session.state.value == "completed"
    return counted


@pytest.mark.parametrize("rounds", [1, 5, 20])
def test_a_round_with_effects_costs_two_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounds: int
) -> None:
    # [run_started, user] first (the prompt is on disk before the model is asked: ADR 0022);
    # then each round: [turn, verdict, start] then [receipt]; the last turn and run_ended: one.
    assert run_counted(tmp_path, monkeypatch, rounds, "effect") == 2 * rounds + 2


@pytest.mark.parametrize("tool", ["peek", "put"])
@pytest.mark.parametrize("rounds", [1, 5, 20])
def test_a_read_only_or_idempotent_round_costs_at_most_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounds: int, tool: str
) -> None:
    # The receipt rides in the next turn's batch; batches queued behind a running fsync share one.
    # Plus the run's start, its own batch (ADR 0022).
    count = run_counted(tmp_path, monkeypatch, rounds, tool)
    assert 2 <= count <= rounds + 2


def test_every_record_of_a_read_only_run_is_on_disk_when_the_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = agent(tmp_path, 10, "peek")
    with a.session("s") as session:
        list(session.run_sync("go"))
        on_disk = JsonlSessionStore(tmp_path / "home").load("s").events
        assert on_disk == tuple(session.events)
        assert session.writer.pending == 0


def test_an_answer_is_durable_before_the_loop_goes_on(tmp_path: Path) -> None:
    a = agent(tmp_path, 1, "effect")
    a_default = Agent(
        adapter=FauxAdapter(script(1, "effect")),
        tools=list(a.tools.values()),
        store=JsonlSessionStore(tmp_path / "home2"),
        workspace=tmp_path,
        mode="default",
    )
    with a_default.session("s") as session:
        for ev in session.run_sync("go"):
            if ev.type == "approval_request":
                # The question is on disk before it is asked...
                loaded = JsonlSessionStore(tmp_path / "home2").load("s").events
                assert loaded[-1].type == "approval_requested"
                session.approve(ev.call_id)
                # ...and the answer before approve() returns.
                loaded = JsonlSessionStore(tmp_path / "home2").load("s").events
                assert loaded[-1].type == "approval_decided"
                break
