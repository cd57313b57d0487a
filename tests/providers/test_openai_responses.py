"""OpenAIResponsesAdapter against a local server speaking the Responses API's streaming events.

Every request goes through the official ``openai`` SDK over real HTTP to 127.0.0.1; the server
sends named events (``event: response.output_text.delta``) whose data carry ``type`` and
``sequence_number``, and response objects with ``status``, ``output`` and ``usage``, in the order
the API documents: created, in_progress, output items (added, deltas, done), then completed,
incomplete or failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import (
    Assistant,
    AssistantMessage,
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
from kiso.providers import ModelRequest, ProviderError, StreamEvent, TextDelta, ToolSpec
from kiso.providers.base import ThinkingDelta
from kiso.providers.openai_responses import OpenAIResponsesAdapter
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


def usage(input: int, output: int, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input + output,
    }


class Wire:
    """Builds one response's event stream, numbering events and collecting the output."""

    def __init__(self, model: str = MODEL) -> None:
        self.model = model
        self.events: list[dict[str, Any]] = []
        self.output: list[dict[str, Any]] = []
        self.emit("response.created", response=self.response("in_progress"))
        self.emit("response.in_progress", response=self.response("in_progress"))

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        return {
            "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
            "object": "response",
            "created_at": 1790000000,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": None,
            "model": self.model,
            "output": list(self.output) if status != "in_progress" else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": None,
            "user": None,
            "metadata": {},
            **fields,
        }

    def emit(self, type: str, **fields: Any) -> Wire:
        self.events.append({"type": type, "sequence_number": len(self.events), **fields})
        return self

    def _index(self) -> int:
        return len(self.output)

    def message(self, *pieces: str, item_id: str = "msg_1", refusal: bool = False) -> Wire:
        i = self._index()
        kind, delta_event = ("refusal", "response.refusal") if refusal else ("output_text", "")
        item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant"}
        self.emit("response.output_item.added", output_index=i, item={**item, "content": []})
        empty: dict[str, Any] = {"type": kind, kind if refusal else "text": ""}
        if not refusal:
            empty["annotations"] = []
        where = {"item_id": item_id, "output_index": i, "content_index": 0}
        self.emit("response.content_part.added", **where, part=empty)
        prefix = delta_event or "response.output_text"
        for piece in pieces:
            extra: dict[str, Any] = {} if refusal else {"logprobs": []}
            self.emit(f"{prefix}.delta", **where, delta=piece, **extra)
        full = "".join(pieces)
        part = {**empty, ("refusal" if refusal else "text"): full}
        if refusal:
            self.emit("response.refusal.done", **where, refusal=full)
        else:
            self.emit("response.output_text.done", **where, text=full, logprobs=[])
        self.emit("response.content_part.done", **where, part=part)
        done = {**item, "status": "completed", "content": [part]}
        self.output.append(done)
        return self.emit("response.output_item.done", output_index=i, item=done)

    def reasoning(self, *parts: Sequence[str], item_id: str = "rs_1") -> Wire:
        i = self._index()
        item = {"id": item_id, "type": "reasoning", "summary": []}
        self.emit("response.output_item.added", output_index=i, item=item)
        summary = []
        for s, pieces in enumerate(parts):
            where = {"item_id": item_id, "output_index": i, "summary_index": s}
            self.emit("response.reasoning_summary_part.added", **where, part=_summary(""))
            for piece in pieces:
                self.emit("response.reasoning_summary_text.delta", **where, delta=piece)
            full = "".join(pieces)
            self.emit("response.reasoning_summary_text.done", **where, text=full)
            self.emit("response.reasoning_summary_part.done", **where, part=_summary(full))
            summary.append(_summary(full))
        done = {**item, "summary": summary}
        self.output.append(done)
        return self.emit("response.output_item.done", output_index=i, item=done)

    def call(
        self, call_id: str, name: str, *pieces: str, item_id: str = "", finish: bool = True
    ) -> Wire:
        i = self._index()
        item_id = item_id or f"fc_{call_id}"
        item = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
        added = {**item, "arguments": "", "status": "in_progress"}
        self.emit("response.output_item.added", output_index=i, item=added)
        for piece in pieces:
            self.emit(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=i,
                delta=piece,
            )
        if not finish:
            self.output.append({**added, "arguments": "".join(pieces), "status": "incomplete"})
            return self
        arguments = "".join(pieces)
        self.emit(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=i,
            arguments=arguments,
        )
        done = {**item, "arguments": arguments, "status": "completed"}
        self.output.append(done)
        return self.emit("response.output_item.done", output_index=i, item=done)

    def completed(self, used: dict[str, Any] | None = None) -> Stream:
        self.emit("response.completed", response=self.response("completed", usage=used))
        return self.stream()

    def incomplete(self, reason: str, used: dict[str, Any] | None = None) -> Stream:
        response = self.response("incomplete", usage=used, incomplete_details={"reason": reason})
        self.emit("response.incomplete", response=response)
        return self.stream()

    def failed(self, code: str, message: str) -> Stream:
        error = {"code": code, "message": message}
        self.emit("response.failed", response=self.response("failed", error=error))
        return self.stream()

    def stream(self, *, cut: bool = False) -> Stream:
        return Stream([Event(e, event=e["type"]) for e in self.events], cut=cut)


