"""A durable conversation: ``run`` a prompt, answer questions, ``resume`` after anything.

A :class:`Session` holds its log's writer lock for as long as it is open. Everything it knows is
read from the log: the model's messages, the pending questions, the uncertain executions, the
approval mode in force. Answers (``approve``, ``deny``, ``resolve``) and settings (``set_mode``)
are written to the log and made durable the moment they are given, whether or not a run is
iterating, so an answer given just before a crash is never lost, and the next ``resume`` carries
the run forward from exactly there.

Every decision an edge might be tempted to make is made here, once: what an approval may offer
(:meth:`Session.offer`), which mode is in force (:attr:`Session.mode`: what the log last
recorded, unless the session was opened with an override), how a run with nobody to ask treats a
question (``headless``: a denial by ``headless`` naming the modes that would allow the call).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiso.kernel import (
    ApprovalDecided,
    Assistant,
    Event,
    ExecutionResolved,
    Message,
    ModelRef,
    Outcome,
    RefusedError,
    ResolveUncertain,
    Ruling,
    RunStarted,
    SessionState,
    SessionWriter,
    SettingChanged,
    Uncertain,
    UsageError,
    User,
    input_sha256,
    new_id,
    parse_ruling,
    replay,
    session_state,
)
from kiso.kernel.events import Source, UserBlock
from kiso.kernel.messages import UserMessage
from kiso.kernel.recovery import plan_replay
from kiso.kernel.replay import SYSTEM_PROMPT_KEY, CallState, CallStatus, Replay
from kiso.kernel.values import TextBlock
from kiso.runtime.approvals import check_mode
from kiso.runtime.failpoint import Failpoint
from kiso.runtime.hooks import RunInfo, Veto
from kiso.runtime.loop import Run, drive
from kiso.runtime.stream import RunEvent

if TYPE_CHECKING:
    from kiso.runtime.agent import Agent
    from kiso.runtime.offers import Offer

__all__ = ["PromptTooLargeError", "Session", "check_prompt_fits"]

RULING_WAIT_S = 5.0
"""How long a ruling waits for an uncertain execution's processes to go before refusing."""


