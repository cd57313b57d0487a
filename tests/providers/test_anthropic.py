"""The Anthropic adapter, through the official SDK, against a scripted local Messages API."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

import pytest

from kiso.kernel import (
    Assistant,
    AssistantMessage,
    ExecutionFinished,
    ImageBlock,
    JsonlSessionStore,
    Message,
    RunEnded,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from kiso.providers.anthropic import AnthropicAdapter
from kiso.providers.base import (
    ModelRequest,
    ProviderError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolSpec,
    TurnDone,
)
from kiso.runtime import Agent
from kiso.runtime import stream as ev
from kiso.tools.base import define_tool

from .anthropic_server import (
    JsonObj,
    Reply,
    Sse,
    Status,
    base_url,
    block_start,
    block_stop,
    delta,
    error,
    message_delta,
    message_start,
    message_stop,
    ping,
    serve,
    text_block,
    thinking_block,
    tool_block,
    turn,
)
from .anthropic_server import _Server as Server

MODEL = "claude-test-1"
KEY = "sk-ant-test-0123456789"
SIGNATURE = "EqQBCkYIARgCIkB+/x9Zsig==" + "A" * 40 + "/+=="
THOUGHT = 'Check the file first; "quotes", a\\backslash, ünïcödé and 😀.'
READ_SCHEMA = {
    "type": "object",
    "properties": {"key": {"type": "string"}},
    "required": ["key"],
    "additionalProperties": False,
}
READ_TOOL = ToolSpec("lookup", "Look a key up", READ_SCHEMA)

PNG = {"media_type": "image/png", "data": "iVBORw0KGgo="}

Start: TypeAlias = Callable[..., tuple[Server, AnthropicAdapter]]


@pytest.fixture
def api() -> Iterator[Start]:
    """``api(*replies, **adapter_options)``: a scripted server and an adapter pointed at it."""
    with ExitStack() as stack:

        def start(*script: Reply, **options: Any) -> tuple[Server, AnthropicAdapter]:
            server = stack.enter_context(serve(list(script)))
            options.setdefault("api_key", KEY)
            adapter = AnthropicAdapter(model=MODEL, base_url=base_url(server), **options)
            return server, adapter

        yield start


def user(text: str) -> UserMessage:
    return UserMessage((TextBlock(text),))


def request(
    *messages: Message, system: str | None = "You help.", tools: Sequence[ToolSpec] = ()
) -> ModelRequest:
    return ModelRequest(system, messages or (user("hello"),), tools)


def run(adapter: AnthropicAdapter, req: ModelRequest | None = None) -> list[StreamEvent]:
    async def collect() -> list[StreamEvent]:
        return [e async for e in adapter.stream(req or request())]

    return asyncio.run(collect())


def done(events: list[StreamEvent]) -> TurnDone:
    assert isinstance(events[-1], TurnDone)
    assert sum(isinstance(e, TurnDone) for e in events) == 1
    return events[-1]


def failure(adapter: AnthropicAdapter, req: ModelRequest | None = None) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        run(adapter, req)
    return info.value


def result(call_id: str, content: str, *, is_error: bool = False) -> JsonObj:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}


def cache_marks(value: Any, path: str = "") -> list[str]:
    """Where ``cache_control`` appears in a JSON value."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "cache_control":
                assert item == {"type": "ephemeral"}
                found.append(path)
            found += cache_marks(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += cache_marks(item, f"{path}[{i}]")
    return found


# --------------------------------------------------------------------------- the stream


def test_the_documented_event_sequence_streams_text_and_ends_in_one_turn(api: Start) -> None:
    server, adapter = api(
        Sse(
            [
                message_start("claude-test-1-20261201", input_tokens=472, output_tokens=2),
                block_start(0, {"type": "text", "text": ""}),
                ping(),
                delta(0, {"type": "text_delta", "text": "Hello"}),
                delta(0, {"type": "text_delta", "text": ", wor"}),
                ping(),
                delta(0, {"type": "text_delta", "text": "ld!"}),
                block_stop(0),
                message_delta("end_turn", output_tokens=15),
                message_stop(),
            ]
        )
    )
    events = run(adapter)
    assert events[:-1] == [TextDelta("Hello"), TextDelta(", wor"), TextDelta("ld!")]
    assert done(events) == TurnDone(
        (TextBlock("Hello, world!"),),
        "end_turn",
        Usage(input=472, output=15, cache_read=None, cache_write=None),
        "claude-test-1-20261201",
    )
    (sent,) = server.recorded
    assert sent.path == "/v1/messages"
    assert sent.body["stream"] is True
    assert sent.body["model"] == MODEL


def test_tool_input_fragments_split_anywhere_are_joined_and_parsed(api: Start) -> None:
    fragments = [
        "",
        '{"pa',
        'th": "dir/\\',
        'u00e9t\\u00e9.txt", "li',
        'nes": [1, ',
        '2], "emoji": "\\ud83d',
        '\\ude00", "nested": {"a": nu',
        "ll}",
        "}",
    ]
    _, adapter = api(turn(tool_block(0, "toolu_01", "read_file", *fragments), stop="tool_use"))
    events = run(adapter)
    assert events[:-1] == []
    assert done(events).blocks == (
        ToolCall(
            "toolu_01",
            "read_file",
            {"path": "dir/été.txt", "lines": [1, 2], "emoji": "😀", "nested": {"a": None}},
        ),
    )
    assert done(events).stop == "tool_use"


def test_two_tool_calls_after_text_keep_their_order_and_an_empty_input_is_an_object(
    api: Start,
) -> None:
    _, adapter = api(
        turn(
            text_block(0, "Reading ", "both."),
            tool_block(1, "toolu_a", "lookup", '{"key": ', '"alpha"}'),
            tool_block(2, "toolu_b", "list_all"),
            stop="tool_use",
        )
    )
    turn_done = done(run(adapter))
    assert turn_done.blocks == (
        TextBlock("Reading both."),
        ToolCall("toolu_a", "lookup", {"key": "alpha"}),
        ToolCall("toolu_b", "list_all", {}),
    )


def test_thinking_streams_live_and_its_signature_is_replayed_exactly(api: Start) -> None:
    pieces = [THOUGHT[:7], THOUGHT[7:30], THOUGHT[30:]]
    server, adapter = api(
        turn(
            thinking_block(0, pieces, [SIGNATURE[:10], SIGNATURE[10:]]),
            text_block(1, "Let me look."),
            tool_block(2, "toolu_1", "lookup", '{"key": "alpha"}'),
            stop="tool_use",
        ),
        turn(text_block(0, "alpha is 1.")),
    )
    first = run(adapter, request(user("what is alpha?"), tools=[READ_TOOL]))
    assert first[:-1] == [*(ThinkingDelta(p) for p in pieces), TextDelta("Let me look.")]
    blocks = done(first).blocks
    assert blocks[0] == ThinkingBlock(THOUGHT, SIGNATURE)
    follow_up = request(
        user("what is alpha?"),
        AssistantMessage(blocks),
        ToolResultMessage("toolu_1", "lookup", "alpha = 1", False),
        tools=[READ_TOOL],
    )
    run(adapter, follow_up)
    replayed = server.recorded[1].body["messages"][1]
    assert replayed == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "alpha"}},
        ],
    }
    assert json.dumps(SIGNATURE).encode() in server.recorded[1].raw


