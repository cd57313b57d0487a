"""The Anthropic Messages API adapter, on the official ``anthropic`` SDK (imported lazily).

One request is one ``POST /v1/messages`` with ``stream=true``; the SDK's own retries are off
(``max_retries=0``) because the runtime retries retryable :class:`ProviderError` itself. The
request translation lives in :mod:`kiso.providers._anthropic_wire`.

Stream events, as Anthropic documents them::

    message_start         the model id, input and cache usage
    content_block_start   text | thinking | tool_use (id, name)
    content_block_delta   text_delta -> TextDelta; thinking_delta -> ThinkingDelta;
                          signature_delta -> the thinking block's signature;
                          input_json_delta -> the tool input's JSON, parsed at the block's stop
    content_block_stop    (an empty tool input is {})
    message_delta         stop_reason, cumulative usage
    message_stop          the end: exactly one TurnDone follows
    ping                  ignored
    error                 a ProviderError (mapped by its error type, below)

Stop reasons:

==============================  ===============================================
stop_reason                     result
==============================  ===============================================
end_turn, tool_use, max_tokens  the same stop in ``TurnDone`` (the runtime decides: refusal
stop_sequence, refusal,         ends the run with an error outcome, pause_turn calls again)
pause_turn
model_context_window_exceeded   ProviderError ``context_overflow``, not retryable
anything else                   ProviderError ``invalid_stream``, not retryable
none, or no message_stop        ProviderError ``incomplete_stream``, retryable
==============================  ===============================================

A tool input that is not a JSON object: ``truncated_tool_call`` (not retryable) when the stop is
``max_tokens``, else ``invalid_tool_call`` (retryable). A delta for a block that never started
is ``invalid_stream``, retryable.

Usage (counts the API did not report stay ``None``, never a made-up zero):

=============  =============================================================
Usage field    from
=============  =============================================================
input          ``input_tokens`` (message_start; a later message_delta wins)
output         ``output_tokens`` (message_delta, cumulative)
cache_read     ``cache_read_input_tokens``
cache_write    ``cache_creation_input_tokens``
=============  =============================================================

Errors: every SDK exception goes through :func:`kiso.providers.errors.from_sdk_error` (400 ->
invalid_request, or context_overflow for "prompt is too long"; 401/403 auth; 404 not_found; 408
timeout; 409 conflict; 429 rate_limit with ``retry-after`` honoured; 5xx api_5xx; 529
overloaded). An ``error`` event inside a 200 stream is mapped by its type:

=====================  ======  ====================
error event type       as      code
=====================  ======  ====================
invalid_request_error  400     invalid_request / context_overflow
authentication_error   401     auth
billing_error          402     unknown (not retryable)
permission_error       403     auth
not_found_error        404     not_found
request_too_large      413     invalid_request
rate_limit_error       429     rate_limit
api_error (or other)   500     api_5xx
timeout_error          504     api_5xx
overloaded_error       529     overloaded
=====================  ======  ====================

A connection that breaks mid-body is ``network``, retryable; a read timeout is ``timeout``.

Thinking blocks come back with their signature exactly as streamed, and are replayed exactly in
the next request. ``redacted_thinking`` and server-tool blocks have no kiso block to live in and
are left out of the turn.

Clients: the runtime's synchronous entry points run each run on a fresh event loop, and pooled
connections cannot cross loops, so unless ``http_client`` is given the adapter opens one SDK
client per request and closes it at the end of the stream. A host passing ``http_client`` owns
it: one SDK client wraps it for the adapter's life, on the host's loop, and it is never closed
here.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kiso.kernel import TextBlock, ThinkingBlock, ToolCall, Usage, UsageError
from kiso.kernel.events import AssistantBlock
from kiso.providers import errors
from kiso.providers._anthropic_wire import build_params
from kiso.providers._closing import finish_closing, released, sdk_items
from kiso.providers.base import (
    ModelRequest,
    ProviderError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    TurnDone,
)

if TYPE_CHECKING:
    import httpx2

__all__ = ["ERROR_EVENT_STATUS", "STOPS", "AnthropicAdapter"]

STOPS = frozenset({"end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "pause_turn"})
"""Stop reasons passed through unchanged."""

ERROR_EVENT_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
"""The HTTP status an ``error`` event inside a 200 stream stands for (unknown types: 500)."""


class AnthropicAdapter:
    """Streams turns from the Anthropic Messages API (or a compatible endpoint)."""

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None,
        base_url: str | None = None,
        provider: str = "anthropic",
        max_output_tokens: int = 8192,
        prompt_caching: bool = False,
        thinking_budget: int | None = None,
        http_client: httpx2.AsyncClient | None = None,
        timeout: float = 600.0,
        default_headers: dict[str, str] | None = None,
    ) -> None:
        if max_output_tokens < 1:
            raise UsageError(f"max_output_tokens must be positive, not {max_output_tokens}")
        if thinking_budget is not None and thinking_budget < 1:
            raise UsageError(f"thinking_budget must be positive, not {thinking_budget}")
        self.provider = provider
        self.model = model
        self.base_url = base_url
        self.max_output_tokens = max_output_tokens
        self.prompt_caching = prompt_caching
        self.thinking_budget = thinking_budget
        self.timeout = timeout
        self._api_key = api_key
        self._http_client = http_client
        self._default_headers = dict(default_headers) if default_headers else None
        self._shared: Any = None
        """The SDK client around a host's ``http_client``, made on first use."""

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The ``messages.create`` arguments for ``request`` (without ``stream``)."""
        return build_params(
            request,
            model=self.model,
            max_output_tokens=min(
                self.max_output_tokens, request.max_output or self.max_output_tokens
            ),
            prompt_caching=self.prompt_caching,
            thinking_budget=self.thinking_budget,
        )

    def _client(self) -> Any:
        import anthropic  # lazily: the import takes a second or two

        client = anthropic.AsyncAnthropic(
            api_key=self._api_key or "no-key",  # never the environment's key behind our back
            base_url=self.base_url,
            max_retries=0,  # the runtime retries
            timeout=self.timeout,
            http_client=self._http_client,
            default_headers=self._default_headers,
        )
        return client

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        params = self.params(request)
        owned = self._http_client is None
        if owned:
            client = self._client()
        else:
            if self._shared is None:
                self._shared = self._client()
            client = self._shared
        turn = _Turn(self.model, self.provider)
        try:
            events = sdk_items(lambda: client.messages.create(stream=True, **params))
            async with aclosing(events):
                async for event in events:
                    out = turn.feed(event)
                    if out is not None:
                        yield out
                    if turn.ended:
                        break
        except ProviderError:
            raise
        except Exception as exc:
            raise _map_error(released(exc), self.provider) from exc
        finally:
            try:
                if owned:
                    await client.close()
            finally:
                await finish_closing()  # what the SDK left suspended, closed on this loop now
        yield turn.finish()


def _map_error(exc: Exception, provider: str) -> ProviderError:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status < 400:
        # an `error` event inside a 200 stream: the SDK raises it with the stream's status
        kind, message = _error_parts(getattr(exc, "body", None))
        return errors.from_status(
            ERROR_EVENT_STATUS.get(kind, 500),
            f"{message} (an {kind or 'error'} event in the stream)",
            provider=provider,
        )
    if status is None:
        import httpx2

        if isinstance(exc, httpx2.TransportError) and not isinstance(exc, httpx2.TimeoutException):
            return errors.from_status(
                None, f"the connection broke: {type(exc).__name__}: {exc}", provider=provider
            )
    return errors.from_sdk_error(exc, provider)


def _error_parts(body: Any) -> tuple[str, str]:
    error = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "", str(body) if body else "an error event without a body"
    kind = error.get("type")
    message = error.get("message")
    return (
        kind if isinstance(kind, str) else "",
        message if isinstance(message, str) and message else "an error event without a message",
    )


@dataclass
class _Block:
    kind: str
    text: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    json: list[str] = field(default_factory=list)
    start_input: dict[str, Any] | None = None
    input: dict[str, Any] | None = None
    problem: str | None = None
    """Why the tool input is not a JSON object, once the block stopped."""
    stopped: bool = False

    def close(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self.kind != "tool_use":
            return
        raw = "".join(self.json)
        if not raw.strip():
            self.input = dict(self.start_input or {})
            return
        try:
            value = json.loads(raw)
        except ValueError as exc:
            self.problem = f"its input is not valid JSON ({exc}): {raw[:200]!r}"
            return
        if not isinstance(value, dict):
            self.problem = f"its input is not a JSON object: {raw[:200]!r}"
            return
        self.input = value


class _Turn:
    """The state of one streamed message: blocks by index, the stop, the usage."""

    def __init__(self, model: str, provider: str) -> None:
        self.model = model
        self.provider = provider
        self.blocks: dict[int, _Block] = {}
        self.stop: str | None = None
        self.ended = False
        self.usage: dict[str, int | None] = dict.fromkeys(_USAGE_FIELDS)

    def feed(self, event: Any) -> StreamEvent | None:
        kind = getattr(event, "type", None)
        if kind == "content_block_delta":
            return self._delta(event)
        if kind == "content_block_start":
            return self._start(event)
        if kind == "content_block_stop":
            block = self.blocks.get(event.index)
            if block is not None:
                block.close()
        elif kind == "message_start":
            message = event.message
            self.model = getattr(message, "model", None) or self.model
            self._usage(getattr(message, "usage", None))
        elif kind == "message_delta":
            stop = getattr(event.delta, "stop_reason", None)
            if stop is not None:
                self.stop = stop
            self._usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.ended = True
        return None  # ping and unknown events are ignored

    def _start(self, event: Any) -> StreamEvent | None:
        block = event.content_block
        kind = getattr(block, "type", "")
        new = self.blocks[event.index] = _Block(kind)
        if kind == "text" and getattr(block, "text", ""):
            new.text.append(block.text)
            return TextDelta(block.text)
        if kind == "thinking":
            if getattr(block, "signature", ""):
                new.signature.append(block.signature)
            if getattr(block, "thinking", ""):
                new.text.append(block.thinking)
                return ThinkingDelta(block.thinking)
        elif kind == "tool_use":
            new.call_id, new.name = block.id, block.name
            start = getattr(block, "input", None)
            new.start_input = start if isinstance(start, dict) else None
        return None

    def _delta(self, event: Any) -> StreamEvent | None:
        block = self.blocks.get(event.index)
        if block is None:
            raise ProviderError(
                f"{self.provider}: the stream sent a delta for content block {event.index}, "
                f"which never started",
                code="invalid_stream",
                retryable=True,
            )
        delta = event.delta
        kind = getattr(delta, "type", None)
        if kind == "text_delta":
            block.text.append(delta.text)
            return TextDelta(delta.text) if delta.text else None
        if kind == "thinking_delta":
            block.text.append(delta.thinking)
            return ThinkingDelta(delta.thinking) if delta.thinking else None
        if kind == "signature_delta":
            block.signature.append(delta.signature)
        elif kind == "input_json_delta":
            block.json.append(delta.partial_json)
        return None  # citations and unknown deltas carry nothing kiso keeps

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        for ours, theirs in _USAGE_FIELDS.items():
            value = getattr(usage, theirs, None)
            if isinstance(value, int):
                self.usage[ours] = value

    def finish(self) -> TurnDone:
        """The whole turn, or the ProviderError saying why the stream cannot be committed."""
        prefix = f"{self.provider}: "
        if not self.ended or self.stop is None:
            missing = "message_stop" if not self.ended else "a stop reason"
            raise ProviderError(
                f"{prefix}the stream ended without {missing}; the turn was not committed",
                code="incomplete_stream",
                retryable=True,
            )
        if self.stop == "model_context_window_exceeded":
            raise ProviderError(
                f"{prefix}the conversation filled the model's context window "
                f"(stop reason model_context_window_exceeded)",
                code="context_overflow",
                retryable=False,
            )
        if self.stop not in STOPS:
            raise ProviderError(
                f"{prefix}unknown stop reason {self.stop!r}",
                code="invalid_stream",
                retryable=False,
            )
        blocks: list[AssistantBlock] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            block.close()
            if block.kind == "text":
                text = "".join(block.text)
                if text:
                    blocks.append(TextBlock(text))
            elif block.kind == "thinking":
                text, signature = "".join(block.text), "".join(block.signature)
                if text or signature:
                    blocks.append(ThinkingBlock(text, signature or None))
            elif block.kind == "tool_use":
                if block.problem is not None:
                    raise self._bad_call(block)
                blocks.append(ToolCall(block.call_id, block.name, block.input or {}))
        return TurnDone(tuple(blocks), self.stop, Usage(**self.usage), self.model)

    def _bad_call(self, block: _Block) -> ProviderError:
        where = f"{self.provider}: the call to {block.name} ({block.call_id})"
        if self.stop == "max_tokens":
            return ProviderError(
                f"{where} was cut off by the output token limit; {block.problem}",
                code="truncated_tool_call",
                retryable=False,
            )
        return ProviderError(
            f"{where} is malformed: {block.problem}", code="invalid_tool_call", retryable=True
        )


_USAGE_FIELDS: dict[str, str] = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_input_tokens",
    "cache_write": "cache_creation_input_tokens",
}
"""kiso's usage field -> the API's."""
