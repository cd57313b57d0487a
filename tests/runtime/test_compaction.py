"""Context relief: when it fires, what it keeps, what it refuses, and that it is durable.

The model is the scripted one (its ``summaries`` answer the compaction requests); the tools are
real; the log is a real JSONL file. Provider refusals through the official SDKs are in
test_context_relief.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import (
    Assistant,
    Compacted,
    ExecutionFinished,
    JsonlSessionStore,
    ModelRef,
    RunStarted,
    TextBlock,
    ToolCall,
    Usage,
    UsageError,
    User,
    replay,
)
from kiso.kernel.events import ApprovalDecided, ExecutionStarted, billed, input_sha256
from kiso.providers import FauxAdapter
from kiso.providers.base import ModelRequest
from kiso.runtime import Agent, stream
from kiso.runtime.compaction import (
    SUMMARY_INSTRUCTION,
    VERBATIM_HEADER,
    Thresholds,
    check_summary,
    phase_ended,
    plan_cut,
)
from kiso.runtime.context import Window, parse_window
from kiso.runtime.session import PromptTooLargeError
from kiso.tools.base import Effects, Tool, ToolContext, define_tool

OBJ = {"type": "object", "properties": {"key": {"type": "string"}}}
GOOD = "## Goal\nread the files\n## Current work\nreading\n## Next steps\nkeep reading"


def reader(name: str = "peek", size: int = 1200) -> Tool:
    def execute(args: dict[str, Any], ctx: ToolContext) -> str:
        key = str(args.get("key", ""))
        return (key + ":") + ("r" * size)

    return define_tool(name, "Read a thing", OBJ, execute, effects="read")


def writer(log: Path) -> Tool:
    def execute(args: dict[str, Any], ctx: ToolContext) -> str:
        with open(log, "a", encoding="utf-8") as f:
            f.write(str(args.get("key")) + "\n")
        return f"wrote {args.get('key')}"

    return define_tool("put", "Write a thing", OBJ, execute, effects="edit")


class Recording(FauxAdapter):
    """The scripted model, keeping every request it was sent."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest):  # type: ignore[no-untyped-def,override]
        self.requests.append(request)
        async for item in super().stream(request):
            yield item

    @property
    def summary_requests(self) -> list[ModelRequest]:
        return [r for r in self.requests if r.options.get("purpose") == "summary"]


def peeks(n: int, name: str = "peek") -> list[dict[str, Any]]:
    return [{"tool_calls": [{"name": name, "input": {"key": f"k{i}"}}]} for i in range(n)]


def agent(tmp_path: Path, turns: list[dict[str, Any]], **kw: Any) -> tuple[Agent, Recording]:
    summaries = kw.pop("summaries", [{"text": GOOD}] * 6)
    model = Recording(turns, summaries=summaries)
    tools = kw.pop("tools", [reader(), reader("look"), writer(tmp_path / "w.log")])
    a = Agent(
        adapter=model,
        tools=tools,
        store=JsonlSessionStore(tmp_path / "home"),
        workspace=tmp_path,
        system_prompt="You are a test.",
        window=kw.pop("window", 4000),
        mode=kw.pop("mode", "accept-edits"),
        **kw,
    )
    return a, model


def run(a: Agent, prompt: str, sid: str = "s") -> list[stream.RunEvent]:
    with a.session(sid) as session:
        return list(session.run_sync(prompt))


def compactions(a: Agent, sid: str = "s") -> list[Compacted]:
    return [e for e in a.store.load(sid).events if isinstance(e, Compacted)]


# --------------------------------------------------------------------------- pure parts


def test_thresholds_are_half_eighty_percent_and_a_tenth_with_their_caps() -> None:
    assert Thresholds.of(200_000) == Thresholds(100_000, 160_000, 20_000)
    assert Thresholds.of(1_000_000) == Thresholds(400_000, 700_000, 100_000)
    assert Thresholds.of(8_192) == Thresholds(4_096, 6_553, 819)