@pytest.mark.parametrize(
    "stop", ["end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "pause_turn"]
)
def test_the_api_stop_reasons_pass_through_unchanged(api: Start, stop: str) -> None:
    _, adapter = api(turn(text_block(0, "partial"), stop=stop))
    assert done(run(adapter)).stop == stop


def test_a_full_context_window_is_a_context_overflow_not_a_turn(api: Start) -> None:
    _, adapter = api(turn(text_block(0, "and th"), stop="model_context_window_exceeded"))
    exc = failure(adapter)
    assert (exc.code, exc.retryable) == ("context_overflow", False)


def test_an_unknown_stop_reason_is_an_invalid_stream(api: Start) -> None:
    _, adapter = api(turn(text_block(0, "hm"), stop="out_of_coffee"))
    exc = failure(adapter)
    assert exc.code == "invalid_stream"
    assert "out_of_coffee" in exc.message


@pytest.mark.parametrize(
    ("stop", "code", "retryable"),
    [("max_tokens", "truncated_tool_call", False), ("tool_use", "invalid_tool_call", True)],
)
def test_a_tool_input_that_does_not_parse(
    api: Start, stop: str, code: str, retryable: bool
) -> None:
    _, adapter = api(turn(tool_block(0, "toolu_1", "write", '{"path": "a.txt", "te'), stop=stop))
    exc = failure(adapter)
    assert (exc.code, exc.retryable) == (code, retryable)
    assert "write" in exc.message


@pytest.mark.parametrize(
    "events",
    [
        [message_start(), *text_block(0, "half a tho")],
        [message_start(), *text_block(0, "no stop event"), message_delta("end_turn")],
        [message_start(), *text_block(0, "no reason"), message_delta(None), message_stop()],
    ],
    ids=["no-message-delta", "no-message-stop", "no-stop-reason"],
)
def test_a_stream_that_ends_early_is_incomplete_and_retryable(
    api: Start, events: list[tuple[str, JsonObj]]
) -> None:
    _, adapter = api(Sse(events))
    exc = failure(adapter)
    assert (exc.code, exc.retryable) == ("incomplete_stream", True)


class Failure(NamedTuple):
    """An API error (``kind``, ``message``) and the ProviderError it must become."""

    status: int
    kind: str
    message: str
    code: str
    retryable: bool
    headers: tuple[tuple[str, str], ...] = ()
    retry_after: float | None = None


TOO_LONG = "prompt is too long: 210000 tokens > 200000 maximum"


@pytest.mark.parametrize(
    "case",
    [
        Failure(529, "overloaded_error", "Overloaded", "overloaded", True),
        Failure(500, "api_error", "Internal server error", "api_5xx", True),
        Failure(429, "rate_limit_error", "Slow down", "rate_limit", True),
        Failure(400, "invalid_request_error", TOO_LONG, "context_overflow", False),
    ],
    ids=lambda case: case.kind,
)
def test_an_error_event_mid_stream_is_mapped_by_its_type(api: Start, case: Failure) -> None:
    _, adapter = api(
        Sse(
            [
                message_start(),
                *text_block(0, "Sure, here"),
                ("error", error(case.kind, case.message)),
            ]
        )
    )
    exc = failure(adapter)
    assert (exc.code, exc.status, exc.retryable) == (case.code, case.status, case.retryable)
    assert case.message in exc.message


@pytest.mark.parametrize(
    "case",
    [
        Failure(400, "invalid_request_error", "roles must alternate", "invalid_request", False),
        Failure(400, "invalid_request_error", TOO_LONG, "context_overflow", False),
        Failure(401, "authentication_error", "invalid x-api-key", "auth", False),
        Failure(403, "permission_error", "not allowed", "auth", False),
        Failure(404, "not_found_error", "model: claude-nope", "not_found", False),
        Failure(408, "timeout_error", "request timed out", "timeout", True),
        Failure(409, "conflict_error", "conflict", "conflict", True),
        Failure(
            429,
            "rate_limit_error",
            "slow down",
            "rate_limit",
            True,
            headers=(("retry-after", "7"),),
            retry_after=7.0,
        ),
        Failure(500, "api_error", "Internal server error", "api_5xx", True),
        Failure(529, "overloaded_error", "Overloaded", "overloaded", True),
    ],
    ids=lambda case: f"{case.status}-{case.code}",
)
def test_http_errors_are_mapped_and_the_sdk_does_not_retry(api: Start, case: Failure) -> None:
    server, adapter = api(Status(case.status, error(case.kind, case.message), dict(case.headers)))
    exc = failure(adapter)
    assert (exc.status, exc.code, exc.retryable, exc.retry_after) == (
        case.status,
        case.code,
        case.retryable,
        case.retry_after,
    )
    assert case.message in exc.message
    assert exc.message.startswith("anthropic: ")
    assert len(server.recorded) == 1


def test_a_connection_cut_mid_stream_is_a_retryable_network_error(api: Start) -> None:
    _, adapter = api(Sse([message_start(), *text_block(0, "half")], cut=True))
    exc = failure(adapter)
    assert (exc.code, exc.retryable) == ("network", True)


def test_a_refused_connection_is_a_retryable_network_error() -> None:
    with serve([]) as server:
        url = base_url(server)
    adapter = AnthropicAdapter(model=MODEL, api_key=KEY, base_url=url)
    exc = failure(adapter)
    assert (exc.code, exc.retryable) == ("network", True)


def test_unknown_events_and_blocks_are_ignored(api: Start) -> None:
    _, adapter = api(
        Sse(
            [
                message_start(),
                ("future_event", {"type": "future_event", "x": 1}),
                block_start(0, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}),
                block_stop(0),
                *text_block(1, "ok"),
                message_delta("end_turn"),
                message_stop(),
            ]
        )
    )
    assert done(run(adapter)).blocks == (TextBlock("ok"),)


