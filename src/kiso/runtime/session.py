"""A durable conversation: ``run`` a prompt, answer questions, ``resume`` after anything.

A :class:`Session` holds its log's writer lock for as long as it is open. Everything it knows is
read from the log: the model's messages, the pending questions, the uncertain executions. Answers
(``approve``, ``deny``, ``resolve``) are written to the log (fsynced) the moment they are given,
whether or not a run is iterating, so an answer given just before a crash is never lost, and the
next ``resume`` carries the run forward from exactly there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from kiso.kernel import (
    ApprovalDecided,
    Event,
    ExecutionResolved,
    KisoError,
    Message,
    ModelRef,
    ResolveUncertain,
    RunStarted,
    SessionState,
    SessionWriter,
    Uncertain,
    User,
    input_sha256,
    new_id,
    replay,
    session_state,
)
from kiso.kernel.events import Source, UserBlock
from kiso.kernel.recovery import plan_replay
from kiso.kernel.replay import CallState, CallStatus, Replay
from kiso.runtime.failpoint import Failpoint
from kiso.runtime.loop import drive
from kiso.runtime.rules import rule_for
from kiso.runtime.stream import RunEvent

if TYPE_CHECKING:
    from kiso.runtime.agent import Agent

__all__ = ["Session"]


class Session:
    def __init__(self, agent: Agent, writer: SessionWriter) -> None:
        self.agent = agent
        self._writer = writer
        self._fold = replay(writer.events)
        self._failpoint = Failpoint.from_env()
        self.abort_requested: str | None = None
        self._aborts: set[Any] = set()
        self.last_model_ms = 0.0
        self.child_env: Mapping[str, str] = {}
        self.mode = agent.mode

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

    def append(self, *events: Event) -> tuple[Event, ...]:
        """Append durably; the failpoint (``KISO_FAILPOINT``) may kill the process right after."""
        written = self._writer.append(*events)
        self._fold.feed(written)
        self._failpoint.after_append(e.type for e in written)
        return written

    # ------------------------------------------------------------------ runs

    async def run(
        self, prompt: str | Sequence[UserBlock], *, source: Source = "user"
    ) -> AsyncIterator[RunEvent]:
        """Start a run with ``prompt`` and carry it until it ends or needs a human."""
        if self._fold.open_run is not None:
            raise KisoError(
                f"session {self.id} has a run that did not end ({self.state.value}); "
                f"call resume() to finish it before starting another"
            )
        self.abort_requested = None
        run = new_id()
        adapter = self.agent.adapter
        content = prompt if isinstance(prompt, str) else tuple(prompt)
        self.append(
            RunStarted(
                run=run,
                trigger=self.agent.trigger,
                model=ModelRef(adapter.provider, adapter.model, self.agent.profile),
                mode=self.mode,
            ),
            User(run=run, content=content, source=source),
        )
        async for event in drive(self):
            yield event

    async def resume(self) -> AsyncIterator[RunEvent]:
        """Carry the open run forward from its durable prefix (nothing happens if none is open).

        Uncertain executions of read-only or idempotent tools are re-run without asking; others
        are yielded as ``uncertain`` for :meth:`resolve`.
        """
        self.abort_requested = None
        async for event in drive(self):
            yield event

    def run_sync(self, prompt: str | Sequence[UserBlock]) -> Iterator[RunEvent]:
        """:meth:`run` for synchronous code (it runs its own event loop)."""
        return _sync(self.run(prompt))

    def resume_sync(self) -> Iterator[RunEvent]:
        return _sync(self.resume())

    def abort(self, by: str = "user") -> None:
        """Stop the current run at the next boundary: a running tool is cancelled (a shell's
        process group is killed) and the run ends ``aborted``. Safe to call from any thread."""
        self.abort_requested = by
        for signal in list(self._aborts):
            signal.set(by)

    # ------------------------------------------------------------------ answers

    def _pending_call(self, call_id: str) -> tuple[str, CallState]:
        state = self._fold
        run = state.open_run
        for cs in state.turn or ():
            if cs.call.call_id == call_id and run is not None:
                if cs.status in (CallStatus.AWAITING_APPROVAL, CallStatus.UNDECIDED):
                    return run, cs
                raise KisoError(f"call {call_id} is already {cs.status}; nothing to approve")
        raise KisoError(f"no call {call_id!r} is waiting for approval in session {self.id}")

    def approve(self, call_id: str, *, always: bool = False, reason: str | None = None) -> None:
        """Approve a pending call. ``always`` also writes a "don't ask again" rule for it."""
        run, cs = self._pending_call(call_id)
        rule = None
        if always:
            tool = self.agent.tool(cs.call.name)
            candidate = rule_for(cs.call, tool, self.agent.workspace)
            if candidate is None:
                raise KisoError(
                    f"no 'don't ask again' rule can cover this {cs.call.name} call (destructive "
                    f"commands, compound commands and paths under .git/ or .kiso/ always ask)"
                )
            self.agent.rules.add(candidate)
            rule = candidate.text
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

    def resolve(
        self, execution_id: str, resolution: Literal["rerun", "skipped", "applied"]
    ) -> None:
        """Rule on an uncertain execution: ``rerun`` it now, it was ``skipped`` (treat as not
        applied), or it was ``applied`` (a human checked)."""
        if resolution not in ("rerun", "skipped", "applied"):
            raise KisoError(f"resolution must be rerun, skipped or applied, not {resolution!r}")
        pending = {u.execution_id: u for u in self.uncertain_executions()}
        if execution_id not in pending:
            raise KisoError(
                f"execution {execution_id!r} is not uncertain in session {self.id} "
                f"(uncertain: {', '.join(pending) or 'none'})"
            )
        run = self._fold.open_run
        assert run is not None
        self.append(
            ExecutionResolved(
                run=run,
                execution_id=execution_id,
                call_id=pending[execution_id].call_id,
                resolution=resolution,
                decided_by="user",
            )
        )

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Release the session's writer lock."""
        self._writer.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sync(agen: AsyncIterator[RunEvent]) -> Iterator[RunEvent]:
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            loop.run_until_complete(aclose())
        loop.close()