def _turn(seq: int, *names: str) -> Assistant:
    calls = tuple(ToolCall(f"c{seq}{i}", n, {}) for i, n in enumerate(names))
    return Assistant(
        run="r", blocks=calls, stop="tool_use", usage=Usage(), model="m", ms=1, seq=seq
    )


EFFECTS = {"read_file": Effects.READ, "write_file": Effects.EDIT, "shell": Effects.SHELL}


@pytest.mark.parametrize(
    ("rounds", "ended"),
    [
        ([], True),  # a new turn began
        ([("read_file",)], False),  # the reading goes on
        ([("read_file",), ("read_file",)], False),
        ([("read_file",), ("write_file",)], True),  # the reading finished
        ([("write_file",), ("write_file",)], False),  # the edits go on
        ([("write_file",), ("read_file",)], True),  # the edits finished
        ([("read_file",), ("shell",)], True),  # the checks ran
    ],
)
def test_a_phase_ends_at_a_new_turn_the_checks_or_the_end_of_edits_or_reading(
    rounds: list[tuple[str, ...]], ended: bool
) -> None:
    events: list[Any] = [
        RunStarted(run="r", trigger="user", model=ModelRef("f", "m"), mode="default", seq=1),
        User(run="r", content="go", seq=2),
    ]
    for i, names in enumerate(rounds):
        events.append(_turn(3 + i, *names))
    assert phase_ended(events, EFFECTS) is ended


def test_the_cut_keeps_the_recent_tenth_whole_pairs_and_copies_inputs_and_edits() -> None:
    events: list[Any] = [
        RunStarted(run="r", trigger="user", model=ModelRef("f", "m"), mode="default", seq=1),
        User(run="r", content="please fix a.py", seq=2),
    ]
    seq = 3
    for i in range(6):
        name = "write_file" if i == 1 else "read_file"
        call = ToolCall(f"c{i}", name, {"path": f"f{i}.py"})
        events.append(
            Assistant(
                run="r", blocks=(call,), stop="tool_use", usage=Usage(), model="m", ms=1, seq=seq
            )
        )
        content = "wrote 12 bytes" if i == 1 else "x" * 400
        events += [
            ApprovalDecided(
                run="r",
                call_id=call.call_id,
                decision="approved",
                decided_by="policy",
                reason=None,
                input_sha256=input_sha256(call.input),
                seq=seq + 1,
            ),
            ExecutionStarted(
                run="r",
                execution_id=f"s:{seq + 2}",
                call_id=call.call_id,
                name=name,
                input=call.input,
                seq=seq + 2,
            ),
            ExecutionFinished(
                run="r",
                execution_id=f"s:{seq + 2}",
                call_id=call.call_id,
                ok=True,
                content=content,
                is_error=False,
                ms=1,
                seq=seq + 3,
            ),
        ]
        seq += 4
    fold = replay(events)
    cut = plan_cut(
        events,
        fold.messages,
        fold.anchors,
        covers=0,
        keep=250,
        window=2500,
        edits=frozenset({"write_file"}),
    )
    assert cut is not None
    kept = [m for m, a in zip(fold.messages, fold.anchors, strict=True) if a > cut.covers_to_seq]
    assert kept and kept[0].role == "assistant"  # a pair is kept or dropped whole
    assert {m.role for m in kept} == {"assistant", "tool"}
    assert cut.covered == len(fold.messages) - len(kept)
    assert VERBATIM_HEADER in cut.verbatim
    assert "> please fix a.py" in cut.verbatim  # the user's words, verbatim
    assert "- write_file f1.py: wrote 12 bytes" in cut.verbatim  # every edit's result
    # A threshold never summarizes the input being answered.
    assert (
        plan_cut(
            events[:2],
            replay(events[:2]).messages,
            replay(events[:2]).anchors,
            covers=0,
            keep=1,
            window=100,
            edits=frozenset(),
            below=2,
        )
        is None
    )