def _summary(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def text_reply(*pieces: str, used: dict[str, Any] | None = None) -> Stream:
    return Wire().message(*pieces).completed(used or usage(20, len(pieces)))


def api_error(status: int, message: str, *, type: str = "invalid_request_error") -> Reply:
    return Reply(status, {"error": {"message": message, "type": type, "param": None, "code": None}})


def adapter(server: SSEServer, **kw: Any) -> OpenAIResponsesAdapter:
    kw.setdefault("api_key", "sk-test")
    return OpenAIResponsesAdapter(model=MODEL, base_url=server.url + "/v1", **kw)


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
    assert (done.stop, done.model) == ("end_turn", MODEL)
    assert done.usage == Usage(input=20, output=4, cache_read=0, cache_write=None)
    assert requests[0].path == "/v1/responses"


def test_reasoning_summaries_stream_as_thinking_and_come_first() -> None:
    wire = Wire().reasoning(["Look at ", "the file."], ["Then answer."])
    wire.message("Done.").call("call_1", "read_note", '{"path": "a"}')
    events, _ = collect([wire.completed(usage(30, 40, reasoning=25))])
    thinking = [e.text for e in events if isinstance(e, ThinkingDelta)]
    assert thinking == ["Look at ", "the file.", "\n\nThen answer."]
    done = done_of(events)
    assert done.blocks == (
        ThinkingBlock("Look at the file.\n\nThen answer."),
        TextBlock("Done."),
        ToolCall("call_1", "read_note", {"path": "a"}),
    )
    assert done.stop == "tool_use"


def test_raw_reasoning_text_is_thinking_too() -> None:
    wire = Wire().emit(
        "response.reasoning_text.delta", item_id="rs_1", output_index=0, content_index=0, delta="hm"
    )
    events, _ = collect([wire.message("ok").completed()])
    assert done_of(events).blocks == (ThinkingBlock("hm"), TextBlock("ok"))


def test_function_call_arguments_split_anywhere_are_taken_whole() -> None:
    pieces = ['{"pa', 'th": "caf\\u0', "0e9/\\ud83d", '\\ude00.txt", "n', '": [1, 2]}']
    events, _ = collect([Wire().call("call_Abc", "read_note", *pieces).completed(usage(50, 12))])
    done = done_of(events)
    assert done.blocks == (ToolCall("call_Abc", "read_note", {"path": "café/😀.txt", "n": [1, 2]}),)
    assert done.stop == "tool_use"


def test_parallel_function_calls_keep_their_order() -> None:
    wire = Wire().call("call_a", "read_note", '{"path": "a.txt"}')
    wire.call("call_b", "read_note", '{"path": ', '"b.txt"}')
    events, _ = collect([wire.completed()])
    assert done_of(events).blocks == (
        ToolCall("call_a", "read_note", {"path": "a.txt"}),
        ToolCall("call_b", "read_note", {"path": "b.txt"}),
    )


def test_empty_arguments_are_an_empty_object() -> None:
    events, _ = collect([Wire().call("c", "read_note").completed()])
    assert done_of(events).blocks == (ToolCall("c", "read_note", {}),)


def test_usage_with_cached_tokens() -> None:
    events, _ = collect([text_reply("ok", used=usage(1500, 30, cached=1408))])
    assert done_of(events).usage == Usage(input=92, output=30, cache_read=1408, cache_write=None)


def test_no_usage_is_all_none() -> None:
    events, _ = collect([Wire().message("ok").completed(None)])
    assert done_of(events).usage == Usage()


def test_a_terse_stream_with_the_output_only_in_the_final_response() -> None:
    wire = Wire()
    wire.output = [
        {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "All at once.", "annotations": []}],
        },
        {
            "id": "fc_1",
            "type": "function_call",
            "call_id": "call_1",
            "name": "read_note",
            "arguments": '{"path": "x"}',
            "status": "completed",
        },
    ]
    events, _ = collect([wire.completed()])
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["All at once."]
    assert done_of(events).blocks == (
        TextBlock("All at once."),
        ToolCall("call_1", "read_note", {"path": "x"}),
    )


# --------------------------------------------------------------------------- stops


def test_a_refusal_stops_the_turn_as_refusal() -> None:
    events, _ = collect([Wire().message("I can't ", "help with that.", refusal=True).completed()])
    done = done_of(events)
    assert done.stop == "refusal"
    assert done.blocks == (TextBlock("I can't help with that."),)


