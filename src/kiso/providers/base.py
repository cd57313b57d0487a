"""The adapter contract: how the runtime talks to a model.

An adapter turns one :class:`ModelRequest` into a stream of :class:`StreamEvent`: live deltas
(text, thinking) for display, then exactly one :class:`TurnDone` carrying the whole turn. The
runtime commits the turn (writes the ``assistant`` record) only if the stream ends cleanly right
after that one ``TurnDone``; anything else (an exception, a second ``TurnDone``, an event after it,
no ``TurnDone`` at all) is a failed attempt and nothing is written.

Failures are :class:`ProviderError` with an HTTP-like ``status`` and a ``retryable`` flag; the
runtime retries retryable ones with backoff and ends the run with an error outcome otherwise.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from kiso.kernel import Message, RunError
from kiso.kernel.events import AssistantBlock, Usage

__all__ = [
    "Adapter",
    "ModelRequest",
    "ProviderError",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolSpec",
    "TurnDone",
    "retryable_status",
]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    system: str | None
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    turn: int = 0
    """How many model turns this session has committed before this request (from the log)."""
    options: dict[str, Any] = field(default_factory=dict)
    max_output: int | None = None
    """A cap on this response's tokens, below the adapter's own (a summary's budget)."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    text: str


@dataclass(frozen=True, slots=True)
class TurnDone:
    """The end of a clean stream: the whole turn, as it will be committed."""

    blocks: tuple[AssistantBlock, ...]
    stop: str
    usage: Usage
    model: str


StreamEvent: TypeAlias = TextDelta | ThinkingDelta | TurnDone


class ProviderError(RunError):
    """A model request failed; ``code`` is short and stable (rate_limit, overloaded, ...)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str = "unknown",
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after


def retryable_status(status: int | None) -> bool:
    """408, 409, 429, 5xx and 529 are worth retrying; 400, 401, 403, 404 are not."""
    if status is None:
        return True  # no status: the connection itself failed
    return status in (408, 409, 429) or status >= 500


class Adapter(Protocol):
    provider: str
    model: str

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """Stream one response. Raise :class:`ProviderError` on failure."""
        ...