@pytest.mark.parametrize(
    ("blocks", "why"),
    [
        ((TextBlock("   "),), "the summary was empty"),
        ((TextBlock(GOOD), ToolCall("x", "read_file", {})), "the model called a tool"),
        ((TextBlock('ok <tool_call>{"name": "shell"}</tool_call>'),), "tool-call markup"),
        ((TextBlock("Let me run the tests now."),), "continued the work"),
        ((TextBlock("Sure, I'll edit a.py next."),), "continued the work"),
        ((TextBlock("OK, running the tests."),), "continued the work"),
        ((TextBlock("Sure! First I'll check the file."),), "continued the work"),
        ((TextBlock("Okay, now checking a.py for the bug."),), "continued the work"),
        ((TextBlock('<function=shell>{"command": "ls"}</function>'),), "tool-call markup"),
        ((TextBlock('```\n{"name": "read_file", "parameters": {"path": "a.txt"}}\n```'),),
         "tool-call markup"),
        ((TextBlock('{"type": "function", "function": {"name": "shell"}}'),), "tool-call markup"),
        ((TextBlock("<think>The user wants a summary. I will write one.</think>"),),
         "the summary was empty"),
        ((TextBlock("<think>\nI should summarize"),), "the summary was empty"),  # never closed
        ((TextBlock("## Goal\n"),), "headings with nothing under them"),
        ((TextBlock("## Goal\n## Current work\n\n**Next steps**\n"),),
         "headings with nothing under them"),
        ((TextBlock("\u200b"),), "the summary was empty"),
        ((TextBlock("\ufeff\u200b \u2060\n"),), "the summary was empty"),
        ((TextBlock("<think>done thinking</think>\nOK, running the tests."),),
         "continued the work"),
        ((TextBlock("## Goal\nfix it\n<tool_call>`x`</tool_call>"),), "tool-call markup"),
        ((TextBlock("I\u2019ll run the tests now."),), "continued the work"),  # a curly apostrophe
        ((TextBlock("\u00a0\u3000\u2800"),), "the summary was empty"),  # blank-looking marks
        ((TextBlock("..."),), "the summary was empty"),
        ((TextBlock("---\n***"),), "the summary was empty"),
        ((TextBlock("\uff1ctool_call\uff1e{}\uff1c/tool_call\uff1e"),), "tool-call markup"),
        ((TextBlock('```json\n{"name": "shell", "arguments": {"command": "ls"}}\n```'),),
         "tool-call markup"),
    ],
)  # fmt: skip
def test_a_bad_summary_is_rejected_with_its_reason(blocks: tuple[Any, ...], why: str) -> None:
    reason, _ = check_summary(blocks)
    assert reason is not None and why in reason


def test_a_good_summary_passes_even_when_it_starts_politely() -> None:
    assert check_summary((TextBlock(GOOD),))[0] is None
    assert check_summary((TextBlock("Sure, here is the summary.\n" + GOOD),))[0] is None


@pytest.mark.parametrize(
    "text",
    [
        "## Goal\nThe user asked about `<tool_call>` markup handling in the parser",
        '## Goal\nsupport Llama\'s ``<function=name>`` calls and `"tool_calls":` in the parser',
        "OK, nothing was changed yet.\n## Goal\nread the files",
        "Okay, summarizing: the goal was to read the files.",
        "<think>what matters here</think>\n" + GOOD,
        "\u200b" + GOOD,
        "## Goal\nread the files\n## Constraints\n## Next steps\nnone",  # one empty: fine
        "Okay, according to the user, the goal is to add retries.",
        "Understood. Remaining work: the retry test.",
        "OK, existing tests pass; the goal is a retry flag.",
        "Alright, pending items: docs.",
        "## Goal: add retries\n## Next steps: none",  # content on the heading's line
        # a session about tool definitions or a tool-call parser: code that names calls is data
        '## Goal\nthe weather tool\n```json\n{"type": "function", "function": {"name": '
        '"get_weather", "parameters": {}}}\n```',
        '## Goal\na deploy step\n```json\n{"name": "deploy-step", "parameters": {"env": "x"}}\n```',
        '## Files and changes\nparser.py:\n```python\nmsg = {"role": "assistant", '
        '"tool_calls": calls}\n```',
        GOOD + '\n```json\n{"name": "shell", "arguments": {"command": "ls"}}\n```',
    ],
)
def test_a_good_summary_is_accepted(text: str) -> None:
    reason, kept = check_summary((TextBlock(text),))
    assert reason is None, reason
    assert "<think>" not in kept  # a reasoning model's thinking is not part of the summary