def test_max_output_tokens_is_a_max_tokens_stop() -> None:
    events, _ = collect([Wire().message("Once upon a").incomplete("max_output_tokens")])
    done = done_of(events)
    assert (done.stop, done.blocks) == ("max_tokens", (TextBlock("Once upon a"),))


def test_content_filter_is_a_content_filter_stop() -> None:
    events, _ = collect([Wire().message("Here").incomplete("content_filter", usage(5, 1))])
    done = done_of(events)
    assert (done.stop, done.usage) == ("content_filter", Usage(input=5, output=1, cache_read=0))


def test_an_unfinished_function_call_at_the_output_limit_is_truncated() -> None:
    wire = Wire().call("call_1", "read_note", '{"path": "very/lo', finish=False)
    err = failure([wire.incomplete("max_output_tokens")])
    assert (err.code, err.retryable) == ("truncated_tool_call", False)
    assert "cut off at its output limit" in err.message


def test_unparseable_arguments_at_the_output_limit_are_truncated() -> None:
    err = failure([Wire().call("call_1", "read_note", '{"path": ').incomplete("max_output_tokens")])
    assert (err.code, err.retryable) == ("truncated_tool_call", False)


def test_unparseable_arguments_in_a_completed_response_are_an_invalid_tool_call() -> None:
    err = failure([Wire().call("call_1", "read_note", '{"path": ').completed()])
    assert (err.code, err.retryable) == ("invalid_tool_call", False)


def test_an_unknown_incomplete_reason_is_an_invalid_stream() -> None:
    err = failure([Wire().message("x").incomplete("max_messages")])
    assert (err.code, err.retryable) == ("invalid_stream", True)


def test_a_stream_that_never_completes_is_incomplete() -> None:
    err = failure([Wire().message("Hello").stream()])
    assert (err.code, err.retryable) == ("incomplete_stream", True)


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("code", "message", "expected", "retryable"),
    [
        ("server_error", "The model failed to generate a response.", "api_5xx", True),
        ("rate_limit_exceeded", "Rate limit reached for gpt-test.", "rate_limit", True),
        ("invalid_prompt", "Invalid prompt.", "invalid_request", False),
        ("invalid_image", "The image could not be read.", "invalid_request", False),
        ("context_length_exceeded", "Your input is large.", "context_overflow", False),
        ("bio_policy", "Blocked.", "unknown", False),
    ],
)
def test_a_failed_response_maps_its_error_code(
    code: str, message: str, expected: str, retryable: bool
) -> None:
    err = failure([Wire().message("par").failed(code, message)])
    assert (err.code, err.retryable) == (expected, retryable)
    assert message in err.message


def test_an_error_event_maps_its_code() -> None:
    wire = Wire().emit("error", code="context_length_exceeded", message="Too long.", param="input")
    err = failure([wire.stream()])
    assert (err.code, err.retryable) == ("context_overflow", False)


def test_an_error_event_with_a_nested_error_object() -> None:
    nested = {"type": "server_error", "code": "server_error", "message": "Upstream failed."}
    wire = Wire().emit("error", error=nested)
    err = failure([wire.stream()])
    assert (err.code, err.retryable) == ("api_5xx", True)
    assert "Upstream failed." in err.message


@pytest.mark.parametrize(
    ("status", "message", "code", "retryable"),
    [
        (400, "Invalid type for 'input'.", "invalid_request", False),
        (
            400,
            "Your input exceeds the context window of this model.",
            "context_overflow",
            False,
        ),
        (401, "Incorrect API key provided.", "auth", False),
        (403, "You are not allowed to use this model.", "auth", False),
        (404, "The model `gpt-nope` does not exist.", "not_found", False),
        (408, "Request timed out.", "timeout", True),
        (409, "Conflict.", "conflict", True),
        (500, "The server had an error.", "api_5xx", True),
        (503, "Service unavailable.", "api_5xx", True),
        (529, "Overloaded.", "overloaded", True),
    ],
)
def test_error_statuses_map_to_provider_errors(
    status: int, message: str, code: str, retryable: bool
) -> None:
    err = failure([api_error(status, message)])
    assert (err.status, err.code, err.retryable) == (status, code, retryable)


def test_429_honours_retry_after() -> None:
    reply = Reply(
        429,
        {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}},
        headers={"retry-after": "3"},
    )
    err = failure([reply])
    assert (err.status, err.code, err.retryable, err.retry_after) == (429, "rate_limit", True, 3.0)


