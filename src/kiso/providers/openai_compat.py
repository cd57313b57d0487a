"""Chat Completions (``POST /chat/completions``): OpenAI, DeepSeek, z.ai, any compatible gateway.

Guarantees, beyond the adapter contract (:mod:`kiso.providers.base`):

The request. The same :class:`ModelRequest` always yields the same body, byte for byte (fixed key
order, ``json.dumps(..., ensure_ascii=False)`` tool arguments), so prompt caches keep hitting:

=========================  =================================================================
kiso                       chat completions
=========================  =================================================================
system                     ``{"role": "system", "content": system}`` first
user (text only)           ``{"role": "user", "content": "<texts joined by blank lines>"}``
user (with images)         ``content: [{"type": "text"}, {"type": "image_url", image_url:
                           {"url": <url or data: URL>}}]``
assistant                  ``content`` (its text, or None when it only calls tools),
                           ``reasoning_content`` (see below), ``tool_calls: [{id, type:
                           function, function: {name, arguments: <JSON text>}}]``
tool result                ``{"role": "tool", "tool_call_id", "content"}``
tools                      ``[{"type": "function", "function": {name, description,
                           parameters}}]``
max_output_tokens          ``max_completion_tokens`` to api.openai.com (or no base_url),
                           ``max_tokens`` to any other gateway
reasoning_effort           ``reasoning_effort``
=========================  =================================================================

Reasoning echo: thinking is replayed as ``reasoning_content`` (what DeepSeek and z.ai read back).
Once any assistant message in the history carries reasoning, every assistant message carries the
field (its own reasoning, or ``""``, so a thinking-mode server never finds it missing). The switch
is monotone: the history only grows, so it flips at most once, when the first reasoning arrives
(usually with the first turn, when there is no older history to re-render), and from then on
every message renders the same in every request and the cached prefix keeps hitting.

The stream (``stream=True, stream_options={"include_usage": True}``): ``content`` deltas are
:class:`TextDelta`, ``reasoning_content`` deltas (``reasoning`` where a gateway names it so) are
:class:`ThinkingDelta`; tool calls are assembled by ``index`` from fragments split anywhere; the
one :class:`TurnDone` holds thinking, text, then the tool calls, and the model the stream named.

==================================  =============================================================
finish_reason                       stop (or error)
==================================  =============================================================
stop                                end_turn (tool_use if the turn made tool calls)
tool_calls, function_call           tool_use
length                              max_tokens
content_filter                      content_filter
any ``refusal`` text in the turn    refusal (whatever the finish_reason)
anything else                       ProviderError invalid_stream (retryable)
none before the stream ended        ProviderError incomplete_stream (retryable)
unparseable tool arguments          ProviderError truncated_tool_call if finish_reason is length,
                                    else invalid_tool_call (neither retryable)
==================================  =============================================================

Usage is the provider's own count, never a guess: ``input`` = prompt_tokens minus the cached
tokens, ``cache_read`` = ``prompt_tokens_details.cached_tokens`` (DeepSeek:
``prompt_cache_hit_tokens``; None when neither is reported), ``output`` = completion_tokens,
``cache_write`` None. A stream with no usage chunk gives all None.

Errors: every SDK exception (HTTP statuses, dropped connections, ``{"error": ...}`` inside the
stream) is mapped by :mod:`kiso.providers.errors` (see :mod:`kiso.providers._openai_common`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kiso.kernel import (
    AssistantMessage,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
)
from kiso.kernel.events import AssistantBlock
from kiso.providers._closing import finish_closing, released, sdk_items
from kiso.providers._openai_common import (
    OpenAIBase,
    dumps_arguments,
    image_url,
    map_exception,
    output_cap,
    parse_arguments,
)
from kiso.providers.base import (
    ModelRequest,
    ProviderError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolSpec,
    TurnDone,
)

__all__ = ["OpenAICompatAdapter", "chat_messages", "chat_usage"]

_STOPS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "content_filter",
}


class OpenAICompatAdapter(OpenAIBase):
    """An adapter for any Chat Completions endpoint, through the official ``openai`` SDK."""

    DEFAULT_PROVIDER = "openai-compat"

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments for ``chat.completions.create`` (the request body)."""
        params: dict[str, Any] = {
            "model": self.model,
            "messages": chat_messages(request.system, request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            params["tools"] = _tools(request.tools)
        cap = output_cap(self.max_output_tokens, request.max_output)
        if cap is not None:
            params[self._max_tokens_field()] = cap
        if self.reasoning_effort is not None:
            params["reasoning_effort"] = self.reasoning_effort
        return params

    def _max_tokens_field(self) -> str:
        host = (urlsplit(self.base_url).hostname or "") if self.base_url else "api.openai.com"
        official = host == "openai.com" or host.endswith(".openai.com")
        return "max_completion_tokens" if official else "max_tokens"

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        params = self.request_params(request)
        turn = _Turn()
        try:
            async with self.client() as client:
                chunks = sdk_items(lambda: client.chat.completions.create(**params))
                async with aclosing(chunks):
                    async for chunk in chunks:
                        for event in turn.feed(chunk):
                            yield event
        except ProviderError:
            raise
        except Exception as exc:
            raise map_exception(released(exc), self.provider) from exc
        finally:
            await finish_closing()  # what the SDK left suspended, closed on this loop now
        yield turn.done(self.provider, self.model)


# --------------------------------------------------------------------------- the request


def chat_messages(system: str | None, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """kiso's messages as chat-completions messages (see the module's table)."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    echo_reasoning = any(
        isinstance(m, AssistantMessage)
        and any(isinstance(b, ThinkingBlock) and b.text for b in m.blocks)
        for m in messages
    )
    for message in messages:
        if isinstance(message, ToolResultMessage):
            out.append(
                {"role": "tool", "tool_call_id": message.call_id, "content": message.content}
            )
        elif isinstance(message, AssistantMessage):
            text = "".join(b.text for b in message.blocks if isinstance(b, TextBlock))
            thinking = "".join(b.text for b in message.blocks if isinstance(b, ThinkingBlock))
            calls = [b for b in message.blocks if isinstance(b, ToolCall)]
            content = text or (None if calls else "")
            entry: dict[str, Any] = {"role": "assistant", "content": content}
            if echo_reasoning:
                entry["reasoning_content"] = thinking
            if calls:
                entry["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": dumps_arguments(c.input)},
                    }
                    for c in calls
                ]
            out.append(entry)
        else:
            blocks = message.content
            if all(isinstance(b, TextBlock) for b in blocks):
                texts = [b.text for b in blocks if isinstance(b, TextBlock)]
                out.append({"role": "user", "content": "\n\n".join(texts)})
            else:
                out.append({"role": "user", "content": [_user_part(b) for b in blocks]})
    return out


def _user_part(block: TextBlock | ImageBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    return {"type": "image_url", "image_url": {"url": image_url(block)}}


def _tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
            },
        }
        for t in tools
    ]


# --------------------------------------------------------------------------- the stream


def chat_usage(usage: Any) -> Usage:
    """The provider's counts (a ``CompletionUsage``) as kiso's :class:`Usage`."""
    prompt = _count(getattr(usage, "prompt_tokens", None))
    output = _count(getattr(usage, "completion_tokens", None))
    details = getattr(usage, "prompt_tokens_details", None)
    cached = _count(getattr(details, "cached_tokens", None))
    if cached is None:
        cached = _count(getattr(usage, "prompt_cache_hit_tokens", None))  # DeepSeek
    uncached = prompt if prompt is None or cached is None else max(prompt - cached, 0)
    return Usage(input=uncached, output=output, cache_read=cached, cache_write=None)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass
class _Call:
    order: int
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Turn:
    """What one stream has said so far."""

    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish: str | None = None
    usage: Usage | None = None
    model: str | None = None

    def feed(self, chunk: Any) -> Iterator[StreamEvent]:
        if self.model is None and isinstance(getattr(chunk, "model", None), str) and chunk.model:
            self.model = chunk.model
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = chat_usage(usage)
        for choice in getattr(chunk, "choices", None) or ():
            if getattr(choice, "index", 0) not in (0, None):
                continue  # n=1: only the first choice is ours
            delta = getattr(choice, "delta", None)
            if delta is not None:
                yield from self._delta(delta)
            if getattr(choice, "finish_reason", None):
                self.finish = str(choice.finish_reason)

    def _delta(self, delta: Any) -> Iterator[StreamEvent]:
        reasoning = getattr(delta, "reasoning_content", None)
        if not isinstance(reasoning, str):
            reasoning = getattr(delta, "reasoning", None)
        if isinstance(reasoning, str) and reasoning:
            self.thinking.append(reasoning)
            yield ThinkingDelta(reasoning)
        content = getattr(delta, "content", None)
        if isinstance(content, str) and content:
            self.text.append(content)
            yield TextDelta(content)
        refusal = getattr(delta, "refusal", None)
        if isinstance(refusal, str) and refusal:
            self.refusal.append(refusal)
            yield TextDelta(refusal)
        for fragment in getattr(delta, "tool_calls", None) or ():
            self._fragment(fragment)

    def _fragment(self, fragment: Any) -> None:
        index = getattr(fragment, "index", None)
        call_id = getattr(fragment, "id", None)
        if not isinstance(index, int):
            # No index (a few gateways): a new id starts a new call, else it continues the last.
            last = max(self.calls, default=-1)
            fresh = last < 0 or (call_id and self.calls[last].call_id not in ("", call_id))
            index = last + 1 if fresh else last
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = _Call(order=len(self.calls))
        if isinstance(call_id, str) and call_id and not call.call_id:
            call.call_id = call_id
        function = getattr(fragment, "function", None)
        name = getattr(function, "name", None)
        if isinstance(name, str) and name and not call.name:
            call.name = name
        arguments = getattr(function, "arguments", None)
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif isinstance(arguments, dict):
            call.arguments.append(dumps_arguments(arguments))

    def done(self, provider: str, model: str) -> TurnDone:
        """The turn, once the stream has ended; a ProviderError if it is not a whole turn."""
        if self.finish is None:
            raise ProviderError(
                f"{provider}: the stream ended before the model finished (no finish_reason)",
                code="incomplete_stream",
                retryable=True,
            )
        calls: list[AssistantBlock] = []
        for index, call in sorted(self.calls.items()):
            raw = "".join(call.arguments)
            parsed = parse_arguments(raw)
            if parsed is None or not call.name:
                if self.finish == "length":
                    raise ProviderError(
                        f"{provider}: the model's tool call was cut off at its output limit "
                        f"({call.name or 'unnamed'}, {len(raw)} characters of arguments)",
                        code="truncated_tool_call",
                        retryable=False,
                    )
                what = "arguments are not a JSON object" if call.name else "call has no name"
                raise ProviderError(
                    f"{provider}: the model's tool call {call.name or index!r}: its {what}: "
                    f"{raw[:200]!r}",
                    code="invalid_tool_call",
                    retryable=False,
                )
            calls.append(ToolCall(call.call_id or f"call_{index}", call.name, parsed))
        if self.refusal:
            stop = "refusal"
        elif self.finish == "stop" and calls:
            stop = "tool_use"  # gateways that say "stop" after tool calls
        elif self.finish in _STOPS:
            stop = _STOPS[self.finish]
        else:
            raise ProviderError(
                f"{provider}: the model stopped with an unknown finish_reason {self.finish!r}",
                code="invalid_stream",
                retryable=True,
            )
        blocks: list[AssistantBlock] = []
        if self.thinking:
            blocks.append(ThinkingBlock("".join(self.thinking)))
        if self.text or self.refusal:
            blocks.append(TextBlock("".join(self.text) + "".join(self.refusal)))
        blocks.extend(calls)
        return TurnDone(tuple(blocks), stop, self.usage or Usage(), self.model or model)
