"""The OpenAI Responses API (``POST /responses``), stateless (``store=False``).

Guarantees, beyond the adapter contract (:mod:`kiso.providers.base`):

The request. The same :class:`ModelRequest` always yields the same body, byte for byte:

=====================  ==========================================================================
kiso                   responses
=====================  ==========================================================================
system                 ``instructions``
user                   ``{"role": "user", "content": [{"type": "input_text", "text"},
                       {"type": "input_image", "image_url": <url or data: URL>, "detail":
                       "auto"}]}``
assistant text         ``{"role": "assistant", "content": [{"type": "output_text", "text"}]}``
assistant tool call    ``{"type": "function_call", "call_id", "name", "arguments": <JSON text>}``
assistant thinking     not replayed (the reasoning items of a stateless request are not ours)
tool result            ``{"type": "function_call_output", "call_id", "output"}``
tools                  ``[{"type": "function", "name", "description", "parameters", "strict":
                       false}]`` (the Responses API would otherwise enforce strict schemas)
max_output_tokens      ``max_output_tokens``
reasoning_effort       ``reasoning: {"effort": ..., "summary": "auto"}``
=====================  ==========================================================================

The stream. ``response.output_text.delta`` is :class:`TextDelta`;
``response.reasoning_summary_text.delta`` and ``response.reasoning_text.delta`` are
:class:`ThinkingDelta` (separate parts joined by a blank line); each function call is taken,
whole, from its ``response.output_item.done``. The one :class:`TurnDone` holds thinking, text,
then the calls, and the model the response named.

=============================================  ==================================================
the response ends with                         stop (or error)
=============================================  ==================================================
response.completed, function calls made        tool_use
response.completed, none                       end_turn
a refusal content part, anywhere               refusal
response.incomplete, max_output_tokens         max_tokens; truncated_tool_call (not retryable)
                                               if a function call was unfinished or unparseable
response.incomplete, content_filter            content_filter
response.incomplete, any other reason          ProviderError invalid_stream (retryable)
response.failed, ``error`` event               ProviderError by the error's code (table in
                                               :mod:`kiso.providers._openai_common`):
                                               rate_limit_exceeded retryable,
                                               context_length_exceeded context_overflow,
                                               server_error retryable, ...
neither completed nor incomplete               ProviderError incomplete_stream (retryable)
unparseable arguments in a completed response  ProviderError invalid_tool_call (not retryable)
=============================================  ==================================================

Usage is the provider's own count: ``input`` = input_tokens minus
``input_tokens_details.cached_tokens``, ``cache_read`` = those cached tokens (None if not
reported), ``output`` = output_tokens, ``cache_write`` None. No usage: all None.

The endpoint is the SDK's: ``POST {base_url}/responses`` (the ChatGPT backend profile
``https://chatgpt.com/backend-api`` posts to ``https://chatgpt.com/backend-api/responses``).
With a ``bearer`` source (a sign-in, :class:`kiso.runtime.oauth.ChatGPTBearer`) each stream
first calls it, off the event loop, for the access token (renewed there when it is about to
expire) and the headers that go with it (``chatgpt-account-id``); the token goes out as
``Authorization: Bearer <token>``. A bearer source that fails raises its ProviderError before
any request is made.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

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
    error_from_code,
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

__all__ = ["BearerSource", "OpenAIResponsesAdapter", "response_input", "response_usage"]

BearerSource = Callable[[], tuple[str, Mapping[str, str]]]
"""Called before each request: the bearer token to send, and headers that go with it."""

_THINKING_EVENTS = frozenset(
    {"response.reasoning_summary_text.delta", "response.reasoning_text.delta"}
)


class OpenAIResponsesAdapter(OpenAIBase):
    """An adapter for the OpenAI Responses API, through the official ``openai`` SDK."""

    DEFAULT_PROVIDER = "openai-responses"

    def __init__(self, *, bearer: BearerSource | None = None, **settings: Any) -> None:
        super().__init__(**settings)
        self._bearer = bearer

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Any]:
        """The base's client; with a bearer source, carrying the token it returns now."""
        if self._bearer is not None:
            token, headers = await asyncio.to_thread(self._bearer)
            self._api_key = token
            self._headers = {
                **{k: v for k, v in self._headers.items() if k.lower() != "authorization"},
                **headers,
                "Authorization": f"Bearer {token}",
            }
        async with super().client() as client:
            yield client

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments for ``responses.create`` (the request body)."""
        params: dict[str, Any] = {
            "model": self.model,
            "input": response_input(request.messages),
            "stream": True,
            "store": False,
        }
        if request.system:
            params["instructions"] = request.system
        if request.tools:
            params["tools"] = _tools(request.tools)
        cap = output_cap(self.max_output_tokens, request.max_output)
        if cap is not None:
            params["max_output_tokens"] = cap
        if self.reasoning_effort is not None:
            params["reasoning"] = {"effort": self.reasoning_effort, "summary": "auto"}
        return params

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        params = self.request_params(request)
        turn = _Turn(self.provider)
        try:
            async with self.client() as client:
                events = sdk_items(lambda: client.responses.create(**params))
                async with aclosing(events):
                    async for event in events:
                        for item in turn.feed(event):
                            yield item
                        if turn.ended:
                            break
        except ProviderError:
            raise
        except Exception as exc:
            raise map_exception(released(exc), self.provider) from exc
        finally:
            await finish_closing()  # what the SDK left suspended, closed on this loop now
        yield turn.done(self.model)


# --------------------------------------------------------------------------- the request


def response_input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """kiso's messages as Responses input items (see the module's table)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ToolResultMessage):
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.call_id,
                    "output": message.content,
                }
            )
        elif isinstance(message, AssistantMessage):
            texts: list[dict[str, Any]] = []
            for block in message.blocks:
                if isinstance(block, TextBlock):
                    texts.append({"type": "output_text", "text": block.text})
                    continue
                if isinstance(block, ThinkingBlock):
                    continue
                if texts:
                    items.append({"role": "assistant", "content": texts})
                    texts = []
                items.append(
                    {
                        "type": "function_call",
                        "call_id": block.call_id,
                        "name": block.name,
                        "arguments": dumps_arguments(block.input),
                    }
                )
            if texts:
                items.append({"role": "assistant", "content": texts})
        else:
            items.append({"role": "user", "content": [_user_part(b) for b in message.content]})
    return items