def test_a_dropped_connection_is_a_retryable_network_error() -> None:
    err = failure([Wire().message("Hel", "lo").stream(cut=True)])
    assert (err.code, err.retryable) == ("network", True)


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
                ThinkingBlock("private", signature="sig"),
                TextBlock("Let me look."),
                ToolCall("call_1", "read_note", {"path": "notes/été.txt", "z": 1, "a": 2}),
                ToolCall("call_2", "read_note", {}),
            )
        ),
        ToolResultMessage("call_1", "read_note", "a cat", False),
        ToolResultMessage("call_2", "read_note", "error: path is required", True),
        AssistantMessage((TextBlock("A cat."),)),
        UserMessage((TextBlock("thanks"),)),
    )


def test_the_request_body_is_the_documented_translation() -> None:
    request = ModelRequest(system="You are kiso.", messages=history(), tools=(TOOL,))
    _, requests = collect(
        [text_reply("ok")], request, max_output_tokens=4096, reasoning_effort="low"
    )
    (sent,) = requests
    assert (sent.method, sent.path) == ("POST", "/v1/responses")
    assert sent.headers["authorization"] == "Bearer sk-test"
    body = sent.json
    assert body["model"] == MODEL
    assert body["stream"] is True
    assert body["store"] is False
    assert body["instructions"] == "You are kiso."
    assert body["max_output_tokens"] == 4096
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert body["tools"] == [
        {
            "type": "function",
            "name": "read_note",
            "description": "Read a note from the workspace",
            "parameters": TOOL.parameters,
            "strict": False,
        }
    ]
    assert body["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is in these?"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,iVBORw0KGgo=",
                    "detail": "auto",
                },
                {
                    "type": "input_image",
                    "image_url": "https://example.com/cat.jpg",
                    "detail": "auto",
                },
            ],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "read_note",
            "arguments": '{"path": "notes/été.txt", "z": 1, "a": 2}',
        },
        {"type": "function_call", "call_id": "call_2", "name": "read_note", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a cat"},
        {"type": "function_call_output", "call_id": "call_2", "output": "error: path is required"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ]


def test_the_same_request_gives_byte_identical_bodies() -> None:
    request = ModelRequest(system="You are kiso.", messages=history(), tools=(TOOL,))

    async def twice(a: OpenAIResponsesAdapter) -> None:
        await drain(a, request)
        await drain(a, request)

    with SSEServer([text_reply("a"), text_reply("b")]) as server:
        asyncio.run(twice(adapter(server, max_output_tokens=100)))
    first, second = server.requests
    assert first.body == second.body


def test_a_minimal_request_sends_no_optional_fields() -> None:
    _, requests = collect([text_reply("ok")], ModelRequest(system=None, messages=HELLO.messages))
    body = requests[0].json
    for absent in ("instructions", "tools", "max_output_tokens", "reasoning"):
        assert absent not in body


def test_the_configured_key_is_sent_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", "Authorization: Bearer sk-ambient")
    _, requests = collect([text_reply("a")])
    assert requests[0].credential == "sk-test"


def test_provider_and_model() -> None:
    a = OpenAIResponsesAdapter(model=MODEL, api_key="sk-secret")
    assert (a.provider, a.model) == ("openai-responses", MODEL)
    assert "sk-secret" not in repr(a)


# --------------------------------------------------------------------------- end to end


def read_note_tool(root: Path) -> Any:
    def execute(args: dict[str, Any], ctx: ToolContext) -> str:
        path: str = args["path"]
        return (root / path).read_text(encoding="utf-8")

    return define_tool("read_note", TOOL.description, TOOL.parameters, execute, effects="read")


def scripted_model(request: Recorded) -> Stream:
    """A function call first; once its output is in the request, an answer."""
    outputs = [i for i in request.json["input"] if i.get("type") == "function_call_output"]
    if not outputs:
        wire = Wire().reasoning(["I should read it."])
        return wire.call("call_e2e", "read_note", '{"pa', 'th": "a.txt"}').completed(
            usage(120, 18, cached=0)
        )
    return Wire().message("The note says: ", outputs[0]["output"]).completed(usage(160, 9, 128))


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
    assert "thinking_delta" in [e.type for e in seen]
    assistants = [e for e in log if isinstance(e, Assistant)]
    assert [a.stop for a in assistants] == ["tool_use", "end_turn"]
    assert assistants[0].calls == (ToolCall("call_e2e", "read_note", {"path": "a.txt"}),)
    assert assistants[0].usage == Usage(input=120, output=18, cache_read=0)
    assert assistants[1].text == "The note says: hello from a"
    assert assistants[1].usage == Usage(input=32, output=9, cache_read=128)
    second = server.requests[1].json["input"]
    assert second[-2:] == [
        {
            "type": "function_call",
            "call_id": "call_e2e",
            "name": "read_note",
            "arguments": '{"path": "a.txt"}',
        },
        {"type": "function_call_output", "call_id": "call_e2e", "output": "hello from a"},
    ]


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
    assert len(server.requests) == 2
