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
    SettingChanged,
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

__all__ = ["SYSTEM_PROMPT_KEY", "CallState", "CallStatus", "Replay", "replay"]

SYSTEM_PROMPT_KEY = "system_prompt"
"""The ``setting_changed`` key that records the system prompt in force (its value: the text)."""

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
        "rerun_of",
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
        self.rerun_of: ExecutionStarted | None = None
        """The start a person ruled ``rerun``: the next execution runs its recorded input."""
        self.result: ToolResultMessage | None = None

    @property
    def to_execute(self) -> ToolCall:
        """The call to run next: a rerun runs the input its ``execution_started`` recorded."""
        started = self.rerun_of
        if started is None:
            return self.call
        return ToolCall(self.call.call_id, started.name, started.input)

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


class Replay:
    """The fold's state: what the log says so far. Feed it events in seq order.

    ``replay(events)`` folds a whole log; a live session keeps one ``Replay`` and feeds it each
    event it appends, so asking for the next action or the next request costs nothing extra as
    the session grows. ``messages`` is only built when ``render`` is true.
    """

    __slots__ = (
        "_anchors",
        "_by_execution",
        "_calls",
        "_covers",
        "_last_anchor",
        "_turn_anchor",
        "_unsettled",
        "last_in_run",
        "last_outcome",
        "last_role",
        "messages",
        "mode",
        "open_run",
        "render",
        "run_turns",
        "running",
        "runs",
        "system_prompt",
        "title",
        "turn",
        "turns",
        "updated",
        "user_inputs",
    )

    def __init__(self, *, render: bool = True) -> None:
        self.render = render
        self.messages: list[Message] = []
        """The projection: what the model is shown."""
        self.open_run: str | None = None
        """The run with a ``run_started`` and no ``run_ended`` yet, if any."""
        self.runs = 0
        self.last_outcome: Outcome | None = None
        self.turn: list[CallState] | None = None
        """The calls of the open turn: the last ``assistant`` with calls not yet all settled."""
        self.running: dict[str, CallState] = {}
        """Executions started with no receipt and no ruling, by execution id, in start order."""
        self.last_in_run: Assistant | User | None = None
        """The last ``assistant`` or ``user`` of the open run."""
        self.last_role: str | None = None
        """The role of the last message the model would see: user, assistant or tool."""
        self.title: str | None = None
        self.turns = 0
        """Committed model turns in the whole session."""
        self.run_turns = 0
        """Committed model turns in the open run."""
        self.user_inputs = 0
        self.updated = 0
        self.mode: str | None = None
        """The approval mode the log last recorded (``run_started`` or ``setting_changed``)."""
        self.system_prompt: str | None = None
        """The system prompt the log last recorded (``setting_changed`` key ``system_prompt``)."""
        self._anchors: list[int] = []  # the seq each message stands for, parallel to messages
        self._calls: dict[str, CallState] = {}  # call_id -> the latest open call declaring it
        self._by_execution: dict[str, CallState] = {}
        self._turn_anchor = 0  # the seq of the open turn's assistant
        self._unsettled = 0  # how many of its calls have no result yet
        self._covers = 0  # the newest compaction's covers_to_seq
        self._last_anchor = 0

    @property
    def anchors(self) -> list[int]:
        """The seq each message of :attr:`messages` stands for (a tool result: its call's
        ``assistant``; the summary: its ``compacted``), parallel to ``messages``."""
        return self._anchors

    @property
    def covers(self) -> int:
        """The ``covers_to_seq`` of the newest compaction (0: none)."""
        return self._covers

    def _emit(self, message: Message, anchor: int) -> None:
        if anchor > self._covers:
            self.last_role = message.role
            self._last_anchor = anchor
            if self.render:
                self.messages.append(message)
                self._anchors.append(anchor)

    def _close_turn(self) -> None:
        """Emit the open turn's results in call order, with a note for each call still open."""
        turn = self.turn
        if turn is None:
            return
        calls = self._calls
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
            self._emit(cs.result, self._turn_anchor)
            if calls.get(cs.call.call_id) is cs:
                # A closed turn's calls are settled for good; what still refers to them later
                # changes nothing, so let them go (a long log then folds in less memory).
                del calls[cs.call.call_id]
        self.turn = None

    def _settle(self, cs: CallState, content: str, is_error: bool) -> None:
        cs.result = new_tool_result(
            call_id=cs.call.call_id, name=cs.call.name, content=content, is_error=is_error
        )
        if self.turn is not None and cs.turn_seq == self._turn_anchor:
            self._unsettled -= 1
            if not self._unsettled:
                self._close_turn()

    def feed(self, events: Iterable[Event]) -> Replay:
        """Fold ``events`` (the next ones, in seq order) into the state; returns ``self``."""
        if isinstance(events, tuple) and len(events) < 64:
            self._feed(events)  # a live append: too few objects for the collector to matter
        else:
            with gc_paused():
                self._feed(events)
        return self

    def _feed(self, events: Iterable[Event]) -> None:
        calls, by_execution, running = self._calls, self._by_execution, self.running
        for ev in events:
            if isinstance(ev, ExecutionStarted):
                cs = calls.get(ev.call_id)
                if cs is None:  # a start for a call no open turn declared: still an effect
                    cs = CallState(ToolCall(ev.call_id, ev.name, ev.input), ev.seq, ev.run)
                previous = by_execution.get(ev.execution_id)
                if previous is not None:  # an id reused: the newest start owns it
                    previous.running.pop(ev.execution_id, None)
                cs.running[ev.execution_id] = ev
                by_execution[ev.execution_id] = cs
                running[ev.execution_id] = cs
            elif isinstance(ev, ExecutionFinished):
                cs = by_execution.get(ev.execution_id)
                if cs is not None and cs.running.pop(ev.execution_id, None) is not None:
                    del running[ev.execution_id]
                    del by_execution[ev.execution_id]
                    cs.receipt = ev
                    if cs.result is None:
                        self._settle(cs, ev.content, ev.is_error)
            elif isinstance(ev, ApprovalDecided):
                cs = calls.get(ev.call_id)
                if cs is not None:
                    cs.add_verdict(ev)
                    if cs.decision is ev and ev.decision == "denied":
                        reason = ev.reason or "no reason given"
                        self._settle(cs, f"[denied by {ev.decided_by}] {reason}", True)
            elif isinstance(ev, Assistant):
                self._close_turn()
                self._emit(new_assistant_message(blocks=ev.blocks), ev.seq)
                new_calls = [
                    CallState(b, ev.seq, ev.run) for b in ev.blocks if isinstance(b, ToolCall)
                ]
                for cs in new_calls:
                    calls[cs.call.call_id] = cs
                self.turn = new_calls or None
                self._turn_anchor = ev.seq
                self._unsettled = len(new_calls)
                self.turns += 1
                if ev.run == self.open_run:
                    self.last_in_run = ev
                    self.run_turns += 1
            elif isinstance(ev, ApprovalRequested):
                cs = calls.get(ev.call_id)
                if cs is not None and cs.result is None:
                    cs.request = ev
            elif isinstance(ev, ExecutionResolved):
                cs = by_execution.get(ev.execution_id)
                started = cs.running.pop(ev.execution_id, None) if cs is not None else None
                if cs is not None and started is not None:
                    del running[ev.execution_id]
                    del by_execution[ev.execution_id]
                    cs.resolution = ev
                    if cs.result is None:
                        if ev.resolution == "skipped":
                            self._settle(cs, SKIPPED, True)
                        elif ev.resolution == "applied":
                            self._settle(cs, APPLIED, False)
                        else:  # rerun: approved again; its next execution settles it
                            cs.rerun_of = started
            elif isinstance(ev, User):
                self._close_turn()
                content = (TextBlock(ev.content),) if isinstance(ev.content, str) else ev.content
                self._emit(UserMessage(content), ev.seq)
                if ev.run == self.open_run:
                    self.last_in_run = ev
                self.user_inputs += 1
                if self.title is None and ev.source == "user":
                    self.title = ev.text
            elif isinstance(ev, RunStarted):
                self._close_turn()
                self.mode = ev.mode
                self.open_run = ev.run
                self.last_in_run = None
                self.run_turns = 0
                self.runs += 1
            elif isinstance(ev, RunEnded):
                self._close_turn()
                if ev.run == self.open_run:
                    self.open_run = None
                    self.last_in_run = None
                self.last_outcome = ev.outcome
            elif isinstance(ev, SettingChanged):
                if ev.key == "mode" and isinstance(ev.value, str):
                    self.mode = ev.value
                elif ev.key == SYSTEM_PROMPT_KEY and isinstance(ev.value, str):
                    self.system_prompt = ev.value
            elif isinstance(ev, Compacted):
                covers = self._covers = max(self._covers, ev.covers_to_seq)
                if self._last_anchor <= covers:
                    self.last_role = "user"  # the summary is all that is left
                if self.render:
                    anchors, messages = self._anchors, self.messages
                    keep = [i for i, a in enumerate(anchors) if a > covers]
                    summary = UserMessage((TextBlock(f"{SUMMARY_FRAMING}\n\n{ev.summary}"),))
                    messages[:] = [summary, *(messages[i] for i in keep)]
                    anchors[:] = [ev.seq, *(anchors[i] for i in keep)]
            self.updated = ev.ts


def replay(events: Iterable[Event], *, render: bool = True) -> Replay:
    """Fold a whole log (the events after its header) in one pass."""
    return Replay(render=render).feed(events)