class Session:
    def __init__(
        self,
        agent: Agent,
        writer: SessionWriter,
        *,
        mode: str | None = None,
        headless: bool = False,
        system_prompt: str | None = None,
    ) -> None:
        self.agent = agent
        self._writer = writer
        self._fold = replay(writer.events)
        failpoint = Failpoint.from_env()
        if failpoint.active:
            writer.on_durable = failpoint.after_durable
        self.headless = headless
        """Nobody can answer a question: an ask is denied (``decided_by: "headless"``)."""
        self._run: Run | None = None
        self.observed = len(writer.events)
        """Events before this index were there at open or were shown to ``on_event`` hooks."""
        self.live_dir = Path(writer.path).with_suffix(".live") if writer.path else None
        """Where the liveness guards of running executions are kept (none for memory stores)."""
        self.compaction_failures = 0
        """Summaries rejected (or failed) in a row; nothing of them is on disk."""
        self.auto_compact_off = False
        """Auto-compaction stopped after three failures in a row (``/compact`` still works)."""
        from kiso.runtime.context import MessageSizes

        self.message_sizes = MessageSizes()
        """The projection's estimated size, kept as it grows (context relief measures it)."""
        self._call_ids: set[str] | None = None  # built on first use, then kept as turns stage
        if mode is not None:
            self.set_mode(mode)
        if system_prompt is not None and system_prompt != self._fold.system_prompt:
            self.append(
                SettingChanged(key=SYSTEM_PROMPT_KEY, value=system_prompt, run=self._fold.open_run)
            )

    # ------------------------------------------------------------------ the log

    @property
    def id(self) -> str:
        return self._writer.id

    @property
    def events(self) -> Sequence[Event]:
        return self._writer.events

    @property
    def next_seq(self) -> int:
        return self._writer.next_seq

    @property
    def writer(self) -> SessionWriter:
        return self._writer

    @property
    def fold(self) -> Replay:
        """The live fold of the log, fed with every append: pending calls, messages, state."""
        return self._fold

    @property
    def messages(self) -> list[Message]:
        """What the model would be shown now (the projection of the log)."""
        return list(self._fold.messages)

    @property
    def state(self) -> SessionState:
        return session_state(self._fold)

    def stage(self, *events: Event) -> tuple[Event, ...]:
        """Add events to the log's next batch (not yet durable: see :meth:`committed`)."""
        staged = self._writer.stage(*events)
        self._fold.feed(staged)
        if self._call_ids is not None:
            for event in staged:
                if isinstance(event, Assistant):
                    self._call_ids.update(c.call_id for c in event.calls)
        return staged

    @property
    def call_ids(self) -> set[str]:
        """Every call id a turn of this session declared. A new turn's ids must repeat none:
        a tool keyed by its call id (``delegate``'s children) would otherwise take a later call
        for an earlier one, and a provider that omits ids repeats them across turns."""
        if self._call_ids is None:
            self._call_ids = {
                c.call_id for e in self.events if isinstance(e, Assistant) for c in e.calls
            }
        return self._call_ids

    def append(self, *events: Event) -> tuple[Event, ...]:
        """Append durably (blocking): the events and everything staged before them."""
        staged = self.stage(*events)
        self._writer.commit()
        return staged

    async def committed(self) -> None:
        """Wait until everything staged is durable, without blocking the event loop."""
        await self._writer.committed()

    # ------------------------------------------------------------------ settings

    @property
    def system_prompt(self) -> str | None:
        """The system prompt in force: the one the log recorded, else the agent's (recorded
        with the first model request that sends it). A resumed session keeps its recorded
        prompt, so its requests stay byte-identical; open it with ``system_prompt=`` to change
        it (the change is recorded)."""
        recorded = self._fold.system_prompt
        return recorded if recorded is not None else self.agent.system_prompt

    def pin_system_prompt(self, run: str) -> str | None:
        """The system prompt for the next model request; the agent's is staged as the session's
        record first if the log has none yet (it becomes durable with the turn it produced)."""
        if self._fold.system_prompt is None and self.agent.system_prompt is not None:
            self.stage(
                SettingChanged(key=SYSTEM_PROMPT_KEY, value=self.agent.system_prompt, run=run)
            )
        return self.system_prompt

    @property
    def mode(self) -> str:
        """The approval mode in force: the one the log last recorded, else the agent's."""
        return self._fold.mode or self.agent.mode

    @mode.setter
    def mode(self, value: str) -> None:
        self.set_mode(value)

    def set_mode(self, mode: str) -> None:
        """Switch the approval mode; recorded (``setting_changed``) when it changes."""
        if check_mode(mode) != self.mode:
            self.append(SettingChanged(key="mode", value=mode, run=self._fold.open_run))

    def record_setting(self, key: str, value: Any) -> None:
        """Record a mid-session change (``/model``) as a durable fact."""
        if key == "mode":
            self.set_mode(value)
            return
        self.append(SettingChanged(key=key, value=value, run=self._fold.open_run))

    # ------------------------------------------------------------------ runs

    def run(
        self, prompt: str | Sequence[UserBlock], *, source: Source = "user"
    ) -> AsyncIterator[RunEvent]:
        """Start a run with ``prompt`` and carry it until it ends or needs a human.

        Nothing happens until the iterator is iterated: the run (``run_started`` and the
        ``user`` input) is recorded when it starts.
        """
        content = prompt if isinstance(prompt, str) else tuple(prompt)
        return drive(self, lambda: self._start(content, source))

    def _start(self, content: str | tuple[UserBlock, ...], source: Source) -> Outcome | None:
        """Open a run. The ``on_user_message`` hooks see a person's prompt first: the ``user``
        record holds their rewrite; a veto records the run with no ``user`` input and returns
        the outcome it ends with."""
        if self._fold.open_run is not None:
            raise UsageError(
                f"session {self.id} has a run that did not end ({self.state.value}); "
                f"call resume() to finish it before starting another"
            )
        _check_prompt_fits(content, self.agent)
        run = new_id()
        adapter = self.agent.adapter
        said = self._user_message(run, content) if source == "user" else content
        started = RunStarted(
            run=run,
            trigger=self.agent.trigger,
            model=ModelRef(adapter.provider, adapter.model, self.agent.profile),
            mode=self.mode,
        )
        if isinstance(said, Veto):
            self.stage(started)
            return Outcome.error(
                "vetoed", f"the {said.by} hook vetoed the prompt: {said.reason}", retryable=False
            )
        self.stage(started, User(run=run, content=said, source=source))
        return None

    def _user_message(
        self, run: str, content: str | tuple[UserBlock, ...]
    ) -> str | tuple[UserBlock, ...] | Veto:
        hooks = self.agent.hooks
        if not hooks.by_point["on_user_message"]:
            return content
        info = RunInfo(self.id, run, self.agent.workspace, self.mode)
        if isinstance(content, str):
            return hooks.on_user_message(content, info)
        blocks: list[UserBlock] = []
        for block in content:  # each text block of a prompt with attachments
            if isinstance(block, TextBlock):
                said = hooks.on_user_message(block.text, info)
                if isinstance(said, Veto):
                    return said
                blocks.append(TextBlock(said))
            else:
                blocks.append(block)
        return tuple(blocks)

    def compact(self, focus: str | None = None) -> AsyncIterator[RunEvent]:
        """Summarize the history now (``/compact [focus]``): yields ``compaction`` once the
        ``compacted`` record is durable, or ``compaction_failed`` (nothing written). Refused
        while a run is being carried, and while a question waits for its answer."""
        if self._run is not None:
            raise UsageError(f"session {self.id} is running a turn; compact once it is done")
        if self._fold.turn is not None:
            raise UsageError(
                f"session {self.id} has a turn waiting for answers ({self.state.value}); answer "
                f"it (or resume) before compacting"
            )
        from kiso.runtime.compaction import compact, last_run

        run = self._fold.open_run or last_run(self.events)
        if run is None:
            raise UsageError(f"session {self.id} has no history to compact yet")
        return compact(self, run, trigger="manual", focus=focus)

    def run_info(self, run_id: str) -> RunInfo:
        return RunInfo(self.id, run_id, self.agent.workspace, self.mode)

    def resume(self) -> AsyncIterator[RunEvent]:
        """Carry the open run forward from its durable prefix (nothing happens if none is open).

        Uncertain executions of read-only or idempotent tools are re-run without asking; others
        are yielded as ``uncertain`` for :meth:`resolve`.
        """
        return drive(self)

    def run_sync(self, prompt: str | Sequence[UserBlock]) -> Generator[RunEvent, None, None]:
        """:meth:`run` for synchronous code (it runs its own event loop)."""
        return _sync(self.run(prompt))

    def resume_sync(self) -> Generator[RunEvent, None, None]:
        return _sync(self.resume())

    def abort(self, by: str = "user") -> None:
        """Stop the current run at the next boundary: a running tool is cancelled (a shell's
        process group is killed) and the run ends ``aborted``. Safe to call from any thread."""
        run = self._run
        if run is not None:
            run.abort.set(by)

    # ------------------------------------------------------------------ answers

    def _pending_call(self, call_id: str) -> tuple[str, CallState]:
        state = self._fold
        run = state.open_run
        for cs in state.turn or ():
            if cs.call.call_id == call_id and run is not None:
                if cs.status in (CallStatus.AWAITING_APPROVAL, CallStatus.UNDECIDED):
                    return run, cs
                raise UsageError(f"call {call_id} is already {cs.status}; nothing to approve")
        raise UsageError(f"no call {call_id!r} is waiting for approval in session {self.id}")

    def offer(self, call_id: str) -> Offer:
        """What an approval of this pending call may offer (the runtime's one decision)."""
        _, cs = self._pending_call(call_id)
        return self.agent.offer(cs.call)

    def approve(
        self,
        call_id: str,
        *,
        always: bool = False,
        every_project: bool = False,
        reason: str | None = None,
    ) -> None:
        """Approve a pending call. ``always`` also writes a "don't ask again" rule for it, in
        force only in this session's project (the git root of the workspace, else the
        workspace); ``every_project`` (with ``always``) writes it for every project instead. A
        call no rule may cover (an irreversible delete, a compound command...) is refused."""
        if every_project and not always:
            raise UsageError("every_project=True writes a rule: pass it with always=True")
        run, cs = self._pending_call(call_id)
        rule = None
        if always:
            offer = self.agent.offer(cs.call)
            if offer.rule is None:
                raise RefusedError(
                    f"no 'don't ask again' rule is offered for this {cs.call.name} call: "
                    f"{offer.no_rule_because or 'no rule can cover it'}. Approve it once instead."
                )
            from kiso.runtime.rules import project_of

            here = offer.project or project_of(self.agent.workspace)
            self.agent.rules.add(offer.rule, project=None if every_project else here)
            rule = offer.rule.text
        self.append(
            ApprovalDecided(
                run=run,
                call_id=call_id,
                decision="approved",
                decided_by="user",
                reason=reason,
                input_sha256=input_sha256(cs.call.input),
                rule=rule,
            )
        )

    def deny(self, call_id: str, reason: str | None = None) -> None:
        run, cs = self._pending_call(call_id)
        self.append(
            ApprovalDecided(
                run=run,
                call_id=call_id,
                decision="denied",
                decided_by="user",
                reason=reason or "the user denied this call",
                input_sha256=input_sha256(cs.call.input),
            )
        )

    def uncertain_executions(self) -> list[Uncertain]:
        """Executions of the open run that started and never reported."""
        state = self._fold
        action = plan_replay(state, rerunnable=self.agent.rerunnable)
        return list(action.executions) if isinstance(action, ResolveUncertain) else []

    def may_be_running(self, execution_id: str) -> bool:
        """Whether processes an uncertain execution started may still be alive (its liveness
        guard is still held by one of them)."""
        if self.live_dir is None:
            return False
        from kiso.runtime.liveness import may_be_running

        return may_be_running(self.live_dir, execution_id)

    def resolve(
        self, execution_id: str, resolution: Ruling | str, *, wait: float = RULING_WAIT_S
    ) -> None:
        """Rule on an uncertain execution: ``rerun`` it now, it was ``skipped`` (treat as not
        applied), or it was ``applied`` (a human checked).

        If processes the execution started may still be running, the ruling waits up to
        ``wait`` seconds for them to go, then refuses: nobody can know yet whether it applied.
        """
        ruling = parse_ruling(str(resolution))
        pending = {u.execution_id: u for u in self.uncertain_executions()}
        if execution_id not in pending:
            raise UsageError(
                f"execution {execution_id!r} is not uncertain in session {self.id} "
                f"(uncertain: {', '.join(pending) or 'none'})"
            )
        if self.live_dir is not None and self.may_be_running(execution_id):
            from kiso.runtime.liveness import wait_until_gone

            if not wait_until_gone(self.live_dir, execution_id, wait):
                raise RefusedError(
                    f"execution {execution_id} ({pending[execution_id].name}) may still be "
                    f"running: processes it started hold its liveness guard. Wait for them to "
                    f"finish (or stop them), then rule again; until then nobody can tell "
                    f"whether it applied."
                )
        run = self._fold.open_run
        assert run is not None
        self.append(
            ExecutionResolved(
                run=run,
                execution_id=execution_id,
                call_id=pending[execution_id].call_id,
                resolution=ruling.value,
                decided_by="user",
            )
        )

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Make what is staged durable and release the session's writer lock."""
        self._writer.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PromptTooLargeError(UsageError):
    """A prompt that alone exceeds the model's whole context window: refused before anything
    is recorded, so the session is not left with an input no request can carry."""


