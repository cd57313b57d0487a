"""What ``Session.run`` and ``Session.resume`` yield, in order, as a run proceeds.

Live events (``text_delta``, ``thinking_delta``, ``retry``, ``tool_output``) are shown and
forgotten. Every other event reports a record that is already durable in the session log when it
is yielded. Each event has a ``type`` string, so consumers can ``match`` on classes or switch on
``ev.type``.

Two events ask the consumer something: ``approval_request`` and ``uncertain``. Answer them with
``session.approve``/``session.deny`` or ``session.resolve`` before asking for the next event and
the run continues; otherwise it pauses (``paused``), the question stays durable, and
``session.resume()`` asks again later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from kiso.kernel import (
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    Outcome,
    ToolCall,
    Uncertain,
)

__all__ = [
    "ApprovalRequest",
    "Decision",
    "ModelTurn",
    "Paused",
    "Retry",
    "Ruling",
    "RunEvent",
    "Terminal",
    "TextDelta",
    "ThinkingDelta",
    "ToolEnd",
    "ToolOutput",
    "ToolStart",
    "UncertainPending",
]


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    type: ClassVar[str] = "text_delta"


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    text: str
    type: ClassVar[str] = "thinking_delta"


@dataclass(frozen=True, slots=True)
class Retry:
    """A model request failed with a retryable error; the next attempt starts after ``delay``."""

    attempt: int
    delay: float
    error: str
    type: ClassVar[str] = "retry"


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """A committed model turn (the ``assistant`` record is on disk)."""

    event: Assistant
    type: ClassVar[str] = "model_turn"

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return self.event.calls


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A human is asked about ``call``; answer with ``session.approve`` or ``session.deny``."""

    call: ToolCall
    request: ApprovalRequested
    type: ClassVar[str] = "approval_request"

    @property
    def call_id(self) -> str:
        return self.call.call_id


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict on a call is on disk (by a policy, a rule, the floor, or a human)."""

    event: ApprovalDecided
    type: ClassVar[str] = "decision"


@dataclass(frozen=True, slots=True)
class ToolStart:
    """``execution_started`` is on disk; the handler runs now."""

    call: ToolCall
    event: ExecutionStarted
    type: ClassVar[str] = "tool_start"


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """Output the running tool reported (``ToolContext.on_output``), between its ``tool_start``
    and its ``tool_end``. Live, not persisted: the log keeps only the receipt."""

    call: ToolCall
    execution_id: str
    text: str
    type: ClassVar[str] = "tool_output"


@dataclass(frozen=True, slots=True)
class ToolEnd:
    """The receipt is on disk."""

    call: ToolCall
    event: ExecutionFinished
    type: ClassVar[str] = "tool_end"


@dataclass(frozen=True, slots=True)
class UncertainPending:
    """Executions started and never reported; rule on each with ``session.resolve``."""

    executions: tuple[Uncertain, ...]
    type: ClassVar[str] = "uncertain"


@dataclass(frozen=True, slots=True)
class Ruling:
    """A ruling on an uncertain execution is on disk."""

    event: ExecutionResolved
    type: ClassVar[str] = "ruling"


@dataclass(frozen=True, slots=True)
class Paused:
    """The run is waiting for a human (``awaiting_approval`` or ``uncertain``); it stays open."""

    reason: str
    type: ClassVar[str] = "paused"


@dataclass(frozen=True, slots=True)
class Terminal:
    """The run ended; ``run_ended`` is on disk."""

    outcome: Outcome
    type: ClassVar[str] = "terminal"


RunEvent: TypeAlias = (
    TextDelta
    | ThinkingDelta
    | Retry
    | ModelTurn
    | ApprovalRequest
    | Decision
    | ToolStart
    | ToolOutput
    | ToolEnd
    | UncertainPending
    | Ruling
    | Paused
    | Terminal
)