def test_usage_reports_cache_counts_and_leaves_unreported_ones_none(api: Start) -> None:
    _, adapter = api(
        turn(text_block(0, "a"), cache_read=1800, cache_write=0, output_tokens=42),
        Sse([message_start(), *text_block(0, "b"), ("message_stop", {"type": "message_stop"})]),
    )
    assert done(run(adapter)).usage == Usage(25, 42, 1800, 0)
    assert failure(adapter).code == "incomplete_stream"  # no stop reason: nothing invented


def test_a_consumer_that_stops_early_closes_the_stream(api: Start) -> None:
    server, adapter = api(turn(text_block(0, "one", "two", "three")))

    async def first_piece() -> StreamEvent:
        stream = adapter.stream(request())
        try:
            return await anext(stream)
        finally:
            await stream.aclose()  # what the runtime does on abort or a failed attempt

    assert asyncio.run(first_piece()) == TextDelta("one")
    assert len(server.recorded) == 1


def test_a_hosts_http_client_is_reused_and_left_open(api: Start) -> None:
    import httpx2

    reply = turn(text_block(0, "ok"))
    server, _ = api(reply, reply)

    async def twice() -> bool:
        async with httpx2.AsyncClient() as http:
            adapter = AnthropicAdapter(
                model=MODEL, api_key=KEY, base_url=base_url(server), http_client=http
            )
            for _ in range(2):
                assert done([e async for e in adapter.stream(request())]).blocks
            return http.is_closed

    assert asyncio.run(twice()) is False
    assert len(server.recorded) == 2