def check_prompt_fits(content: str | Sequence[UserBlock], agent: Agent) -> None:
    """Refuse (:class:`PromptTooLargeError`) a prompt that alone exceeds the model's window;
    edges call it before they open or create a session, so a refusal leaves nothing behind."""
    _check_prompt_fits(content if isinstance(content, str) else tuple(content), agent)


def _check_prompt_fits(content: str | tuple[UserBlock, ...], agent: Agent) -> None:
    from kiso.runtime.context import message_tokens

    blocks = (TextBlock(content),) if isinstance(content, str) else content
    tokens = message_tokens(UserMessage(blocks))
    window = agent.window.current()
    if tokens > window.tokens:
        change = "" if window.says_how_to_change else f" ({window.how_to_change})"
        raise PromptTooLargeError(
            f"the prompt is ~{tokens:,} tokens, more than the model's whole context window of "
            f"{window.describe()}; nothing was recorded. Shorten it or attach less, or use a "
            f"model with a larger window{change}"
        )


def _sync(agen: AsyncIterator[RunEvent]) -> Generator[RunEvent, None, None]:
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        try:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                loop.run_until_complete(aclose())
        finally:
            _shutdown(loop)


def _shutdown(loop: asyncio.AbstractEventLoop) -> None:
    """Close ``loop`` as ``asyncio.run`` does: cancel what is still pending, finish the async
    generators (an SDK's stream readers), then close it, so nothing is left to be destroyed
    pending."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()
