"""Every crash window of the batched log: cut a real log inside and between its batches.

A full session is run once on the JSONL store, with the records batched as the fsync budget
batches them (a turn, its verdicts and a start in one write; a read-only receipt riding in the
next one). Then for every record boundary and inside every record (a torn write), the log is cut
there, the world is set to what a crash at that point could have left (each effect whose start is
on disk may have run), and the session is resumed in a fresh agent. Whatever the cut: the log
loads, the run completes, and each side effect happened exactly once.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import ExecutionFinished, ExecutionStarted, JsonlSessionStore, RunEnded
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.tools.base import ToolContext, define_tool

OBJ = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
SCRIPT = [
    {
        "text": "Three things.",
        "tool_calls": [
            {"name": "effect", "input": {"tag": "a"}},
            {"name": "peek", "input": {"tag": "p"}},
            {"name": "peek", "input": {"tag": "q"}},
        ],
    },
    {"tool_calls": [{"name": "peek", "input": {"tag": "r"}}]},
    {"tool_calls": [{"name": "effect", "input": {"tag": "b"}}]},
    {"text": "Done."},
]


def agent(home: Path, ws: Path, mode: str) -> Agent:
    def effect(args: dict[str, Any], ctx: ToolContext) -> str:
        with open(ctx.workspace / "effects.log", "a", encoding="utf-8") as f:
            f.write(args["tag"] + "\n")
        return f"effect {args['tag']}"

    async def peek(args: dict[str, Any]) -> str:
        return f"peeked {args['tag']}"

    return Agent(
        adapter=FauxAdapter(SCRIPT),
        tools=[
            define_tool("effect", "An effect", OBJ, effect, effects="other"),
            define_tool("peek", "A read", OBJ, peek, effects="read"),
        ],
        store=JsonlSessionStore(home),
        workspace=ws,
        mode=mode,
    )


def drive(session: Any, events: Any, ruling: str) -> None:
    for ev in events:
        if ev.type == "approval_request":
            session.approve(ev.call_id)
        elif ev.type == "uncertain":
            for u in ev.executions:
                if not u.auto_rerun:
                    session.resolve(u.execution_id, ruling)


def full_log(tmp_path: Path, mode: str) -> tuple[bytes, Path]:
    home, ws = tmp_path / "full" / "home", tmp_path / "full" / "ws"
    ws.mkdir(parents=True)
    with agent(home, ws, mode).session("s") as session:
        drive(session, session.run_sync("go"), "rerun")
        assert session.state.value == "completed"
        path = Path(session.writer.path or "")
    assert (ws / "effects.log").read_text() == "a\nb\n"
    return path.read_bytes(), path.relative_to(home)


def cut_points(data: bytes) -> list[int]:
    """After the header: every record boundary, and the middle of every record."""
    ends = [i + 1 for i, byte in enumerate(data) if byte == 0x0A]
    points = set(ends)
    for start, end in itertools.pairwise(ends):
        points.add((start + end) // 2)
    return sorted(p for p in points if p >= ends[0])


@pytest.mark.parametrize("mode", ["bypass", "default"])
@pytest.mark.parametrize("ruling", ["applied", "rerun"])
def test_a_cut_anywhere_resumes_to_completion_and_each_effect_happens_once(
    tmp_path: Path, mode: str, ruling: str
) -> None:
    data, relative = full_log(tmp_path, mode)
    points = cut_points(data)
    assert len(points) > 30
    for n, point in enumerate(points):
        home, ws = tmp_path / f"cut{n}" / "home", tmp_path / f"cut{n}" / "ws"
        ws.mkdir(parents=True)
        log = home / relative
        log.parent.mkdir(parents=True, mode=0o700)
        log.write_bytes(data[:point])
        prefix = JsonlSessionStore(home).load("s").events  # the cut log always loads
        finished = {e.execution_id for e in prefix if isinstance(e, ExecutionFinished)}
        # What the crash could have left: a receipted effect ran; a started one ran too when
        # the person will say "applied", and had not when they will say "rerun".
        ran = [
            e.input["tag"]
            for e in prefix
            if isinstance(e, ExecutionStarted)
            and e.name == "effect"
            and (e.execution_id in finished or ruling == "applied")
        ]
        (ws / "effects.log").write_text("".join(f"{tag}\n" for tag in ran))
        with agent(home, ws, mode).session("s") as session:
            if session.fold.open_run is not None:
                drive(session, session.resume_sync(), ruling)
            ends = [e for e in session.events if isinstance(e, RunEnded)]
            if not ends or ends[-1].outcome.code == "no_input":
                # the cut kept no prompt (none, or a run_started torn from its user record):
                # the recovery table ends that run, and the user asks again
                drive(session, session.run_sync("go"), ruling)
            final = list(session.events)
        ends = [e for e in final if isinstance(e, RunEnded)]
        assert ends[-1].outcome.kind == "completed", (point, ends)
        assert all(e.outcome.code == "no_input" for e in ends[:-1]), (point, ends)
        effects = sorted((ws / "effects.log").read_text().split())
        assert effects == ["a", "b"], (point, effects)
        loaded = JsonlSessionStore(home).load("s").events
        assert [json.dumps(e.to_json()) for e in loaded] == [json.dumps(e.to_json()) for e in final]
        shutil.rmtree(tmp_path / f"cut{n}")