@pytest.mark.parametrize(
    ("message", "window"),
    [
        ("request (6031 tokens) exceeds the available context size (4096 tokens), try", 4096),
        ("the request exceeds the available context size (1407 prompt tokens, a 256-token "
         "context)", 256),
        ("This model's maximum context length is 128000 tokens. However, you requested", 128000),
        ("prompt is too long: 210000 tokens > 200000 maximum", 200000),
        ("is longer than the maximum model length of 4096.", 4096),
        ("context length exceeded", None),
    ],
)  # fmt: skip
def test_the_window_a_refusal_names_is_read(message: str, window: int | None) -> None:
    assert parse_window(message) == window


def test_a_learned_window_only_lowers_and_is_remembered(tmp_path: Path) -> None:
    learned = tmp_path / "learned-windows.json"
    w = Window("gpt-4o", key="k", learned_file=learned)
    assert (w.tokens, w.current().source) == (128_000, "registry")
    assert w.learn(8_192) and w.current().source == "learned"
    assert not w.learn(100_000)  # never raised
    assert json.loads(learned.read_text()) == {"k": 8192}
    again = Window("gpt-4o", key="k", learned_file=learned)
    assert again.tokens == 8_192
    assert Window("gpt-4o", explicit=4_000, key="k", learned_file=learned).tokens == 4_000
    assert Window("nope-model").current().source == "default"


# --------------------------------------------------------------------------- in a run


def test_past_half_the_window_it_waits_for_the_end_of_a_phase(tmp_path: Path) -> None:
    # Reading rounds of ~300 tokens in a 4,000-token window: past 2,000 the reading goes on,
    # so nothing happens until the round that edits (the reading finished).
    turns = [*peeks(8), {"tool_calls": [{"name": "put", "input": {"key": "a"}}]}, {"text": "ok"}]
    a, model = agent(tmp_path, turns, window=4000)
    seen = run(a, "read everything")
    (c,) = compactions(a)
    events = a.store.load("s").events
    before = [e for e in events if e.seq < c.seq]
    last_turn = [e for e in before if isinstance(e, Assistant)][-1]
    assert last_turn.calls[0].name == "put"  # it waited for the phase to end
    assert c.trigger == "auto" and c.tokens_before is not None and c.tokens_after is not None
    assert 2000 <= c.tokens_before < 3200 and c.tokens_after < c.tokens_before
    assert len(model.summary_requests) == 1
    assert [type(e).__name__ for e in seen if isinstance(e, stream.Compaction)] == ["Compaction"]
    assert seen[-1].type == "terminal" and seen[-1].outcome.kind == "completed"


def test_the_summary_request_is_recorded_with_its_model_and_usage_and_billed(
    tmp_path: Path,
) -> None:
    turns = [*peeks(8), {"tool_calls": [{"name": "put", "input": {"key": "a"}}]}, {"text": "ok"}]
    summary = {"text": GOOD, "usage": {"input": 2100, "output": 90}}
    a, model = agent(tmp_path, turns, window=4000, summaries=[summary])
    run(a, "read everything")
    (c,) = compactions(a)
    assert c.model == model.model
    assert c.usage is not None and (c.usage.input, c.usage.output) == (2100, 90)
    raw = c.to_json()
    assert raw["usage"] == {"input": 2100, "output": 90, "cache_read": None, "cache_write": None}
    events = a.store.load("s").events
    paid = list(billed(events))
    turns_seen = [e for e in events if isinstance(e, Assistant)]
    assert len(paid) == len(turns_seen) + 1  # every turn, and the summary
    assert (model.model, c.usage) in paid


