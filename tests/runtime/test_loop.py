"""The loop: turn commit, approvals, execution order, retries, limits, abort."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import (
    ApprovalDecided,
    ExecutionFinished,
    ExecutionStarted,
    KisoError,
    RunEnded,
    ToolResultMessage,
    project,
)
from kiso.providers import FauxAdapter, ModelRequest, StreamEvent, TextDelta, TurnDone
from kiso.runtime import Agent
from kiso.runtime.approvals import CallContext, Verdict
from kiso.tools.base import ToolContext, define_tool

from .helpers import OBJ, assert_runs_end_once, note_tool, sleepy_read, store, types


def agent_for(tmp_path: Path, turns: list[dict[str, Any]], **kw: Any) -> Agent:
    kw.setdefault("tools", [note_tool(tmp_path / "notes.txt"), sleepy_read()])
    return Agent(
        adapter=FauxAdapter(turns),
        store=store(tmp_path),
        workspace=tmp_path,
        retry_base_delay=0.01,
        **kw,
    )


def note(line: str) -> dict[str, Any]:
    return {"name": "note", "input": {"line": line}}


def test_an_approved_call_runs_once_and_the_run_completes(tmp_path: Path) -> None:
    agent = agent_for(tmp_path, [{"tool_calls": [note("one")]}, {"text": "done"}])
    with agent.session("s") as session:
        seen = []
        for ev in session.run_sync("write one"):
            seen.append(ev.type)
            if ev.type == "approval_request":
                session.approve(ev.call_id)
        assert seen == [
            "model_turn",
            "approval_request",
            "decision",  # the person's answer, as every decision record is reported
            "tool_start",
            "tool_end",
            "text_delta",
            "model_turn",
            "terminal",
        ]
        assert (tmp_path / "notes.txt").read_text() == "one\n"
        kinds = types(session.events)
        assert kinds == [
            "run_started",
            "user",
            "assistant",
            "approval_requested",
            "approval_decided",
            "execution_started",
            "execution_finished",
            "assistant",
            "run_ended",
        ]
        decided = next(e for e in session.events if isinstance(e, ApprovalDecided))
        assert decided.decided_by == "user"
        assert_runs_end_once(session.events)
        assert session.state.value == "completed"


def test_an_unanswered_question_pauses_and_survives_a_new_process(tmp_path: Path) -> None:
    agent = agent_for(tmp_path, [{"tool_calls": [note("one")]}, {"text": "done"}])
    with agent.session("s") as session:
        seen = [ev.type for ev in session.run_sync("write one")]
        assert seen[-2:] == ["approval_request", "paused"]
        assert session.state.value == "awaiting_approval"
    assert not (tmp_path / "notes.txt").exists()
    # a new agent, as a new process would build it
    again = agent_for(tmp_path, [{"tool_calls": [note("one")]}, {"text": "done"}])
    with again.session("s") as session:
        assert session.state.value == "awaiting_approval"
        asked = [ev for ev in session.resume_sync()]
        assert [ev.type for ev in asked] == ["approval_request", "paused"]  # the same question
        session.approve(asked[0].call_id)  # type: ignore[union-attr]  # persisted directly
        rest = [ev.type for ev in session.resume_sync()]
        assert rest[-1] == "terminal"
        assert (tmp_path / "notes.txt").read_text() == "one\n"
        assert_runs_end_once(session.events)


def test_a_denied_call_is_an_error_result_the_model_sees(tmp_path: Path) -> None:
    agent = agent_for(tmp_path, [{"tool_calls": [note("x")]}, {"text": "ok, I won't"}])
    with agent.session("s") as session:
        for ev in session.run_sync("write"):
            if ev.type == "approval_request":
                session.deny(ev.call_id, "not today")
        (result,) = [m for m in project(session.events) if isinstance(m, ToolResultMessage)]
        assert result.is_error and "not today" in result.content
        assert not (tmp_path / "notes.txt").exists()


class CountingPolicy:
    name = "extension:counter"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def decide(self, ctx: CallContext) -> Verdict | None:
        self.calls.append(ctx.call.call_id)
        return None


def test_a_persisted_verdict_is_never_asked_again_nor_the_policy_consulted(
    tmp_path: Path,
) -> None:
    script = [{"tool_calls": [note("a"), note("b")]}, {"text": "done"}]
    counter = CountingPolicy()
    agent = agent_for(tmp_path, script, policies=[counter])
    with agent.session("s") as session:
        asked = [ev.call_id for ev in session.run_sync("go") if ev.type == "approval_request"]
        assert asked == ["call_0_0", "call_0_1"]
        session.approve("call_0_0")
    assert counter.calls == ["call_0_0", "call_0_1"]
    counter2 = CountingPolicy()
    agent2 = agent_for(tmp_path, script, policies=[counter2])
    with agent2.session("s") as session:
        asked = [ev.call_id for ev in session.resume_sync() if ev.type == "approval_request"]
        assert asked == ["call_0_1"]  # call_0_0 was decided: not asked again
        assert counter2.calls == []  # and no policy was consulted for either
        session.approve("call_0_1")
        assert [e.type for e in session.resume_sync()][-1] == "terminal"
    assert (tmp_path / "notes.txt").read_text() == "a\nb\n"


def test_bad_input_and_unknown_tools_are_denied_not_raised(tmp_path: Path) -> None:
    script = [
        {
            "tool_calls": [
                {"name": "note", "input": {"line": 5}},
                {"name": "teleport", "input": {}},
            ]
        },
        {"text": "sorry"},
    ]
    agent = agent_for(tmp_path, script, mode="bypass")
    with agent.session("s") as session:
        assert [ev.type for ev in session.run_sync("go")][-1] == "terminal"
        verdicts = [e for e in session.events if isinstance(e, ApprovalDecided)]
        assert [(v.decision, v.decided_by) for v in verdicts] == [
            ("denied", "schema"),
            ("denied", "runtime"),
        ]
        assert "line: 5 is not of type 'string'" in (verdicts[0].reason or "")
        assert "no tool named 'teleport'" in (verdicts[1].reason or "")
        assert not any(isinstance(e, ExecutionStarted) for e in session.events)


def test_reads_run_in_parallel_and_results_project_in_call_order(tmp_path: Path) -> None:
    active, most = 0, 0

    async def overlap(args: dict[str, Any]) -> str:
        nonlocal active, most
        active += 1
        most = max(most, active)
        await asyncio.sleep(0.05)  # long enough for the others to start, if they run alongside
        active -= 1
        return f"{args['key']}@{most}"

    read = define_tool(
        "slow_read", "Read", {**OBJ, "properties": {"key": {}}}, overlap, effects="read"
    )
    calls = [{"name": "slow_read", "input": {"key": k}} for k in "abc"]
    agent = agent_for(tmp_path, [{"tool_calls": calls}, {"text": "read"}], tools=[read])
    with agent.session("s") as session:
        for _ in session.run_sync("read three"):
            pass
        assert most == 3  # all three were running at once: in parallel, counted, not timed
        kinds = [e.type for e in session.events if e.type.startswith("execution")]
        assert kinds[:3] == ["execution_started"] * 3
        results = [m for m in project(session.events) if isinstance(m, ToolResultMessage)]
        assert [r.content.split("@")[0] for r in results] == ["a", "b", "c"]


def test_writes_run_one_at_a_time_in_call_order(tmp_path: Path) -> None:
    agent = agent_for(
        tmp_path, [{"tool_calls": [note("1"), note("2"), note("3")]}, {"text": "ok"}], mode="bypass"
    )
    with agent.session("s") as session:
        list(session.run_sync("go"))
        kinds = [e.type for e in session.events if e.type.startswith("execution")]
        assert kinds == ["execution_started", "execution_finished"] * 3
    assert (tmp_path / "notes.txt").read_text() == "1\n2\n3\n"


def test_retryable_errors_are_retried_and_others_end_the_run(tmp_path: Path) -> None:
    script = [{"error": {"status": 429, "message": "slow down"}}, {"text": "hello"}]
    with agent_for(tmp_path, script).session("s") as session:
        seen = list(session.run_sync("hi"))
        assert [e.type for e in seen] == ["retry", "text_delta", "model_turn", "terminal"]
        assert seen[-1].outcome.kind == "completed"  # type: ignore[union-attr]
    script = [{"error": {"status": 401, "message": "bad key"}}, {"text": "never"}]
    with agent_for(tmp_path / "b", script).session("s") as session:
        seen = list(session.run_sync("hi"))
        assert [e.type for e in seen] == ["terminal"]
        ended = session.events[-1]
        assert isinstance(ended, RunEnded)
        assert ended.outcome.kind == "error" and ended.outcome.code == "auth"
        assert ended.outcome.retryable is False
    script = [{"error": {"status": 503, "message": "down"}}] * 4
    with agent_for(tmp_path / "c", script, max_retries=2).session("s") as session:
        seen = list(session.run_sync("hi"))
        assert [e.type for e in seen] == ["retry", "retry", "terminal"]
        ended = session.events[-1]
        assert isinstance(ended, RunEnded) and ended.outcome.retryable is True


def test_an_exhausted_script_ends_the_run_with_a_clear_error(tmp_path: Path) -> None:
    with agent_for(tmp_path, [{"text": "only one"}]).session("s") as session:
        list(session.run_sync("one"))
        list(session.run_sync("two"))
        ended = session.events[-1]
        assert isinstance(ended, RunEnded) and ended.outcome.code == "script_exhausted"
        assert "API key" in (ended.outcome.message or "")
        assert_runs_end_once(session.events)


class HangingAdapter:
    provider, model = "test", "hang"

    def __init__(self) -> None:
        self.attempts = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        import asyncio

        self.attempts += 1
        yield TextDelta("thinking...")
        await asyncio.sleep(30)
        yield TurnDone((), "end_turn", __import__("kiso.kernel").kernel.Usage(), "hang")


def test_a_silent_stream_is_cut_by_the_watchdog_and_nothing_is_committed(tmp_path: Path) -> None:
    adapter = HangingAdapter()
    agent = Agent(
        adapter=adapter,
        store=store(tmp_path),
        workspace=tmp_path,
        idle_timeout=0.2,
        max_retries=1,
        retry_base_delay=0.01,
    )
    with agent.session("s") as session:
        seen = [e.type for e in session.run_sync("hi")]
        assert seen == ["text_delta", "retry", "text_delta", "terminal"]
        assert adapter.attempts == 2
        assert types(session.events) == ["run_started", "user", "run_ended"]


class SteadyAdapter:
    """A text delta every 0.1 s, five of them: never silent for long."""

    provider, model = "test", "steady"

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        import asyncio

        from kiso.kernel import TextBlock, Usage

        for _ in range(5):
            await asyncio.sleep(0.1)
            yield TextDelta("x")
        yield TurnDone((TextBlock("xxxxx"),), "end_turn", Usage(), "steady")


def test_the_watchdog_never_counts_the_consumers_time(tmp_path: Path) -> None:
    """Items 0.1 s apart, a 0.3 s watchdog, a consumer that takes 0.5 s over each item: the
    waits are short, so the turn completes (the consumer's time is not the model's silence)."""
    import time as _time

    agent = Agent(
        adapter=SteadyAdapter(),
        store=store(tmp_path),
        workspace=tmp_path,
        idle_timeout=0.3,
        max_retries=0,
    )
    with agent.session("s") as session:
        seen = []
        for event in session.run_sync("hi"):
            seen.append(event.type)
            if event.type == "text_delta":
                _time.sleep(0.5)  # blocks the loop too: the timer fires late, mid-consumer
        assert seen.count("text_delta") == 5 and "retry" not in seen
        assert types(session.events) == ["run_started", "user", "assistant", "run_ended"]


def test_a_cancellation_from_outside_is_not_mistaken_for_a_silent_model(tmp_path: Path) -> None:
    import asyncio

    agent = Agent(adapter=HangingAdapter(), store=store(tmp_path), workspace=tmp_path)

    async def go() -> list[str]:
        seen: list[str] = []
        with agent.session("s") as session:

            async def consume() -> None:
                async for event in session.run("hi"):
                    seen.append(event.type)

            task = asyncio.ensure_future(consume())
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return seen

    assert asyncio.run(go()) == ["text_delta"]  # no retry, no timeout: cancelled


class BrokenAdapter:
    provider, model = "test", "broken"

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        from kiso.kernel import TextBlock, Usage

        yield TurnDone((TextBlock("a"),), "end_turn", Usage(), "broken")
        yield TurnDone((TextBlock("b"),), "end_turn", Usage(), "broken")


def test_a_stream_that_goes_on_after_its_stop_commits_nothing(tmp_path: Path) -> None:
    agent = Agent(adapter=BrokenAdapter(), store=store(tmp_path), workspace=tmp_path, max_retries=0)
    with agent.session("s") as session:
        list(session.run_sync("hi"))
        assert types(session.events) == ["run_started", "user", "run_ended"]
        ended = session.events[-1]
        assert isinstance(ended, RunEnded) and ended.outcome.code == "invalid_stream"


def test_max_turns_ends_the_run(tmp_path: Path) -> None:
    script = [{"tool_calls": [{"name": "slow_read", "input": {}}]}] * 5
    with agent_for(tmp_path, script, max_turns=2).session("s") as session:
        list(session.run_sync("loop"))
        ended = session.events[-1]
        assert isinstance(ended, RunEnded) and ended.outcome.kind == "max_turns"
        assert types(session.events).count("assistant") == 2


def test_abort_cancels_a_running_tool_and_ends_the_run_cleanly(tmp_path: Path) -> None:
    cancelled_seen = threading.Event()

    def wait(args: dict[str, Any], ctx: ToolContext) -> str:
        for _ in range(200):
            if ctx.cancelled():
                cancelled_seen.set()
                return "stopped early"
            time.sleep(0.01)
        return "finished"

    waiter = define_tool("wait", "Wait", {**OBJ, "properties": {}}, wait, effects="other")
    agent = agent_for(
        tmp_path,
        [{"tool_calls": [{"name": "wait", "input": {}}]}, {"text": "never"}],
        tools=[waiter],
        mode="bypass",
    )
    with agent.session("s") as session:
        seen = []
        for e in session.run_sync("wait"):
            seen.append(e.type)
            if e.type == "tool_start":
                threading.Timer(0.1, session.abort).start()
        assert cancelled_seen.is_set()
        assert seen[-1] == "terminal"
        ended = session.events[-1]
        assert isinstance(ended, RunEnded) and ended.outcome.kind == "aborted"
        assert ended.outcome.by == "user"
        finished = next(e for e in session.events if isinstance(e, ExecutionFinished))
        assert finished.content == "stopped early"
        assert session.state.value == "ended"
        assert_runs_end_once(session.events)


def test_a_new_run_cannot_start_over_an_open_one(tmp_path: Path) -> None:
    agent = agent_for(tmp_path, [{"tool_calls": [note("x")]}, {"text": "done"}])
    with agent.session("s") as session:
        list(session.run_sync("go"))  # pauses on the approval
        with pytest.raises(KisoError, match="resume"):
            list(session.run_sync("another"))


def test_the_faux_script_file_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    {"thinking": "plan", "text": "hi", "usage": {"input": 3, "output": 1},
                     "delay_ms": 20},
                ]
            }
        )
    )  # fmt: skip
    monkeypatch.setenv("KISO_FAUX_SCRIPT", str(script))
    agent = Agent(store=store(tmp_path), workspace=tmp_path)
    with agent.session("s") as session:
        seen = [e.type for e in session.run_sync("hello")]
        assert seen[0] == "thinking_delta" and "text_delta" in seen
        turn = session.events[2]
        assert turn.type == "assistant"
        assert turn.usage.input == 3  # type: ignore[union-attr]
        assert turn.model == "faux:script.json"  # type: ignore[union-attr]
    script.write_text('{"turns": [{"txt": "typo"}]}')
    from kiso.providers import ScriptError

    with pytest.raises(ScriptError, match=r"turns\[0\]: unknown key\(s\) txt"):
        Agent(store=store(tmp_path), workspace=tmp_path)


def test_a_tools_own_error_kind_is_kept_to_the_closed_set(tmp_path: Path) -> None:
    from kiso.tools.base import ToolResult

    odd = define_tool(
        "odd",
        "Fail oddly",
        {**OBJ, "properties": {}},
        lambda args, ctx: ToolResult("it broke", is_error=True, error_kind="kaboom"),
        effects="read",
    )
    agent = agent_for(
        tmp_path, [{"tool_calls": [{"name": "odd", "input": {}}]}, {"text": "ok"}], tools=[odd]
    )
    with agent.session("s") as session:
        assert [e.type for e in session.run_sync("go")][-1] == "terminal"
        finished = next(e for e in session.events if isinstance(e, ExecutionFinished))
        assert (finished.error_kind, finished.ok, finished.content) == ("fatal", False, "it broke")


def test_tools_may_take_only_their_input_and_return_a_mapping(tmp_path: Path) -> None:
    add = define_tool(
        "add",
        "Add",
        {**OBJ, "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        lambda args: {"content": str(args["a"] + args["b"]), "isError": False},
        effects="read",
    )

    async def fail(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": "nope", "is_error": True}

    failing = define_tool("fail", "Fail", {**OBJ, "properties": {}}, fail, effects="read")
    script = [
        {"tool_calls": [{"name": "add", "input": {"a": 2, "b": 3}}, {"name": "fail", "input": {}}]},
        {"text": "5"},
    ]
    with agent_for(tmp_path, script, tools=[add, failing]).session("s") as session:
        list(session.run_sync("add"))
        results = [m for m in project(session.events) if isinstance(m, ToolResultMessage)]
        assert [(r.content, r.is_error) for r in results] == [("5", False), ("nope", True)]


class IdlessAdapter:
    """A local OpenAI-compatible server that sends no call ids (or always the same one): even
    turns call ``note`` twice with ``given`` as the id, odd turns answer."""

    provider, model = "test", "idless"

    def __init__(self, given: str) -> None:
        self.given = given
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        from kiso.kernel import TextBlock, ToolCall, Usage

        self.requests.append(request)
        if request.turn % 2:
            yield TurnDone((TextBlock("noted"),), "end_turn", Usage(), self.model)
            return
        calls = tuple(
            ToolCall(self.given, "note", {"line": f"turn {request.turn} call {i}"}) for i in (0, 1)
        )
        yield TurnDone(calls, "tool_use", Usage(), self.model)


@pytest.mark.parametrize("given", ["", "call_0"])
def test_call_ids_are_unique_across_the_whole_session(tmp_path: Path, given: str) -> None:
    """A provider that omits or repeats ids gives ``call_0`` every turn; a tool keyed by its
    call id (``delegate``) would take the second turn's call for the first one's. The committed
    turn carries session-unique ids, its results carry the same ones, and a resume reads them
    back from the log rather than make new ones."""
    from kiso.kernel import Assistant

    adapter = IdlessAdapter(given)
    agent = Agent(
        adapter=adapter,
        tools=[note_tool(tmp_path / "notes.txt")],
        store=store(tmp_path),
        workspace=tmp_path,
        mode="bypass",
    )
    with agent.session("s") as session:
        for prompt in ("one", "two", "three"):
            assert [e.type for e in session.run_sync(prompt)][-1] == "terminal"
        ids = [c.call_id for e in session.events if isinstance(e, Assistant) for c in e.calls]
        finished = [e.call_id for e in session.events if isinstance(e, ExecutionFinished)]
    assert len(ids) == 6 and len(set(ids)) == 6, ids
    assert finished == ids  # every call ran once, under the id its turn recorded
    assert ids[0] == "call_0"  # the first turn's first id is kept as it came (or made)
    # what the provider is sent: every result answers the id its assistant message carries
    last = adapter.requests[-1].messages
    sent = [i for m in last if m.role == "assistant" for i in _call_ids(m)]
    answered = [m.call_id for m in last if isinstance(m, ToolResultMessage)]
    assert sent == answered == ids
    with agent.session("s") as again:  # read back as committed, not renamed
        back = [c.call_id for e in again.events if isinstance(e, Assistant) for c in e.calls]
        assert back == ids and again.call_ids == set(ids)


def _call_ids(message: Any) -> list[str]:
    from kiso.kernel import ToolCall

    return [b.call_id for b in message.blocks if isinstance(b, ToolCall)]


def test_unique_call_ids_suffix_a_repeated_id_with_the_turns_seq() -> None:
    from kiso.kernel import TextBlock, ToolCall
    from kiso.runtime.loop import _unique_call_ids

    blocks = (TextBlock("x"), ToolCall("a", "n", {}), ToolCall("a", "n", {}), ToolCall("", "n", {}))
    assert [getattr(b, "call_id", None) for b in _unique_call_ids(blocks, set(), 9)] == [
        None,
        "a",
        "a_2",
        "call_3",
    ]
    taken = {"a", "call_3", "a_9"}  # ids earlier turns of the session declared
    again = [b.call_id for b in _unique_call_ids(blocks, taken, 9) if isinstance(b, ToolCall)]
    assert again == ["a_9_1", "a_9_2", "call_3_9"]
    kept = (ToolCall("toolu_1", "n", {}),)
    assert _unique_call_ids(kept, {"toolu_0"}, 4) == kept  # a fresh id is left as it came


def test_a_lone_surrogate_from_the_provider_is_replaced_not_fatal(tmp_path: Path) -> None:
    """``"\\ud800"`` is valid JSON but no UTF-8: the turn is recorded with U+FFFD in its place,
    and the run goes on (it used to end ``invalid_turn``)."""
    from kiso.kernel import Assistant, ExecutionFinished, JsonlSessionStore
    from kiso.providers import FauxAdapter
    from kiso.runtime import Agent
    from kiso.tools.base import define_tool

    seen: list[str] = []
    echo = define_tool(
        "echo",
        "Echo a word",
        {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        lambda args, ctx: seen.append(args["word"]) or "echoed",
        effects="read",
    )
    turns = [
        {"text": "say \ud800", "tool_calls": [{"name": "echo", "input": {"word": "a\ud800b"}}]},
        {"text": "done"},
    ]
    agent = Agent(
        adapter=FauxAdapter(turns),
        tools=[echo],
        store=JsonlSessionStore(tmp_path),
        workspace=tmp_path,
        mode="bypass",
    )
    with agent.session("s") as session:
        list(session.run_sync("go"))
        assert session.state.value == "completed"
    events = JsonlSessionStore(tmp_path).load("s").events
    first = next(e for e in events if isinstance(e, Assistant))
    assert first.text == "say \ufffd" and first.calls[0].input == {"word": "a\ufffdb"}
    assert seen == ["a\ufffdb"]
    assert any(isinstance(e, ExecutionFinished) for e in events)
