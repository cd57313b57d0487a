"""What ``Session.run`` and ``Session.resume`` yield, in order, as a run proceeds.

Live events (``text_delta``, ``thinking_delta``, ``retry``, ``tool_output``) are shown and
forgotten. Every other event reports a record that is committed to the session log when it is
yielded, in the log's order: durable before anything acts on it — before a call with side effects
runs, before anyone is asked anything, before the run ends. (A read-only round's records ride in
one batch: docs/runtime.md, "The fsync budget".) Each event has a ``type`` string, so consumers
can ``match`` on classes or switch on ``ev.type``.

Two events ask the consumer something: ``approval_request`` and ``uncertain``. Answer them with
``session.approve``/``session.deny`` or ``session.resolve`` before asking for the next event and
the run continues (the answer is yielded back as a ``decision`` or a ``ruling``); otherwise it
pauses (``paused``), the question stays durable, and ``session.resume()`` asks again later.

:meth:`to_json` is the one JSON form of every event: what ``kiso -p --output-format stream-json``
prints and what a server streams. It is a versioned contract (:data:`STREAM_VERSION`, documented
in docs/runtime.md and pinned by tests/runtime/test_stream_json.py): fields are only ever added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from kiso.kernel import (
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    Compacted,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    Outcome,
    ToolCall,
    Uncertain,
)

if TYPE_CHECKING:
    from kiso.runtime.offers import Offer

__all__ = [
    "STREAM_VERSION",
    "ApprovalRequest",
    "Compaction",
    "CompactionFailed",
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
    "event_to_json",
]

STREAM_VERSION = 1
"""The version of the JSON form of run events (``"v"`` in every object)."""


def _call(call: ToolCall) -> dict[str, Any]:
    return {"call_id": call.call_id, "name": call.name, "input": call.input}


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    type: ClassVar[str] = "text_delta"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "v": STREAM_VERSION, "text": self.text}


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    text: str
    type: ClassVar[str] = "thinking_delta"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "v": STREAM_VERSION, "text": self.text}


@dataclass(frozen=True, slots=True)
class Retry:
    """A model request failed with a retryable error; the next attempt starts after ``delay``."""

    attempt: int
    delay: float
    error: str
    type: ClassVar[str] = "retry"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "v": STREAM_VERSION,
            "attempt": self.attempt,
            "delay": self.delay,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """A committed model turn (the ``assistant`` record is on disk)."""

    event: Assistant
    type: ClassVar[str] = "model_turn"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "v": STREAM_VERSION, "event": self.event.to_json()}

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return self.event.calls


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A human is asked about ``call``; answer with ``session.approve`` or ``session.deny``."""

    call: ToolCall
    request: ApprovalRequested
    offer: Offer | None = None
    """What the runtime lets the person choose: the "don't ask again" rule (or why there is
    none) and the one warning line an irreversible delete carries."""
    type: ClassVar[str] = "approval_request"

    def to_json(self) -> dict[str, Any]:
        offer = self.offer
        return {
            "type": self.type,
            "v": STREAM_VERSION,
            "call": _call(self.call),
            "event": self.request.to_json(),
            "offer": None
            if offer is None
            else {
                "rule": offer.rule.text if offer.rule is not None else None,
                "no_rule_because": offer.no_rule_because,
                "warning": offer.warning,
            },
        }

    @property
    def call_id(self) -> str:
        return self.call.call_id


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict on a call is on disk (by a policy, a rule, the floor, or a human)."""

    event: ApprovalDecided
    call: ToolCall | None = None
    """The call it decides (None only when the log no longer names it)."""
    type: ClassVar[str] = "decision"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "v": STREAM_VERSION,
            "call": None if self.call is None else _call(self.call),
            "event": self.event.to_json(),
        }


@dataclass(frozen=True, slots=True)
class ToolStart:
    """``execution_started`` is on disk; the handler runs now."""

    call: ToolCall
    event: ExecutionStarted
    type: ClassVar[str] = "tool_start"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "v": STREAM_VERSION,
            "call": _call(self.call),
            "event": self.event.to_json(),
        }


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """Output the running tool reported (``ToolContext.on_output``), between its ``tool_start``
    and its ``tool_end``. Live, not persisted: the log keeps only the receipt."""

    call: ToolCall
    execution_id: str
    text: str
    type: ClassVar[str] = "tool_output"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "v": STREAM_VERSION,
            "call_id": self.call.call_id,
            "name": self.call.name,
            "execution_id": self.execution_id,
            "text": self.text,
        }


@dataclass(frozen=True, slots=True)
class ToolEnd:
    """The receipt is on disk."""

    call: ToolCall
    event: ExecutionFinished
    type: ClassVar[str] = "tool_end"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "v": STREAM_VERSION,
            "call": _call(self.call),
            "event": self.event.to_json(),
        }


@dataclass(frozen=True, slots=True)
class UncertainPending:
    """Executions started and never reported; rule on each with ``session.resolve``."""

    executions: tuple[Uncertain, ...]
    running: frozenset[str] = field(default_factory=frozenset)
    """Ids of executions whose processes may still be running (a ruling waits for them)."""
    type: ClassVar[str] = "uncertain"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "v": STREAM_VERSION,
            "executions": [
                {
                    "execution_id": u.execution_id,
                    "call_id": u.call_id,
                    "name": u.name,
                    "input": u.input,
                    "started_seq": u.started_seq,
                    "auto_rerun": u.auto_rerun,
                    "may_be_running": u.execution_id in self.running,
                }
                for u in self.executions
            ],
        }


@dataclass(frozen=True, slots=True)
class Ruling:
    """A ruling on an uncertain execution is on disk."""

    event: ExecutionResolved
    type: ClassVar[str] = "ruling"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "v": STREAM_VERSION, "event": self.event.to_json()}


@dataclass(frozen=True, slots=True)
class Paused:
    """The run is waiting for a human (``awaiting_approval`` or ``uncertain``); it stays open."""

    reason: str
    type: ClassVar[str] = "paused"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "v": STREAM_VERSION, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Terminal:
    """The run ended; ``run_ended`` is on disk."""

    outcome: Outcome
    type: ClassVar[str] = "terminal"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "v": STREAM_VERSION, "outcome": self.outcome.to_json()}


@dataclass(frozen=True, slots=True)
class Compaction:
    """A summary now replaces older history: the ``compacted`` record is on disk."""

    event: Compacted
    covered: int = 0
    """How many messages of the projection it replaced."""
    estimated: bool = False
    """Whether ``tokens_before`` was estimated (no provider count covered the request)."""
    type: ClassVar[str] = "compaction"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "v": STREAM_VERSION,
            "event": self.event.to_json(),
            "covered": self.covered,
            "estimated": self.estimated,
        }

    def describe(self) -> str:
        """``⟳ compacted (auto): 12 messages → a summary · ~61,200 → ~9,800 tokens …``."""
        c = self.event
        before = f"~{c.tokens_before:,}" if c.tokens_before is not None else "?"
        after = f"~{c.tokens_after:,}" if c.tokens_after is not None else "?"
        said = " (estimated)" if self.estimated else ""
        messages = "message" if self.covered == 1 else "messages"
        return (
            f"⟳ compacted ({c.trigger}): {self.covered} {messages} → a summary · {before} → "
            f"{after} tokens{said} · the log keeps every event"
        )


@dataclass(frozen=True, slots=True)
class CompactionFailed:
    """A summary was not written (rejected, or its request failed); nothing changed on disk.
    ``disabled``: auto-compaction is now off for the session (after three in a row)."""

    reason: str
    failures: int
    disabled: bool
    counted: bool = True
    """False when there was nothing to compact (not a failure of the summary)."""
    type: ClassVar[str] = "compaction_failed"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "v": STREAM_VERSION,
            "reason": self.reason,
            "failures": self.failures,
            "disabled": self.disabled,
        }

    def describe(self) -> str:
        if not self.counted:
            return f"nothing compacted: {self.reason}"
        line = f"⚠ the summary was not kept ({self.reason}); nothing was written"
        if self.disabled:
            line += (
                f" · {self.failures} failures in a row: auto-compaction is off for this "
                f"session (/compact tries again)"
            )
        return line


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
    | Compaction
    | CompactionFailed
)


def event_to_json(event: RunEvent) -> dict[str, Any]:
    """The JSON form of a run event (``event.to_json()``), for callers holding the union."""
    return event.to_json()
