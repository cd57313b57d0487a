"""ask_user: questions put through an Asker, answers recorded as the result, resume across kill -9.

This file is also the agent process of its crash tests:

    python -m tests.runtime.test_ask_user HOME WORKSPACE SESSION run|resume answer|hang

``answer`` answers at once; ``hang`` shows the question (writes WORKSPACE/asking) and never
answers. Every question asked is appended to WORKSPACE/asks.log, so a test counts them. The model
asks, then calls ``effect`` (a side effect appended to WORKSPACE/effects.log, whose batch makes
the question's receipt durable before it runs), then ends; on resume an uncertain ``effect`` is
ruled ``rerun``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import (
    ApprovalDecided,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    JsonlSessionStore,
    MemorySessionStore,
    RunEnded,
)
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.runtime.stream import UncertainPending
from kiso.tools.ask_user import Answer, Question, ask_user_tool, interactive_tools
from kiso.tools.base import ToolContext, define_tool

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = [
    {
        "question": "Which database?",
        "header": "Database",
        "options": [
            {"label": "Postgres", "description": "the server one"},
            {"label": "SQLite"},
        ],
    },
    {
        "question": "Which checks in CI?",
        "multiSelect": True,
        "options": [{"label": "lint"}, {"label": "test"}, {"label": "types"}],
    },
]
ANSWERS = (Answer(("Postgres",)), Answer(("lint", "test"), text="and the docs build"))
TURNS: list[Mapping[str, Any]] = [
    {"tool_calls": [{"name": "ask_user", "input": {"questions": QUESTIONS}}]},
    {"text": "Thanks, noted."},
]


class Scripted:
    """An Asker that replies from a list and remembers what it was asked."""

    def __init__(self, *replies: Sequence[Answer] | None) -> None:
        self.replies = list(replies)
        self.asked: list[Sequence[Question]] = []

    async def ask(self, questions: Sequence[Question]) -> Sequence[Answer] | None:
        self.asked.append(questions)
        return self.replies.pop(0)


def run(
    tmp_path: Path, asker: Scripted, turns: list[Mapping[str, Any]] = TURNS, mode: str = "default"
) -> tuple[list[str], list[Any]]:
    agent = Agent(
        adapter=FauxAdapter(turns),
        tools=interactive_tools(asker),
        store=MemorySessionStore(),
        workspace=tmp_path,
        mode=mode,
    )
    with agent.session("s") as session:
        seen = [ev.type for ev in session.run_sync("set up the project")]
        return seen, list(session.events)


def receipts(events: list[Any]) -> list[ExecutionFinished]:
    return [e for e in events if isinstance(e, ExecutionFinished)]


@pytest.mark.parametrize("mode", ["default", "plan"])
def test_the_answers_are_the_result_and_are_recorded_with_no_approval_asked(
    tmp_path: Path, mode: str
) -> None:
    asker = Scripted(ANSWERS)
    seen, events = run(tmp_path, asker, mode=mode)
    assert "approval_request" not in seen and seen[-1] == "terminal"
    (asked,) = asker.asked
    assert [q.question for q in asked] == ["Which database?", "Which checks in CI?"]
    assert asked[0].header == "Database" and asked[1].multi_select
    assert [o.label for o in asked[1].options] == ["lint", "test", "types"]
    (receipt,) = receipts(events)
    assert not receipt.is_error
    assert "Which database?\n   -> Postgres" in receipt.content
    assert "-> lint, test; (typed) and the docs build" in receipt.content


def test_a_declined_question_says_so_with_its_options(tmp_path: Path) -> None:
    _, events = run(tmp_path, Scripted(None))
    (receipt,) = receipts(events)
    assert not receipt.is_error
    assert "declined" in receipt.content
    assert "Which database? [Postgres | SQLite]" in receipt.content


def test_answers_that_do_not_fit_the_questions_are_an_error(tmp_path: Path) -> None:
    bad = (Answer(("Postgres", "SQLite")), Answer(("lint",)))  # two picks, single choice
    _, events = run(tmp_path, Scripted(bad))
    (receipt,) = receipts(events)
    assert receipt.is_error and "single-choice" in receipt.content


@pytest.mark.parametrize(
    ("questions", "said"),
    [
        ([QUESTIONS[0]] * 5, "questions"),
        ([{"question": "Q?", "options": [{"label": "only one"}]}], "options"),
    ],
)
def test_malformed_questions_are_refused_before_anyone_is_asked(
    tmp_path: Path, questions: list[Any], said: str
) -> None:
    asker = Scripted()
    turns: list[Mapping[str, Any]] = [
        {"tool_calls": [{"name": "ask_user", "input": {"questions": questions}}]},
        {"text": "ok"},
    ]
    _, events = run(tmp_path, asker, turns)
    assert asker.asked == []
    (denied,) = [e for e in events if isinstance(e, ApprovalDecided)]
    assert denied.decision == "denied" and denied.decided_by == "schema"
    assert said in (denied.reason or "")


def test_duplicate_labels_are_an_error_result() -> None:
    tool = ask_user_tool(Scripted())
    q = {"question": "Q?", "options": [{"label": "a"}, {"label": "a"}]}
    result = asyncio.run(tool.run({"questions": [q]}, ToolContext(Path("."), "s:1")))
    assert result.is_error and "labels must differ" in result.content


def test_it_is_rerun_on_resume_and_needs_no_approval() -> None:
    (tool,) = interactive_tools(Scripted())
    assert tool.name == "ask_user" and tool.rerunnable and tool.read_only


# ------------------------------------------------------------------------------- kill -9


class FileAsker:
    def __init__(self, ws: Path, behaviour: str) -> None:
        self.ws, self.behaviour = ws, behaviour

    async def ask(self, questions: Sequence[Question]) -> Sequence[Answer] | None:
        with open(self.ws / "asks.log", "a", encoding="utf-8") as f:
            f.write(json.dumps([q.question for q in questions]) + "\n")
        if self.behaviour == "hang":
            (self.ws / "asking").write_text("on screen\n")
            await asyncio.Event().wait()
        return ANSWERS


def _effect(args: dict[str, Any], ctx: ToolContext) -> str:
    with open(ctx.workspace / "effects.log", "a", encoding="utf-8") as f:
        f.write(args["tag"] + "\n")
    return f"effect {args['tag']}"


DRIVER_TURNS: list[Mapping[str, Any]] = [
    TURNS[0],
    {"tool_calls": [{"name": "effect", "input": {"tag": "configured"}}]},
    TURNS[1],
]


def driver(home: str, ws: str, session_id: str, command: str, behaviour: str) -> int:
    obj = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
    agent = Agent(
        adapter=FauxAdapter(DRIVER_TURNS),
        tools=[
            *interactive_tools(FileAsker(Path(ws), behaviour)),
            define_tool("effect", "Record a side effect", obj, _effect, effects="other"),
        ],
        store=JsonlSessionStore(home),
        workspace=Path(ws),
        mode="bypass",
    )
    with agent.session(session_id) as session:
        events = session.run_sync("set up") if command == "run" else session.resume_sync()
        for ev in events:
            print(ev.type, flush=True)
            if isinstance(ev, UncertainPending):
                for u in ev.executions:
                    if not u.auto_rerun:
                        session.resolve(u.execution_id, "rerun")
    return 0


def _argv(home: Path, ws: Path) -> list[str]:
    return [sys.executable, "-m", "tests.runtime.test_ask_user", str(home), str(ws), "k9"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KISO_FAILPOINT", "KISO_FAUX_SCRIPT")}
    return {**env, **extra}


def _asks(ws: Path) -> int:
    path = ws / "asks.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _resume(home: Path, ws: Path) -> list[Any]:
    done = subprocess.run(
        [*_argv(home, ws), "resume", "answer"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return list(JsonlSessionStore(home).load("k9").events)


def test_an_answer_on_disk_is_not_asked_again_after_kill9(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    killed = subprocess.run(
        [*_argv(home, ws), "run", "answer"],
        cwd=ROOT, env=_env(KISO_FAILPOINT="execution_finished"), capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = list(JsonlSessionStore(home).load("k9").events)
    assert not any(isinstance(e, RunEnded) for e in before)
    (receipt,) = receipts(before)  # the answer is on disk, the effect has not run
    assert "-> Postgres" in receipt.content
    assert _asks(ws) == 1 and not (ws / "effects.log").exists()

    after = _resume(home, ws)
    assert _asks(ws) == 1  # the answer on disk was used: nobody was asked again
    assert receipts(after)[0].content == receipt.content
    assert (ws / "effects.log").read_text() == "configured\n"
    # the effect's start may or may not have been durable before the kill (it is appended
    # beside the answer's finish): if it was, its rerun is a second start; it ran once either way
    started_before = [e.name for e in before if isinstance(e, ExecutionStarted)]
    effect_starts = 2 if "effect" in started_before else 1
    assert [e.name for e in after if isinstance(e, ExecutionStarted)] == [
        "ask_user", *["effect"] * effect_starts
    ]  # fmt: skip
    assert isinstance(after[-1], RunEnded) and after[-1].outcome.kind == "completed"


def test_a_question_killed_on_screen_is_asked_again_on_resume(tmp_path: Path) -> None:
    home, ws = tmp_path / "home", tmp_path / "ws"
    ws.mkdir()
    agent = subprocess.Popen(
        [*_argv(home, ws), "run", "hang"],
        cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            logs = list(home.glob("projects/*/k9.jsonl"))
            started = bool(logs) and '"type":"execution_started"' in logs[0].read_text()
            if started and (ws / "asking").exists():
                break
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
            time.sleep(0.05)
        else:
            raise AssertionError("the question was never put on screen")
        os.kill(agent.pid, signal.SIGKILL)
        assert agent.wait(10) == -signal.SIGKILL
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if agent.stderr:
            agent.stderr.close()
    before = list(JsonlSessionStore(home).load("k9").events)
    assert receipts(before) == [] and _asks(ws) == 1

    after = _resume(home, ws)
    assert _asks(ws) == 2  # asked again
    (ruling,) = [e for e in after if isinstance(e, ExecutionResolved)]
    assert ruling.resolution == "rerun" and ruling.decided_by == "policy:idempotent"
    starts = [e for e in after if isinstance(e, ExecutionStarted)]
    assert [s.name for s in starts] == ["ask_user", "ask_user", "effect"]
    receipt = receipts(after)[0]
    assert receipt.execution_id == starts[1].execution_id and "-> Postgres" in receipt.content
    assert (ws / "effects.log").read_text() == "configured\n"
    assert isinstance(after[-1], RunEnded) and after[-1].outcome.kind == "completed"


if __name__ == "__main__":
    sys.exit(driver(*sys.argv[1:]))
