"""One pass over a log: the state of every tool call, and (optionally) the model's messages.

This fold is the single place that decides what a call's result is (a receipt, a denial, a ruling
on an uncertain execution, or the note that its run ended first) and which calls are still open.
:mod:`kiso.kernel.projection` reads the messages from it; :mod:`kiso.kernel.recovery` reads the
call states. Both are therefore consistent by construction.

Rules the fold applies:

* A turn's results are emitted together, in call order, right after its ``assistant`` message,
  once every call of the turn is settled. Until then none is emitted, so a projection taken at
  any point is a prefix of every later one (until a compaction rewrites history).
* A turn left unsettled when new input arrives or its run ends is closed with a note per open
  call, so every ``tool_call`` the model sees has exactly one result.
* A verdict counts only if its ``input_sha256`` matches the call's input; the first one counts.
* ``compacted`` replaces every message anchored at or below ``covers_to_seq`` with one summary; a
  tool result is anchored at its call's ``assistant``, so a pair is kept or dropped whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kiso.kernel._fast import gc_paused
from kiso.kernel.events import (
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    Compacted,
    Event,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    Outcome,
    RunEnded,
    RunStarted,
    TextBlock,
    ToolCall,
    User,
    input_sha256,
)
from kiso.kernel.messages import (
    Message,
    ToolResultMessage,
    UserMessage,
    new_assistant_message,
    new_tool_result,
)

__all__ = ["CallState", "CallStatus", "Replay", "replay"]

SUMMARY_FRAMING = (
    "[Earlier conversation compacted] The messages before this point were replaced by the "
    "summary below; the messages after it are verbatim."
)
NOT_DECIDED = (
    "[not run] This call was never approved or denied: the turn ended before a decision, so "
    "nothing was executed."
)
NOT_STARTED = (
    "[not run] This call was approved but the turn ended before it started, so nothing was "
    "executed."
)
UNCERTAIN = (
    "[uncertain] This call started but its result was never recorded; it may or may not have "
    "taken effect. Check before relying on it."
)
SKIPPED = (
    "[skipped] This call was interrupted before its result was recorded, and a human chose not "
    "to run it again. Treat its effect as not applied."
)
APPLIED = (
    "[applied] This call was interrupted before its result was recorded; a human confirmed that "
    "its effect was applied. Its output is not available."
)


class CallStatus:
    """The states a call moves through. Plain strings, so they print and compare simply."""

    UNDECIDED = "undecided"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    UNCERTAIN = "uncertain"
    SETTLED = "settled"


class CallState:
    """What the log says about one call of one turn (mutable while the fold runs)."""

    __slots__ = (
        "_unchecked",
        "call",
        "decision",
        "digest",
        "receipt",
        "request",
        "resolution",
        "result",
        "run",
        "running",
        "turn_seq",
    )

    def __init__(self, call: ToolCall, turn_seq: int, run: str) -> None:
        self.call = call
        self.turn_seq = turn_seq
        self.run = run
        self.digest: str | None = None
        self.request: ApprovalRequested | None = None
        self.decision: ApprovalDecided | None = None
        """The verdict that counts: the first whose digest matches the call's input."""
        self._unchecked: list[ApprovalDecided] = []
        self.running: dict[str, ExecutionStarted] = {}
        """Executions of this call that started and have neither a receipt nor a ruling."""
        self.receipt: ExecutionFinished | None = None
        self.resolution: ExecutionResolved | None = None
        self.result: ToolResultMessage | None = None

    @property
    def status(self) -> str:
        if self.result is not None:
            return CallStatus.SETTLED
        if self.running:
            return CallStatus.UNCERTAIN
        if self.verdict() is not None:
            return CallStatus.APPROVED
        if self.request is not None:
            return CallStatus.AWAITING_APPROVAL
        return CallStatus.UNDECIDED

    def add_verdict(self, decided: ApprovalDecided) -> None:
        """Record a verdict. Approvals are checked against the input only when asked about:
        hashing every input of a long log would cost more than the rest of a replay."""
        if self.decision is not None or self.result is not None:
            return
        if decided.decision == "approved":
            self._unchecked.append(decided)
        elif self.verdict() is None and self._matches(decided):
            self.decision = decided

    def verdict(self) -> ApprovalDecided | None:
        """The verdict that counts, checking pending approvals in the order they were written."""
        if self.decision is None and self._unchecked:
            for candidate in self._unchecked:
                if self._matches(candidate):
                    self.decision = candidate
                    break
            self._unchecked.clear()
        return self.decision

    def _matches(self, decided: ApprovalDecided) -> bool:
        if self.digest is None:
            self.digest = input_sha256(self.call.input)
        return decided.input_sha256 == self.digest


@dataclass(slots=True)
class Replay:
    """The fold's result. ``messages`` is empty unless the replay rendered them."""

    messages: list[Message] = field(default_factory=list)
    open_run: str | None = None
    """The run with a ``run_started`` and no ``run_ended`` yet, if any."""
    runs: int = 0
    last_outcome: Outcome | None = None
    turn: list[CallState] | None = None
    """The calls of the open turn: the last ``assistant`` with calls not yet all settled."""
    running: dict[str, CallState] = field(default_factory=dict)
    """Executions started with no receipt and no ruling, by execution id, in start order."""
    last_in_run: Assistant | User | None = None
    """The last ``assistant`` or ``user`` of the open run."""
    last_role: str | None = None
    """The role of the last message the model would see: user, assistant or tool."""
    title: str | None = None
    user_inputs: int = 0
    updated: int = 0


def replay(events: Iterable[Event], *, render: bool = True) -> Replay:
    """Fold ``events`` (the log after its header) in one pass."""
    with gc_paused():
        return _replay(events, render)


