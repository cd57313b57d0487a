"""OpenAICompatAdapter against a local server speaking the Chat Completions wire format.

Every request goes through the official ``openai`` SDK over real HTTP to 127.0.0.1; the server
replays chunks shaped exactly as the providers document them (id, object, created, model,
choices[].delta, finish_reason, a final usage chunk with empty choices, ``data: [DONE]``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx2
import pytest

from kiso.kernel import (
    Assistant,
    AssistantMessage,
    ExecutionFinished,
    ImageBlock,
    MemorySessionStore,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from kiso.providers import ModelRequest, ProviderError, StreamEvent, TextDelta, ToolSpec, TurnDone
from kiso.providers.base import ThinkingDelta
from kiso.providers.openai_compat import OpenAICompatAdapter, chat_messages
from kiso.runtime import Agent
from kiso.tools.base import ToolContext, define_tool

from . import harness
from .harness import done_of, drain
from .sse import Event, Recorded, Reply, SSEServer, Stream

MODEL = "gpt-test-2026-01-01"
TOOL = ToolSpec(
    "read_note",
    "Read a note from the workspace",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
HELLO = ModelRequest(system="Be brief.", messages=(UserMessage((TextBlock("hello"),)),))


# --------------------------------------------------------------------------- the wire


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, *, model: str = MODEL
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion.chunk",
        "created": 1790000000,
        "model": model,
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        usage["completion_tokens_details"] = {"reasoning_tokens": 0}
    return {**chunk(), "choices": [], "usage": usage}


def call_fragment(
    index: int, arguments: str, *, call_id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        fragment["id"] = call_id
        fragment["type"] = "function"
        fragment["function"]["name"] = name
    return chunk({"tool_calls": [fragment]})


def sse(*chunks: dict[str, Any], done: bool = True, cut: bool = False) -> Stream:
    events = [Event(c) for c in chunks] + ([Event("[DONE]")] if done and not cut else [])
    return Stream(events, cut=cut)


def text_reply(*pieces: str, finish: str = "stop") -> Stream:
    return sse(
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": p}) for p in pieces),
        chunk({}, finish),
        usage_chunk(20, len(pieces)),
    )


def api_error(
    status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None
) -> Reply:
    return Reply(status, {"error": {"message": message, "type": type, "param": None, "code": code}})


def adapter(server: SSEServer, **kw: Any) -> OpenAICompatAdapter:
    kw.setdefault("api_key", "sk-test")
    return OpenAICompatAdapter(model=MODEL, base_url=server.url + "/v1", **kw)


def collect(
    script: Sequence[Stream | Reply], request: ModelRequest = HELLO, **kw: Any
) -> tuple[list[StreamEvent], list[Recorded]]:
    return harness.collect(adapter, script, request, **kw)


def failure(script: Sequence[Stream | Reply], request: ModelRequest = HELLO) -> ProviderError:
    return harness.failure(adapter, script, request)


# --------------------------------------------------------------------------- streaming


def test_text_arrives_in_pieces_and_the_turn_carries_it_whole() -> None:
    events, requests = collect([text_reply("Hel", "lo, ", "wörld", "!")])
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hel", "lo, ", "wörld", "!"]
    done = done_of(events)
    assert done.blocks == (TextBlock("Hello, wörld!"),)
    assert done.stop == "end_turn"
    assert done.model == MODEL
    assert done.usage == Usage(input=20, output=4, cache_read=None, cache_write=None)
    assert len(requests) == 1 and requests[0].path == "/v1/chat/completions"


def test_reasoning_content_streams_as_thinking_and_comes_first() -> None:
    events, _ = collect(
        [
            sse(
                chunk({"role": "assistant", "content": None, "reasoning_content": "Let me "}),
                chunk({"reasoning_content": "think."}),
                chunk({"content": "Answer."}),
                call_fragment(0, "{}", call_id="call_1", name="read_note"),
                chunk({}, "tool_calls"),
            )
        ]
    )
    assert [type(e) for e in events] == [ThinkingDelta, ThinkingDelta, TextDelta, TurnDone]
    done = done_of(events)
    assert done.blocks == (
        ThinkingBlock("Let me think."),
        TextBlock("Answer."),
        ToolCall("call_1", "read_note", {}),
    )
    assert done.usage == Usage()  # no usage chunk: nothing is made up


def test_tool_call_arguments_split_anywhere_are_reassembled() -> None:
    arguments = '{"path": "caf\\u00e9/\\ud83d\\ude00.txt", "n": [1, 2]}'
    cuts = [0, 3, 5, 14, 17, 24, 29, 33, 40, len(arguments)]  # mid-key, mid-escape, mid-pair
    pieces = [arguments[a:b] for a, b in itertools.pairwise(cuts)]
    first, *rest = pieces
    events, _ = collect(
        [
            sse(
                chunk({"role": "assistant", "content": None}),
                call_fragment(0, first, call_id="call_Abc", name="read_note"),
                *(call_fragment(0, p) for p in rest),
                chunk({}, "tool_calls"),
                usage_chunk(50, 12),
            )
        ]
    )
    done = done_of(events)
    assert done.blocks == (ToolCall("call_Abc", "read_note", {"path": "café/😀.txt", "n": [1, 2]}),)
    assert done.stop == "tool_use"


def test_parallel_calls_interleaved_by_index_keep_their_own_arguments() -> None:
    events, _ = collect(
        [
            sse(
                call_fragment(0, "", call_id="call_a", name="read_note"),
                call_fragment(1, "", call_id="call_b", name="read_note"),
                call_fragment(1, '{"path": "b'),
                call_fragment(0, '{"path"'),
                call_fragment(0, ': "a.txt"}'),
                call_fragment(1, '.txt"}'),
                chunk({}, "tool_calls"),
            )
        ]
    )
    assert done_of(events).blocks == (
        ToolCall("call_a", "read_note", {"path": "a.txt"}),
        ToolCall("call_b", "read_note", {"path": "b.txt"}),
    )


def test_empty_arguments_are_an_empty_object() -> None:
    events, _ = collect(
        [sse(call_fragment(0, "", call_id="call_1", name="read_note"), chunk({}, "tool_calls"))]
    )
    assert done_of(events).blocks == (ToolCall("call_1", "read_note", {}),)


def test_usage_with_cached_tokens_from_a_chunk_with_empty_choices() -> None:
    events, _ = collect(
        [sse(chunk({"content": "ok"}), chunk({}, "stop"), usage_chunk(1200, 30, cached=1024))]
    )
    assert done_of(events).usage == Usage(input=176, output=30, cache_read=1024, cache_write=None)


def test_deepseek_cache_hit_tokens_count_as_cache_reads() -> None:
    usage = {
        "prompt_tokens": 900,
        "completion_tokens": 7,
        "total_tokens": 907,
        "prompt_cache_hit_tokens": 640,
        "prompt_cache_miss_tokens": 260,
    }
    events, _ = collect(
        [
            sse(
                chunk({"content": "ok"}),
                chunk({}, "stop"),
                {**chunk(), "choices": [], "usage": usage},
            )
        ]
    )
    assert done_of(events).usage == Usage(input=260, output=7, cache_read=640)


def test_the_model_named_by_the_stream_is_recorded() -> None:
    events, _ = collect(
        [sse(chunk({"content": "x"}, model="gpt-test-2026-02-02"), chunk({}, "stop"))]
    )
    assert done_of(events).model == "gpt-test-2026-02-02"


# --------------------------------------------------------------------------- stops


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("length", "max_tokens"),
        ("content_filter", "content_filter"),
    ],
)
def test_finish_reasons_map_to_stops(finish: str, stop: str) -> None:
    events, _ = collect([text_reply("partial", finish=finish)])
    assert done_of(events).stop == stop


def test_stop_after_tool_calls_is_tool_use() -> None:
    events, _ = collect(
        [sse(call_fragment(0, '{"path": "a"}', call_id="c1", name="read_note"), chunk({}, "stop"))]
    )
    assert done_of(events).stop == "tool_use"


def test_an_unknown_finish_reason_is_an_invalid_stream() -> None:
    err = failure([text_reply("x", finish="insufficient_system_resource")])
    assert (err.code, err.retryable) == ("invalid_stream", True)


def test_a_refusal_stops_the_turn_as_refusal() -> None:
    events, _ = collect(
        [
            sse(
                chunk({"role": "assistant", "content": None, "refusal": ""}),
                chunk({"refusal": "I can't help "}),
                chunk({"refusal": "with that."}),
                chunk({}, "stop"),
                usage_chunk(10, 6),
            )
        ]
    )
    done = done_of(events)
    assert done.stop == "refusal"
    assert done.blocks == (TextBlock("I can't help with that."),)


def test_a_content_filter_stop_keeps_what_was_said() -> None:
    events, _ = collect([text_reply("Here is", finish="content_filter")])
    done = done_of(events)
    assert (done.stop, done.blocks) == ("content_filter", (TextBlock("Here is"),))


def test_a_tool_call_cut_off_at_the_output_limit_is_not_retried() -> None:
    err = failure(
        [
            sse(
                call_fragment(0, '{"path": "very/long/pa', call_id="call_1", name="read_note"),
                chunk({}, "length"),
                usage_chunk(10, 4096),
            )
        ]
    )
    assert (err.code, err.retryable) == ("truncated_tool_call", False)
    assert "cut off at its output limit" in err.message


def test_unparseable_arguments_without_a_length_stop_are_an_invalid_tool_call() -> None:
    err = failure(
        [sse(call_fragment(0, '{"path": ', call_id="c", name="read_note"), chunk({}, "tool_calls"))]
    )
    assert (err.code, err.retryable) == ("invalid_tool_call", False)


@pytest.mark.parametrize("done", [True, False])
def test_a_stream_that_ends_without_a_finish_reason_is_incomplete(done: bool) -> None:
    err = failure([sse(chunk({"content": "Hel"}), chunk({"content": "lo"}), done=done)])
    assert (err.code, err.retryable) == ("incomplete_stream", True)


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("status", "message", "code", "retryable"),
    [
        (400, "Invalid value for 'messages'.", "invalid_request", False),
        (
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130512 tokens.",
            "context_overflow",
            False,
        ),
        (401, "Incorrect API key provided: sk-test.", "auth", False),
        (403, "Project does not have access to model.", "auth", False),
        (404, "The model `gpt-nope` does not exist.", "not_found", False),
        (408, "Request timed out.", "timeout", True),
        (409, "Conflict.", "conflict", True),
        (500, "The server had an error while processing your request.", "api_5xx", True),
        (503, "The engine is currently overloaded.", "api_5xx", True),
        (529, "Overloaded.", "overloaded", True),
    ],
)
def test_error_statuses_map_to_provider_errors(
    status: int, message: str, code: str, retryable: bool
) -> None:
    err = failure([api_error(status, message)])
    assert (err.status, err.code, err.retryable) == (status, code, retryable)
    assert message.split(".", maxsplit=1)[0] in err.message


def test_429_honours_retry_after() -> None:
    err = failure(
        [
            Reply(
                429,
                {"error": {"message": "Rate limit reached", "type": "requests", "code": None}},
                headers={"retry-after": "7"},
            )
        ]
    )
    assert (err.status, err.code, err.retryable, err.retry_after) == (429, "rate_limit", True, 7.0)


def test_429_honours_retry_after_ms() -> None:
    err = failure([Reply(429, {"error": {"message": "slow"}}, headers={"retry-after-ms": "1500"})])
    assert err.retry_after == 1.5


@pytest.mark.parametrize(
    ("error", "code", "retryable"),
    [
        ({"message": "The server had an error", "type": "server_error"}, "api_5xx", True),
        (
            {"message": "Rate limit", "type": "requests", "code": "rate_limit_exceeded"},
            "rate_limit",
            True,
        ),
        ({"message": "too long", "code": "context_length_exceeded"}, "context_overflow", False),
        ({"message": "something odd"}, "unknown", False),
    ],
)
def test_an_error_in_the_middle_of_the_stream(
    error: dict[str, Any], code: str, retryable: bool
) -> None:
    err = failure([sse(chunk({"content": "Hello"}), {"error": error}, done=False)])
    assert (err.code, err.retryable) == (code, retryable)


def test_a_dropped_connection_is_a_retryable_network_error() -> None:
    err = failure([sse(chunk({"content": "Hel"}), chunk({"content": "lo"}), cut=True)])
    assert (err.code, err.retryable, err.status) == ("network", True, None)


def test_nothing_listening_is_a_retryable_network_error() -> None:
    with SSEServer() as server:
        url = server.url
    a = OpenAICompatAdapter(model=MODEL, api_key="sk-test", base_url=url + "/v1")
    with pytest.raises(ProviderError) as caught:
        asyncio.run(drain(a, HELLO))
    assert (caught.value.code, caught.value.retryable) == ("network", True)


# --------------------------------------------------------------------------- the request


def history() -> tuple[Message, ...]:
    return (
        UserMessage(
            (
                TextBlock("What is in these?"),
                ImageBlock("image/png", data="iVBORw0KGgo="),
                ImageBlock("image/jpeg", url="https://example.com/cat.jpg"),
            )
        ),
        AssistantMessage(
            (
                TextBlock("Let me look."),
                ToolCall("call_1", "read_note", {"path": "notes/été.txt", "z": 1, "a": 2}),
                ToolCall("call_2", "read_note", {"path": "b.txt"}),
            )
        ),
        ToolResultMessage("call_1", "read_note", "a cat", False),
        ToolResultMessage("call_2", "read_note", "error: no such file", True),
        AssistantMessage((TextBlock("A cat."),)),
        UserMessage((TextBlock("thanks"),)),
    )


def test_the_request_body_is_the_documented_translation() -> None:
    request = ModelRequest(system="You are kiso.", messages=history(), tools=(TOOL,))
    _, requests = collect([text_reply("ok")], request, max_output_tokens=2048)
    (sent,) = requests
    assert sent.method == "POST" and sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.credential == "sk-test"
    body = sent.json
    assert body["model"] == MODEL
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 2048  # a gateway: the field every compatible server reads
    assert "max_completion_tokens" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_note",
                "description": "Read a note from the workspace",
                "parameters": TOOL.parameters,
            },
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "You are kiso."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in these?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "read_note",
                        "arguments": '{"path": "notes/été.txt", "z": 1, "a": 2}',
                    },
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "read_note", "arguments": '{"path": "b.txt"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
        {"role": "tool", "tool_call_id": "call_2", "content": "error: no such file"},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "thanks"},
    ]


def test_the_same_request_gives_byte_identical_bodies() -> None:
    request = ModelRequest(system="You are kiso.", messages=history(), tools=(TOOL,))

    async def twice(a: OpenAICompatAdapter) -> None:
        await drain(a, request)
        await drain(a, request)

    with SSEServer([text_reply("a"), text_reply("b")]) as server:
        asyncio.run(twice(adapter(server, max_output_tokens=100)))
    first, second = server.requests
    assert first.body == second.body
    assert b"\\u00e9" not in first.body  # arguments keep their characters (ensure_ascii=False)


def test_only_tool_calls_send_null_content_and_effort_is_passed() -> None:
    request = ModelRequest(
        system=None,
        messages=(
            UserMessage((TextBlock("go"),)),
            AssistantMessage((ToolCall("c1", "read_note", {}),)),
            ToolResultMessage("c1", "read_note", "done", False),
        ),
    )
    _, requests = collect([text_reply("ok")], request, reasoning_effort="high")
    body = requests[0].json
    assert body["reasoning_effort"] == "high"
    assert "tools" not in body and "max_tokens" not in body
    assert body["messages"][0] == {"role": "user", "content": "go"}
    assert body["messages"][1]["content"] is None


def test_openai_itself_gets_max_completion_tokens() -> None:
    for base_url in (None, "https://api.openai.com/v1"):
        a = OpenAICompatAdapter(model=MODEL, api_key="k", base_url=base_url, max_output_tokens=9)
        params = a.request_params(HELLO)
        assert params["max_completion_tokens"] == 9 and "max_tokens" not in params


def test_reasoning_is_echoed_on_every_assistant_message_once_any_has_it() -> None:
    user = UserMessage((TextBlock("q"),))
    turns: list[Message] = [
        user,
        AssistantMessage((TextBlock("plain"),)),
        user,
        AssistantMessage((ThinkingBlock("first thought"), TextBlock("a"))),
        user,
        AssistantMessage((TextBlock("no thinking this time"),)),
        AssistantMessage((ThinkingBlock("x", signature="s"), ToolCall("c", "read_note", {}))),
    ]
    full = chat_messages(None, turns)
    assistants = [m for m in full if m["role"] == "assistant"]
    assert [m["reasoning_content"] for m in assistants] == ["", "first thought", "", "x"]
    before = chat_messages(None, turns[:3])  # no reasoning yet: no field at all
    assert all("reasoning_content" not in m for m in before)
    for k in range(4, len(turns) + 1):  # once it is on, each prefix renders as it did before
        assert json.dumps(chat_messages(None, turns[:k])) == json.dumps(full[:k])


def test_the_configured_key_is_sent_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", "Authorization: Bearer sk-ambient\nX-Extra: 1")
    _, requests = collect([text_reply("a")])
    assert requests[0].headers["authorization"] == "Bearer sk-test"
    _, requests = collect([text_reply("a")], api_key=None)
    assert requests[0].headers["authorization"] == "Bearer no-key"


def test_default_headers_are_sent() -> None:
    _, requests = collect([text_reply("a")], default_headers={"X-Title": "kiso"})
    assert requests[0].headers["x-title"] == "kiso"


def test_a_callers_http_client_is_reused_and_left_open() -> None:
    async def two_turns(server: SSEServer) -> None:
        async with httpx2.AsyncClient() as client:
            a = adapter(server, http_client=client)
            assert done_of(await drain(a, HELLO)).blocks == (TextBlock("one"),)
            assert done_of(await drain(a, HELLO)).blocks == (TextBlock("two"),)
            assert not client.is_closed

    with SSEServer([text_reply("one"), text_reply("two")]) as server:
        asyncio.run(two_turns(server))
    assert len(server.requests) == 2


def test_importing_kiso_providers_does_not_import_the_sdk() -> None:
    code = (
        "import sys, kiso.providers, kiso.providers.openai_compat, "
        "kiso.providers.openai_responses; print('openai' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


def test_the_key_is_not_in_the_repr() -> None:
    a = OpenAICompatAdapter(model=MODEL, api_key="sk-secret", base_url="http://127.0.0.1:9/v1")
    assert "sk-secret" not in repr(a) and a.provider == "openai-compat" and a.model == MODEL


# --------------------------------------------------------------------------- end to end


def read_note_tool(root: Path) -> Any:
    def execute(args: dict[str, Any], ctx: ToolContext) -> str:
        path: str = args["path"]
        return (root / path).read_text(encoding="utf-8")

    return define_tool("read_note", TOOL.description, TOOL.parameters, execute, effects="read")


def scripted_model(request: Recorded) -> Stream:
    """A tool call first; once the tool's result is in the request, an answer."""
    messages = request.json["messages"]
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        return sse(
            chunk({"role": "assistant", "content": None, "reasoning_content": "Read it."}),
            call_fragment(0, '{"pa', call_id="call_e2e", name="read_note"),
            call_fragment(0, 'th": "a.txt"}'),
            chunk({}, "tool_calls"),
            usage_chunk(120, 18, cached=0),
        )
    return sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "The note says: "}),
        chunk({"content": results[0]["content"]}),
        chunk({}, "stop"),
        usage_chunk(160, 9, cached=128),
    )