def _user_part(block: TextBlock | ImageBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"type": "input_text", "text": block.text}
    return {"type": "input_image", "image_url": image_url(block), "detail": "auto"}


def _tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": False,
        }
        for t in tools
    ]


# --------------------------------------------------------------------------- the stream


def response_usage(usage: Any) -> Usage:
    """The provider's counts (a ``ResponseUsage``) as kiso's :class:`Usage`."""
    if usage is None:
        return Usage()
    prompt = _count(getattr(usage, "input_tokens", None))
    details = getattr(usage, "input_tokens_details", None)
    cached = _count(getattr(details, "cached_tokens", None))
    uncached = prompt if prompt is None or cached is None else max(prompt - cached, 0)
    output = _count(getattr(usage, "output_tokens", None))
    return Usage(input=uncached, output=output, cache_read=cached, cache_write=None)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass
class _Turn:
    """What one response stream has said so far."""

    provider: str
    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    thinking_part: tuple[Any, ...] | None = None
    streamed_items: set[str] = field(default_factory=set)
    """Message items whose text arrived as deltas (their ``done`` item is not text again)."""
    refusal: bool = False
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    open_calls: set[str] = field(default_factory=set)
    items_done: int = 0
    status: str | None = None
    reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    model: str | None = None

    @property
    def ended(self) -> bool:
        return self.status is not None

    def feed(self, event: Any) -> Iterator[StreamEvent]:
        kind = getattr(event, "type", None)
        if kind == "response.output_text.delta":
            yield from self._text(getattr(event, "delta", None), getattr(event, "item_id", None))
        elif kind in _THINKING_EVENTS:
            delta = getattr(event, "delta", None)
            if isinstance(delta, str) and delta:
                part = (
                    getattr(event, "item_id", None),
                    getattr(event, "summary_index", None),
                    getattr(event, "content_index", None),
                )
                if self.thinking and part != self.thinking_part:
                    delta = "\n\n" + delta
                self.thinking_part = part
                self.thinking.append(delta)
                yield ThinkingDelta(delta)
        elif kind == "response.refusal.delta":
            self.refusal = True
            yield from self._text(getattr(event, "delta", None), getattr(event, "item_id", None))
        elif kind == "response.refusal.done":
            self.refusal = True
        elif kind == "response.output_item.added":
            item = getattr(event, "item", None)
            if getattr(item, "type", None) == "function_call":
                self.open_calls.add(_item_key(item))
        elif kind == "response.output_item.done":
            self.items_done += 1
            yield from self._item(getattr(event, "item", None))
        elif kind in ("response.created", "response.in_progress"):
            self._response(getattr(event, "response", None))
        elif kind in ("response.completed", "response.incomplete"):
            response = getattr(event, "response", None)
            self._response(response)
            if self.items_done == 0:  # a terse gateway: the output only in the final response
                for item in getattr(response, "output", None) or ():
                    yield from self._item(item)
            self.usage = response_usage(getattr(response, "usage", None))
            details = getattr(response, "incomplete_details", None)
            self.reason = getattr(details, "reason", None)
            self.status = "completed" if kind == "response.completed" else "incomplete"
        elif kind == "response.failed":
            error = getattr(getattr(event, "response", None), "error", None)
            raise error_from_code(
                (getattr(error, "code", None), getattr(error, "type", None)),
                str(getattr(error, "message", None) or "the response failed"),
                self.provider,
            )
        elif kind == "error":
            raise error_from_code(
                (getattr(event, "code", None),),
                str(getattr(event, "message", None) or "the provider reported an error"),
                self.provider,
            )

    def _text(self, delta: Any, item_id: Any) -> Iterator[StreamEvent]:
        if isinstance(delta, str) and delta:
            if isinstance(item_id, str):
                self.streamed_items.add(item_id)
            self.text.append(delta)
            yield TextDelta(delta)

    def _response(self, response: Any) -> None:
        model = getattr(response, "model", None)
        if isinstance(model, str) and model:
            self.model = model

    def _item(self, item: Any) -> Iterator[StreamEvent]:
        kind = getattr(item, "type", None)
        if kind == "function_call":
            self.open_calls.discard(_item_key(item))
            self.calls.append(
                (
                    str(getattr(item, "call_id", None) or ""),
                    str(getattr(item, "name", None) or ""),
                    getattr(item, "arguments", None) or "",
                )
            )
        elif kind == "message":
            streamed = getattr(item, "id", None) in self.streamed_items
            for part in getattr(item, "content", None) or ():
                part_type = getattr(part, "type", None)
                if part_type == "refusal":
                    self.refusal = True
                    if not streamed:
                        yield from self._text(getattr(part, "refusal", None), None)
                elif part_type == "output_text" and not streamed:
                    yield from self._text(getattr(part, "text", None), None)

    def done(self, model: str) -> TurnDone:
        """The turn, once the stream has ended; a ProviderError if it is not a whole turn."""
        provider = self.provider
        if self.status is None:
            raise ProviderError(
                f"{provider}: the stream ended before the response completed",
                code="incomplete_stream",
                retryable=True,
            )
        cut_off = self.status == "incomplete" and self.reason == "max_output_tokens"
        if cut_off and self.open_calls:
            raise ProviderError(
                f"{provider}: the model's tool call was cut off at its output limit",
                code="truncated_tool_call",
                retryable=False,
            )
        calls: list[AssistantBlock] = []
        for i, (call_id, name, raw) in enumerate(self.calls):
            parsed = parse_arguments(raw)
            if parsed is None or not name:
                if cut_off:
                    raise ProviderError(
                        f"{provider}: the model's tool call was cut off at its output limit "
                        f"({name or 'unnamed'}, {len(raw)} characters of arguments)",
                        code="truncated_tool_call",
                        retryable=False,
                    )
                what = "arguments are not a JSON object" if name else "call has no name"
                raise ProviderError(
                    f"{provider}: the model's tool call {name or i!r}: its {what}: {raw[:200]!r}",
                    code="invalid_tool_call",
                    retryable=False,
                )
            calls.append(ToolCall(call_id or f"call_{i}", name, parsed))
        if self.refusal:
            stop = "refusal"
        elif self.status == "completed":
            stop = "tool_use" if calls else "end_turn"
        elif cut_off:
            stop = "max_tokens"
        elif self.reason == "content_filter":
            stop = "content_filter"
        else:
            raise ProviderError(
                f"{provider}: the response is incomplete ({self.reason or 'no reason given'})",
                code="invalid_stream",
                retryable=True,
            )
        blocks: list[AssistantBlock] = []
        if self.thinking:
            blocks.append(ThinkingBlock("".join(self.thinking)))
        if self.text:
            blocks.append(TextBlock("".join(self.text)))
        blocks.extend(calls)
        return TurnDone(tuple(blocks), stop, self.usage, self.model or model)


def _item_key(item: Any) -> str:
    return str(getattr(item, "id", None) or getattr(item, "call_id", None) or "")