def _replay(events: Iterable[Event], render: bool) -> Replay:
    state = Replay()
    messages = state.messages
    anchors: list[int] = []  # the seq each message stands for, parallel to `messages`
    calls: dict[str, CallState] = {}  # call_id -> the latest call that declared it
    by_execution: dict[str, CallState] = {}
    turn: list[CallState] | None = None
    turn_anchor = 0  # the seq of the open turn's assistant
    unsettled = 0  # how many of its calls have no result yet
    covers = 0  # the newest compaction's covers_to_seq

    last_anchor = 0

    def emit(message: Message, anchor: int) -> None:
        nonlocal last_anchor
        if anchor > covers:
            state.last_role = message.role
            last_anchor = anchor
            if render:
                messages.append(message)
                anchors.append(anchor)

    def close_turn() -> None:
        """Emit the open turn's results in call order, with a note for each call still open."""
        nonlocal turn
        if turn is None:
            return
        for cs in turn:
            if cs.result is None:
                status = cs.status
                note = (
                    UNCERTAIN
                    if status == CallStatus.UNCERTAIN
                    else NOT_STARTED
                    if status == CallStatus.APPROVED
                    else NOT_DECIDED
                )
                cs.result = new_tool_result(
                    call_id=cs.call.call_id, name=cs.call.name, content=note, is_error=True
                )
            emit(cs.result, turn_anchor)
            if calls.get(cs.call.call_id) is cs:
                # A closed turn's calls are settled for good; what still refers to them later
                # changes nothing, so let them go (a long log then folds in less memory).
                del calls[cs.call.call_id]
        turn = None

    def settle(cs: CallState, content: str, is_error: bool) -> None:
        nonlocal unsettled
        cs.result = new_tool_result(
            call_id=cs.call.call_id, name=cs.call.name, content=content, is_error=is_error
        )
        if turn is not None and cs.turn_seq == turn_anchor:
            unsettled -= 1
            if not unsettled:
                close_turn()

    for ev in events:
        if isinstance(ev, ExecutionStarted):
            cs = calls.get(ev.call_id)
            if cs is None:  # a start for a call no turn declared: still a possible side effect
                cs = CallState(ToolCall(ev.call_id, ev.name, ev.input), ev.seq, ev.run)
            previous = by_execution.get(ev.execution_id)
            if previous is not None:  # an id reused: the newest start owns it
                previous.running.pop(ev.execution_id, None)
            cs.running[ev.execution_id] = ev
            by_execution[ev.execution_id] = cs
            state.running[ev.execution_id] = cs
        elif isinstance(ev, ExecutionFinished):
            cs = by_execution.get(ev.execution_id)
            if cs is not None and cs.running.pop(ev.execution_id, None) is not None:
                del state.running[ev.execution_id]
                del by_execution[ev.execution_id]
                cs.receipt = ev
                if cs.result is None:
                    settle(cs, ev.content, ev.is_error)
        elif isinstance(ev, ApprovalDecided):
            cs = calls.get(ev.call_id)
            if cs is not None:
                cs.add_verdict(ev)
                if cs.decision is ev and ev.decision == "denied":
                    reason = ev.reason or "no reason given"
                    settle(cs, f"[denied by {ev.decided_by}] {reason}", True)
        elif isinstance(ev, Assistant):
            close_turn()
            emit(new_assistant_message(blocks=ev.blocks), ev.seq)
            new_calls = [CallState(b, ev.seq, ev.run) for b in ev.blocks if isinstance(b, ToolCall)]
            for cs in new_calls:
                calls[cs.call.call_id] = cs
            turn = new_calls or None
            turn_anchor = ev.seq
            unsettled = len(new_calls)
            if ev.run == state.open_run:
                state.last_in_run = ev
        elif isinstance(ev, ApprovalRequested):
            cs = calls.get(ev.call_id)
            if cs is not None and cs.result is None:
                cs.request = ev
        elif isinstance(ev, ExecutionResolved):
            cs = by_execution.get(ev.execution_id)
            if cs is not None and cs.running.pop(ev.execution_id, None) is not None:
                del state.running[ev.execution_id]
                del by_execution[ev.execution_id]
                cs.resolution = ev
                if cs.result is None:
                    if ev.resolution == "skipped":
                        settle(cs, SKIPPED, True)
                    elif ev.resolution == "applied":
                        settle(cs, APPLIED, False)
                    # "rerun": the call is approved again and its next execution settles it
        elif isinstance(ev, User):
            close_turn()
            content = (TextBlock(ev.content),) if isinstance(ev.content, str) else ev.content
            emit(UserMessage(content), ev.seq)
            if ev.run == state.open_run:
                state.last_in_run = ev
            state.user_inputs += 1
            if state.title is None and ev.source == "user":
                state.title = ev.text
        elif isinstance(ev, RunStarted):
            close_turn()
            state.open_run = ev.run
            state.last_in_run = None
            state.runs += 1
        elif isinstance(ev, RunEnded):
            close_turn()
            if ev.run == state.open_run:
                state.open_run = None
                state.last_in_run = None
            state.last_outcome = ev.outcome
        elif isinstance(ev, Compacted):
            covers = max(covers, ev.covers_to_seq)
            if last_anchor <= covers:
                state.last_role = "user"  # the summary is all that is left
            if render:
                keep = [i for i, a in enumerate(anchors) if a > covers]
                summary = UserMessage((TextBlock(f"{SUMMARY_FRAMING}\n\n{ev.summary}"),))
                messages[:] = [summary, *(messages[i] for i in keep)]
                anchors[:] = [ev.seq, *(anchors[i] for i in keep)]
        state.updated = ev.ts
    state.turn = turn
    return state