def agent_for(server: SSEServer, workspace: Path) -> Agent:
    return Agent(
        adapter=adapter(server),
        tools=[read_note_tool(workspace)],
        store=MemorySessionStore(),
        workspace=workspace,
        retry_base_delay=0.01,
    )


def run(agent: Agent, prompt: str) -> tuple[list[Any], list[Any]]:
    with agent.session("e2e") as session:
        seen = list(session.run_sync(prompt))
        return seen, list(session.events)


def test_end_to_end_a_tool_call_then_an_answer(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello from a", encoding="utf-8")
    with SSEServer(scripted_model) as server:
        seen, log = run(agent_for(server, tmp_path), "What does a.txt say?")
    assert seen[-1].type == "terminal" and seen[-1].outcome.kind == "completed"
    assistants = [e for e in log if isinstance(e, Assistant)]
    assert [a.stop for a in assistants] == ["tool_use", "end_turn"]
    assert assistants[0].calls == (ToolCall("call_e2e", "read_note", {"path": "a.txt"}),)
    assert assistants[0].usage == Usage(input=120, output=18, cache_read=0)
    assert assistants[1].text == "The note says: hello from a"
    assert assistants[1].usage == Usage(input=32, output=9, cache_read=128)
    assert all(a.model == MODEL for a in assistants)
    (finished,) = [e for e in log if isinstance(e, ExecutionFinished)]
    assert finished.content == "hello from a"
    second = server.requests[1].json["messages"]
    assert second[-2]["tool_calls"][0]["function"]["arguments"] == '{"path": "a.txt"}'
    assert second[-2]["reasoning_content"] == "Read it."  # the thinking, echoed from the log
    assert second[-1] == {"role": "tool", "tool_call_id": "call_e2e", "content": "hello from a"}
    assert all(r.credential == "sk-test" for r in server.requests)


def test_end_to_end_a_429_is_retried_by_the_runtime(tmp_path: Path) -> None:
    script: list[Stream | Reply] = [
        api_error(429, "Rate limit reached", type="requests"),
        text_reply("fine"),
    ]
    with SSEServer(script) as server:
        seen, log = run(agent_for(server, tmp_path), "hi")
    retries = [e for e in seen if e.type == "retry"]
    assert len(retries) == 1 and "Rate limit reached" in retries[0].error
    assert seen[-1].outcome.kind == "completed"
    assert [a.text for a in log if isinstance(a, Assistant)] == ["fine"]
    assert server.requests[0].body == server.requests[1].body


def test_end_to_end_a_refusal_ends_the_run_with_an_error(tmp_path: Path) -> None:
    refusal = sse(chunk({"refusal": "I can't."}), chunk({}, "stop"))
    with SSEServer([refusal]) as server:
        seen, _ = run(agent_for(server, tmp_path), "hi")
    outcome = seen[-1].outcome
    assert (outcome.kind, outcome.code) == ("error", "refusal")