# --------------------------------------------------------------------------- the request


def test_the_request_body_alternates_roles_and_merges_tool_results(api: Start) -> None:
    server, adapter = api(turn(text_block(0, "ok")))
    history = request(
        UserMessage((TextBlock("look at these"), ImageBlock(**PNG))),
        UserMessage((ImageBlock("image/jpeg", url="https://example.com/cat.jpg"),)),
        AssistantMessage(
            (
                ThinkingBlock("unsigned thoughts are dropped"),
                TextBlock("Two lookups."),
                ToolCall("toolu_a", "lookup", {"key": "a"}),
                ToolCall("toolu_b", "lookup", {"key": "b"}),
            )
        ),
        ToolResultMessage("toolu_a", "lookup", "a = 1", False),
        ToolResultMessage("toolu_b", "lookup", "no such key", True),
        user("and also c"),
        tools=[READ_TOOL, ToolSpec("note", "Write a note", {"type": "object"})],
    )
    run(adapter, history)
    (sent,) = server.recorded
    assert sent.body == {
        "max_tokens": 8192,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look at these"},
                    {"type": "image", "source": {"type": "base64", **PNG}},
                    {
                        "type": "image",
                        "source": {"type": "url", "url": "https://example.com/cat.jpg"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Two lookups."},
                    {"type": "tool_use", "id": "toolu_a", "name": "lookup", "input": {"key": "a"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "lookup", "input": {"key": "b"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    result("toolu_a", "a = 1"),
                    result("toolu_b", "no such key", is_error=True),
                    {"type": "text", "text": "and also c"},
                ],
            },
        ],
        "model": MODEL,
        "stream": True,
        "system": "You help.",
        "tools": [
            {"name": "lookup", "description": "Look a key up", "input_schema": READ_SCHEMA},
            {"name": "note", "description": "Write a note", "input_schema": {"type": "object"}},
        ],
    }  # fmt: skip


def test_an_assistant_turn_of_only_unsigned_thinking_leaves_no_empty_message(api: Start) -> None:
    server, adapter = api(turn(text_block(0, "ok")))
    run(adapter, request(user("one"), AssistantMessage((ThinkingBlock("hm"),)), user("two")))
    assert server.recorded[0].body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        }
    ]