def test_past_eighty_percent_it_compacts_at_the_next_round_whatever_it_is(tmp_path: Path) -> None:
    turns = [*peeks(14), {"text": "ok"}]
    a, _model = agent(tmp_path, turns, window=4000)
    run(a, "read everything")
    found = compactions(a)
    assert found, "past 80% the reading phase must not hold it back"
    assert all(c.tokens_before is not None and c.tokens_before >= 3200 for c in found)


def test_the_summary_is_asked_on_the_runs_own_prefix(tmp_path: Path) -> None:
    turns = [*peeks(8), {"tool_calls": [{"name": "put", "input": {"key": "a"}}]}, {"text": "ok"}]
    a, model = agent(tmp_path, turns, window=4000)
    run(a, "read everything")
    ask = model.summary_requests[0]
    i = model.requests.index(ask)
    before = model.requests[i - 1]
    assert ask.system == before.system == "You are a test."
    assert list(ask.tools) == list(before.tools)
    # the refused or previous request's messages, then the fixed instruction
    assert list(ask.messages[: len(before.messages)]) == list(before.messages)
    last = ask.messages[-1]
    assert isinstance(last.content[0], TextBlock) and last.content[0].text == SUMMARY_INSTRUCTION


def test_three_rejected_summaries_turn_auto_compaction_off_and_say_so(tmp_path: Path) -> None:
    turns = [*peeks(16), {"text": "ok"}]
    bad = [{"text": ""}, {"text": "Let me continue."}, {"text": "<tool_call>x</tool_call>"}]
    a, model = agent(tmp_path, turns, window=4000, summaries=[*bad, {"text": GOOD}])
    seen = run(a, "read everything")
    failed = [e for e in seen if isinstance(e, stream.CompactionFailed)]
    assert [f.failures for f in failed] == [1, 2, 3]
    assert [f.disabled for f in failed] == [False, False, True]
    assert "auto-compaction is off" in failed[-1].describe()
    assert len(model.summary_requests) == 3  # and no fourth
    assert compactions(a) == []  # nothing was written
    assert seen[-1].type == "terminal"


def test_compact_on_demand_with_a_focus_and_refused_while_a_turn_runs(tmp_path: Path) -> None:
    turns = [*peeks(3), {"text": "first done"}, {"text": "second done"}]
    a, model = agent(tmp_path, turns, window=100_000)
    with a.session("s") as session:
        it = session.run_sync("read a bit")
        first = next(it)
        assert first is not None
        with pytest.raises(UsageError, match="running a turn"):
            session.compact("anything")
        list(it)
        assert compactions(a) == []  # far below any threshold
        seen = list(_drain(session.compact("the file names")))
        (c,) = compactions(a)
        assert c.trigger == "manual"
        assert seen[-1].type == "compaction"
        assert "Focus the summary on: the file names" in str(model.summary_requests[0].messages)
        # the model now sees the summary first; the next run goes on from there
        assert session.messages[0].role == "user"
        assert "[Earlier conversation compacted]" in session.messages[0].content[0].text
        list(session.run_sync("and again"))
    assert replay(a.store.load("s").events).messages[0] == session.messages[0]


def _drain(agen: Any) -> list[Any]:
    import asyncio

    async def go() -> list[Any]:
        return [x async for x in agen]

    return asyncio.run(go())


def test_a_prompt_larger_than_the_whole_window_is_refused_before_it_is_recorded(
    tmp_path: Path,
) -> None:
    a, model = agent(tmp_path, [{"text": "ok"}], window=1000)
    with a.session("s") as session:
        with pytest.raises(PromptTooLargeError, match=r"~2,00\d tokens.*1,000 tokens"):
            list(session.run_sync("y" * 8000))
        assert list(session.events) == []
        assert model.requests == []
        assert list(session.run_sync("small"))[-1].type == "terminal"


