"""``plan(events) -> Action``: the one next action after any crash, as a pure function of the log.

The table of DURABILITY.md, checked in this order against the last open run:

==============================================================  =====================
durable prefix                                                  action
==============================================================  =====================
no open run                                                     :class:`Idle`
an ``execution_started`` with no receipt and no ruling          :class:`ResolveUncertain`
an ``approval_requested`` with no decision                      :class:`AwaitApproval`
a committed call with no verdict                                :class:`Decide`
approved (or ruled ``rerun``), not started                      :class:`Execute`
every call of the last ``assistant`` settled, or input last     :class:`CallModel`
the last ``assistant`` ended its turn with no calls             :class:`EndRun`
==============================================================  =====================

An action names every call it applies to, in call order, so a driver may handle them together
(independent read-only calls run in parallel) and then ask again. ``plan`` never asks to execute
a call that has a receipt: a settled call is never in :class:`Execute`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeAlias

from kiso.kernel.events import ApprovalRequested, Assistant, Event, Outcome, ToolCall
from kiso.kernel.replay import CallStatus, Replay, replay

__all__ = [
    "Action",
    "AwaitApproval",
    "CallModel",
    "Decide",
    "EndRun",
    "Execute",
    "Idle",
    "ResolveUncertain",
    "SessionState",
    "Uncertain",
    "plan",
    "plan_replay",
    "session_state",
]


@dataclass(frozen=True, slots=True)
class Idle:
    """No open run: nothing to recover."""


@dataclass(frozen=True, slots=True)
class Uncertain:
    """An execution that started and never reported: did its side effect happen?"""

    execution_id: str
    call_id: str
    name: str
    input: dict[str, Any]
    started_seq: int
    auto_rerun: bool
    """The tool is declared read-only or idempotent: re-run it, recorded as policy:idempotent."""


@dataclass(frozen=True, slots=True)
class ResolveUncertain:
    """Ask a human to rule on each execution (rerun now / skip it / it was applied)."""

    executions: tuple[Uncertain, ...]


@dataclass(frozen=True, slots=True)
class AwaitApproval:
    """Re-present these persisted questions; their answers are not on disk yet."""

    requests: tuple[ApprovalRequested, ...]


@dataclass(frozen=True, slots=True)
class Decide:
    """Run the approval chain for these committed calls (no verdict is on disk for them)."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class Execute:
    """Execute these approved calls with their persisted input (for a rerun: the input its
    ``execution_started`` recorded)."""

    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class CallModel:
    """Build the next request from the projection and call the model."""


@dataclass(frozen=True, slots=True)
class EndRun:
    """Write ``run_ended`` with this outcome: the run has nothing left to do."""

    outcome: Outcome


Action: TypeAlias = Idle | ResolveUncertain | AwaitApproval | Decide | Execute | CallModel | EndRun

_COMPLETED_STOPS = frozenset({"end_turn", "stop_sequence"})
_STOP_ERRORS = {
    "max_tokens": "the model's reply hit its output token limit before it finished",
    "refusal": "the model refused to continue",
    "content_filter": "the provider's content filter stopped the reply",
    "tool_use": "the model stopped for tool use but made no tool call",
}


def _end_of_turn(assistant: Assistant) -> Action:
    if assistant.stop in _COMPLETED_STOPS:
        return EndRun(Outcome.completed())
    if assistant.stop == "pause_turn":
        return CallModel()
    message = _STOP_ERRORS.get(assistant.stop, f"the model stopped with {assistant.stop!r}")
    return EndRun(Outcome.error(assistant.stop, message, retryable=False))


def plan(events: Iterable[Event], *, rerunnable: Collection[str] = ()) -> Action:
    """The one next action for the log ``events`` (the events after the header).

    ``rerunnable`` names the tools declared read-only or idempotent; their uncertain executions
    are marked ``auto_rerun``.
    """
    return plan_replay(replay(events, render=False), rerunnable=rerunnable)


def plan_replay(state: Replay, *, rerunnable: Collection[str] = ()) -> Action:
    """:func:`plan` over an existing :func:`~kiso.kernel.replay.replay` of the log."""
    run = state.open_run
    if run is None:
        return Idle()
    uncertain = tuple(
        Uncertain(
            started.execution_id,
            started.call_id,
            started.name,
            started.input,
            started.seq,
            started.name in rerunnable,
        )
        for execution_id, cs in state.running.items()
        if (started := cs.running[execution_id]).run == run
    )
    if uncertain:
        return ResolveUncertain(uncertain)
    turn = state.turn if isinstance(state.last_in_run, Assistant) else None
    if turn:
        statuses = [(cs, cs.status) for cs in turn]
        requests = tuple(
            cs.request
            for cs, s in statuses
            if s == CallStatus.AWAITING_APPROVAL and cs.request is not None
        )
        if requests:
            return AwaitApproval(requests)
        undecided = tuple(cs.call for cs, s in statuses if s == CallStatus.UNDECIDED)
        if undecided:
            return Decide(undecided)
        approved = tuple(cs.to_execute for cs, s in statuses if s == CallStatus.APPROVED)
        if approved:
            return Execute(approved)
    last = state.last_in_run
    if isinstance(last, Assistant) and not last.calls:
        return _end_of_turn(last)
    if last is None and state.last_role not in ("user", "tool"):
        return EndRun(
            Outcome.error(
                "no_input",
                "the run started but no input was admitted before it stopped",
                retryable=False,
            )
        )
    return CallModel()


class SessionState(StrEnum):
    """What ``kiso resume`` would do with a session, in the words a listing shows."""

    EMPTY = "empty"
    """No run ever started."""
    COMPLETED = "completed"
    """The last run ended ``completed``."""
    ENDED = "ended"
    """The last run ended otherwise (error, aborted, max_turns, budget)."""
    INTERRUPTED = "interrupted"
    """A run is open: resume continues it from its durable prefix."""
    UNCERTAIN = "uncertain"
    """A run is open with an execution that may or may not have applied: a human rules first."""
    AWAITING_APPROVAL = "awaiting_approval"
    """A run is open with a question nobody answered: resume asks it again."""
    CORRUPT = "corrupt"
    """The log does not load; nothing resumes it until it is repaired (the error says where)."""


def session_state(state: Replay) -> SessionState:
    """The state a session would resume into, from a replay of its log."""
    if state.runs == 0:
        return SessionState.EMPTY
    action = plan_replay(state)
    if isinstance(action, Idle):
        outcome = state.last_outcome
        if outcome is not None and outcome.kind == "completed":
            return SessionState.COMPLETED
        return SessionState.ENDED
    if isinstance(action, ResolveUncertain):
        return SessionState.UNCERTAIN
    if isinstance(action, AwaitApproval):
        return SessionState.AWAITING_APPROVAL
    return SessionState.INTERRUPTED