def test_the_key_reaches_the_server_exactly_as_configured(api: Start) -> None:
    server, adapter = api(turn(text_block(0, "ok")))
    run(adapter)
    headers = server.recorded[0].headers
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["anthropic-version"]


def test_without_a_key_the_environments_key_is_never_sent(
    api: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-the-environment")
    server, adapter = api(turn(text_block(0, "ok")), api_key=None)
    run(adapter)
    assert server.recorded[0].headers["authorization"] == "Bearer no-key"


def test_default_headers_are_sent(api: Start) -> None:
    server, adapter = api(turn(text_block(0, "ok")), default_headers={"x-team": "kiso"})
    run(adapter)
    assert server.recorded[0].headers["x-team"] == "kiso"


def _cached_history() -> ModelRequest:
    return request(
        user("one"),
        AssistantMessage((TextBlock("calling"), ToolCall("toolu_1", "lookup", {"key": "k"}))),
        ToolResultMessage("toolu_1", "lookup", "k = 3", False),
        tools=[READ_TOOL, ToolSpec("note", "Write a note", {"type": "object"})],
    )


def test_prompt_caching_is_off_by_default_and_marks_nothing(api: Start) -> None:
    server, adapter = api(turn(text_block(0, "ok")))
    run(adapter, _cached_history())
    assert b"cache_control" not in server.recorded[0].raw
    assert server.recorded[0].body["system"] == "You help."


def test_prompt_caching_marks_system_last_tool_and_last_block(api: Start) -> None:
    server, adapter = api(turn(text_block(0, "ok")), prompt_caching=True)
    run(adapter, _cached_history())
    body = server.recorded[0].body
    assert cache_marks(body) == [".messages[2].content[0]", ".system[0]", ".tools[1]"]
    assert body["system"] == [
        {"type": "text", "text": "You help.", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["messages"][2]["content"][0]["type"] == "tool_result"


def test_the_same_request_gives_byte_identical_bodies(api: Start) -> None:
    reply = turn(text_block(0, "ok"))
    server, adapter = api(reply, reply, prompt_caching=True, thinking_budget=2048)
    run(adapter, _cached_history())
    run(adapter, _cached_history())
    first, second = server.recorded
    assert first.raw == second.raw


@pytest.mark.parametrize(
    ("max_output", "budget", "max_tokens"), [(8192, 2048, 8192), (4096, 16000, 20096)]
)
def test_a_thinking_budget_enables_thinking_under_max_tokens(
    api: Start, max_output: int, budget: int, max_tokens: int
) -> None:
    server, adapter = api(
        turn(text_block(0, "ok")), thinking_budget=budget, max_output_tokens=max_output
    )
    run(adapter)
    body = server.recorded[0].body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert body["max_tokens"] == max_tokens > budget


def test_importing_the_providers_does_not_import_the_sdk() -> None:
    code = (
        "import sys, kiso.providers, kiso.providers.anthropic\n"
        "assert 'anthropic' not in sys.modules, 'the SDK was imported'\n"
        "kiso.providers.anthropic.AnthropicAdapter(model='m', api_key=None)\n"
        "assert 'anthropic' not in sys.modules, 'constructing imported the SDK'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- end to end


def _lookup_tool() -> Any:
    return define_tool(
        "lookup",
        "Look a key up",
        READ_SCHEMA,
        lambda args: f"{args['key']} = 42",
        effects="read",
    )


def _tool_then_text(body: JsonObj) -> Sse:
    """A tool call first; a text answer once the request carries the tool's result."""
    last = body["messages"][-1]["content"]
    if any(block["type"] == "tool_result" for block in last):
        return turn(text_block(0, "alpha is ", "42."), cache_read=512, cache_write=0)
    return turn(
        thinking_block(0, [THOUGHT], [SIGNATURE]),
        tool_block(1, "toolu_e2e", "lookup", '{"ke', 'y": "al', 'pha"}'),
        stop="tool_use",
        cache_write=512,
    )


def _agent(server: Server, tmp_path: Path) -> Agent:
    return Agent(
        adapter=AnthropicAdapter(model=MODEL, api_key="sk-ant-test", base_url=base_url(server)),
        tools=[_lookup_tool()],
        store=JsonlSessionStore(tmp_path / "home"),
        workspace=tmp_path,
        retry_base_delay=0.01,
    )


def test_end_to_end_a_tool_call_then_an_answer_completes_the_run(tmp_path: Path) -> None:
    with (
        serve([_tool_then_text, _tool_then_text]) as server,
        _agent(server, tmp_path).session("e2e") as session,
    ):
        seen = list(session.run_sync("What is alpha?"))
    assert isinstance(seen[-1], ev.Terminal)
    assert seen[-1].outcome.kind == "completed"
    assert [e.type for e in seen if not isinstance(e, ev.TextDelta | ev.ThinkingDelta)] == [
        "model_turn",
        "decision",
        "tool_start",
        "tool_end",
        "model_turn",
        "terminal",
    ]
    (decision,) = (e for e in seen if isinstance(e, ev.Decision))
    assert decision.event.decision == "approved"
    log = JsonlSessionStore(tmp_path / "home").load("e2e").events
    first, second = (e for e in log if isinstance(e, Assistant))
    assert first.blocks == (
        ThinkingBlock(THOUGHT, SIGNATURE),
        ToolCall("toolu_e2e", "lookup", {"key": "alpha"}),
    )
    assert first.stop == "tool_use"
    assert first.usage == Usage(input=25, output=15, cache_read=None, cache_write=512)
    assert first.model == "claude-test-1"
    assert second.blocks == (TextBlock("alpha is 42."),)
    assert second.usage == Usage(input=25, output=15, cache_read=512, cache_write=0)
    (finished,) = (e for e in log if isinstance(e, ExecutionFinished))
    assert finished.content == "alpha = 42"
    assert [e.outcome.kind for e in log if isinstance(e, RunEnded)] == ["completed"]

    replay = server.recorded[1].body["messages"]
    assert [m["role"] for m in replay] == ["user", "assistant", "user"]
    assert replay[1]["content"][0] == {
        "type": "thinking",
        "thinking": THOUGHT,
        "signature": SIGNATURE,
    }
    assert replay[2]["content"] == [result("toolu_e2e", "alpha = 42")]


def test_end_to_end_an_overloaded_api_is_retried_by_the_runtime(tmp_path: Path) -> None:
    script: list[Reply] = [
        Status(529, error("overloaded_error", "Overloaded")),
        turn(text_block(0, "Hello again.")),
    ]
    with serve(script) as server, _agent(server, tmp_path).session("retry") as session:
        seen = list(session.run_sync("hi"))
    retries = [e for e in seen if isinstance(e, ev.Retry)]
    assert len(retries) == 1
    assert retries[0].attempt == 1
    assert "Overloaded" in retries[0].error
    assert isinstance(seen[-1], ev.Terminal)
    assert seen[-1].outcome.kind == "completed"
    assert len(server.recorded) == 2
    assert server.recorded[0].raw == server.recorded[1].raw