# --------------------------------------------------------------------------- crash windows


def test_a_crash_anywhere_around_a_compaction_resumes_to_the_same_projection(
    tmp_path: Path,
) -> None:
    turns = [*peeks(14), {"text": "ok"}]
    whole, _ = agent(tmp_path / "whole", turns, window=4000)
    (tmp_path / "whole").mkdir(exist_ok=True)
    run(whole, "read everything")
    path = next((tmp_path / "whole" / "home").rglob("s.jsonl"))
    lines = path.read_bytes().splitlines(keepends=True)
    expected = repr(replay(whole.store.load("s").events).messages)
    at = next(i for i, line in enumerate(lines) if b'"type":"compacted"' in line)
    tried = 0
    for cut in range(max(at - 6, 2), min(at + 6, len(lines))):
        where = tmp_path / f"cut{cut}"
        where.mkdir()
        a, _ = agent(where, turns, window=4000)
        with a.session("s"):
            pass  # make the session's place on disk
        target = next((where / "home").rglob("s.jsonl"))
        target.write_bytes(b"".join(lines[:cut]))
        with a.session("s") as session:
            list(session.resume_sync())
        got = repr(replay(a.store.load("s").events).messages)
        assert got == expected, f"cut after record {cut}"
        tried += 1
    assert tried >= 10


def test_a_summary_request_the_endpoint_refuses_is_sent_again_as_a_transcript(
    tmp_path: Path,
) -> None:
    turns = [*peeks(8), {"tool_calls": [{"name": "put", "input": {"key": "a"}}]}, {"text": "ok"}]
    refusal = {"status": 400, "message": "This model's maximum context length is 3000 tokens."}
    a, model = agent(tmp_path, turns, window=4000, summaries=[{"error": refusal}, {"text": GOOD}])
    seen = run(a, "read everything")
    first, second = model.summary_requests
    assert first.tools and not first.options.get("transcript")  # the run's own prefix
    assert second.options.get("transcript") is True and not second.tools
    (only,) = second.messages
    assert "<<<conversation" in only.content[0].text  # type: ignore[union-attr]
    assert a.window.current().tokens == 3000 and a.window.current().source == "learned"
    (c,) = compactions(a)
    assert c.summary.startswith(GOOD)
    assert seen[-1].type == "terminal" and seen[-1].outcome.kind == "completed"


def test_a_refused_turn_is_relieved_by_one_compaction_and_one_retry(tmp_path: Path) -> None:
    refusal = {"status": 400, "message": "request (5000 tokens) exceeds the available context "
               "size (3500 tokens), try increasing it"}  # fmt: skip
    turns = [*peeks(6), {"error": refusal}, {"text": "ok"}]
    a, model = agent(tmp_path, turns, window=100_000)
    seen = run(a, "read everything")
    assert a.window.tokens == 3500
    (c,) = compactions(a)
    assert c.trigger == "auto"
    after = model.requests[-1]
    assert after.messages[0].content[0].text.startswith("[Earlier conversation compacted]")  # type: ignore[union-attr]
    assert len(after.messages) < len(model.requests[-3].messages)
    assert seen[-1].type == "terminal" and seen[-1].outcome.kind == "completed"


def test_a_second_refusal_ends_the_run_naming_the_window(tmp_path: Path) -> None:
    refusal = {"status": 400, "message": "maximum context length is 3500 tokens"}
    turns = [*peeks(6), {"error": refusal}, {"error": refusal}, {"text": "never"}]
    a, model = agent(tmp_path, turns, window=100_000)
    seen = run(a, "read everything")
    end = seen[-1]
    assert end.type == "terminal" and end.outcome.kind == "error"
    assert end.outcome.code == "context_overflow"
    assert "3,500 tokens (learned from the endpoint's refusal)" in (end.outcome.message or "")
    assert len(model.summary_requests) == 1  # compacted once, retried once
    assert len(compactions(a)) == 1


def test_a_refused_transcript_is_shrunk_by_the_size_the_endpoint_counted(
    tmp_path: Path,
) -> None:
    turns = [*peeks(8), {"tool_calls": [{"name": "put", "input": {"key": "a"}}]}, {"text": "ok"}]
    prefix = {"status": 400, "message": "maximum context length is 3000 tokens"}
    counted = {"status": 400, "message": "request (3900 tokens) exceeds the available context "
               "size (3000 tokens), try increasing it"}  # fmt: skip
    a, model = agent(
        tmp_path,
        turns,
        window=4000,
        summaries=[{"error": prefix}, {"error": counted}, {"text": GOOD}],
    )
    seen = run(a, "read everything")
    first, second, third = model.summary_requests
    assert not first.options.get("transcript")
    assert second.options.get("transcript") and third.options.get("transcript")
    sizes = [len(r.messages[0].content[0].text) for r in (second, third)]  # type: ignore[union-attr]
    assert sizes[1] < sizes[0] * 0.8  # cut by what the endpoint counted, with a margin
    assert all(r.max_output == 3000 // 8 for r in (second, third))  # the summary's own budget
    assert len(compactions(a)) == 1
    assert seen[-1].type == "terminal" and seen[-1].outcome.kind == "completed"


def test_a_requests_output_cap_reaches_the_wire() -> None:
    from kiso.kernel.messages import UserMessage
    from kiso.providers.anthropic import AnthropicAdapter
    from kiso.providers.openai_compat import OpenAICompatAdapter
    from kiso.providers.openai_responses import OpenAIResponsesAdapter

    ask = ModelRequest("s", (UserMessage((TextBlock("hi"),)),), max_output=500)
    compat = OpenAICompatAdapter(model="m", base_url="http://127.0.0.1:9/v1", api_key="k")
    assert 500 in compat.request_params(ask).values()
    responses = OpenAIResponsesAdapter(model="gpt-5", api_key="k")
    assert responses.request_params(ask)["max_output_tokens"] == 500
    claude = AnthropicAdapter(model="claude-sonnet-4-5", api_key="k", max_output_tokens=8192)
    assert claude.params(ask)["max_tokens"] == 500
    assert claude.params(ModelRequest("s", ask.messages))["max_tokens"] == 8192


def test_measuring_every_round_costs_the_new_messages_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Context relief measures the request at every round's head; the count of messages it
    estimates grows with the rounds (n), not with the rounds squared (4n rounds: ~4x, not 16x)."""
    from kiso.runtime import context

    counted = [0]
    real = context.message_tokens

    def counting(message: Any) -> int:
        counted[0] += 1
        return real(message)

    monkeypatch.setattr(context, "message_tokens", counting)
    per_run = []
    for n in (50, 200):
        counted[0] = 0
        turns = [*peeks(n, "look"), {"text": "ok"}]
        a, _ = agent(tmp_path / f"n{n}", turns, window=10_000_000, max_turns=1000)
        run(a, "look around", sid=f"n{n}")
        per_run.append(counted[0])
    assert per_run[0] >= 100  # it did measure, every round
    assert per_run[1] < per_run[0] * 6, per_run  # linear: 4x the rounds, about 4x the work


@pytest.mark.parametrize(("covered", "said"), [(1, "1 message →"), (2, "2 messages →")])
def test_the_compaction_line_counts_its_messages_in_english(covered: int, said: str) -> None:
    from kiso.kernel import Compacted

    event = Compacted(run="r", covers_to_seq=3, summary=GOOD, trigger="auto",
                      tokens_before=900, tokens_after=100)  # fmt: skip
    line = stream.Compaction(event, covered, False).describe()
    assert f"⟳ compacted (auto): {said} a summary · ~900 → ~100 tokens" in line
