"""The loop: the one place that knows the turn order.

call the model -> commit the turn -> decide approvals -> execute -> record -> repeat

Each step starts from :func:`kiso.kernel.plan` over the log, so a fresh run and a resumed one
are the same code: after a crash the loop simply finds itself at whatever step the log says.

Records are staged into the log as they happen and made durable where DURABILITY.md's write order
needs them (the fsync budget, docs/adr/0012-the-fsync-budget.md):

* before a handler with side effects runs, its turn, its verdict and its ``execution_started``
  are durable: one batch, one fsync;
* its receipt is durable before anything can depend on it (the next model request, the
  ``tool_end`` a caller sees): the second fsync of the round;
* a read-only or idempotent call's batch is handed to the writer without waiting (a crash re-runs
  it, which is harmless) and its receipt rides in the next turn's batch: one fsync a round;
* a question (``approval_requested``, the uncertain executions) and ``run_ended`` are durable
  before they are yielded; a human's answer is durable before the loop goes on.

The ``assistant`` record is staged only after the provider's stream ended cleanly with exactly one
stop. A :class:`Run` holds what one pass of the loop needs (its abort signal, the children's
environment, timings): nothing is kept on the session between runs but the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence, Set
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiso.kernel import (
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    AwaitApproval,
    CallModel,
    Decide,
    EndRun,
    Event,
    Execute,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    Idle,
    InvalidEventError,
    KisoError,
    Outcome,
    ResolveUncertain,
    RunEnded,
    StoreError,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    UsageError,
    billed,
    input_sha256,
)
from kiso.kernel.errors import describe_os_error
from kiso.kernel.events import ERROR_KINDS, AssistantBlock
from kiso.kernel.recovery import plan_replay
from kiso.providers.base import ModelRequest, ProviderError, TextDelta, ThinkingDelta, TurnDone
from kiso.runtime import stream as ev
from kiso.runtime.approvals import allowing_modes, compose
from kiso.runtime.compaction import compact, maybe_compact
from kiso.runtime.context import message_tokens, parse_window
from kiso.runtime.hooks import CallContext, HookFailed, RunInfo, Verdict
from kiso.runtime.liveness import LivenessGuard, guard_path
from kiso.tools.base import AbortSignal, Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from kiso.runtime.session import Session

__all__ = ["Run", "drive"]

PARALLEL_READS = 4


class _Aborted(Exception):
    pass


class Run:
    """One pass of the loop over a session's open run: what it needs while it goes."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.agent = session.agent
        self.abort = AbortSignal()
        self.model_ms = 0.0
        self.seen = len(session.events)
        """Events before this index have been reported (or were there before the run)."""
        self.ended: tuple[str, Outcome] | None = None
        """The run and its outcome, once ``run_ended`` is durable."""
        self._spent: float | None = 0.0
        self._priced = 0

    def cost(self, run_id: str) -> float | None:
        """Dollars the model requests of run ``run_id`` cost so far (its turns and compaction
        summaries), or None once one of them has no known cost."""
        from kiso.providers.registry import cost

        events = self.session.events
        mine = [e for e in events[self._priced :] if getattr(e, "run", None) == run_id]
        self._priced = len(events)
        for model, usage in billed(mine):
            paid = cost(model, usage)
            self._spent = None if paid is None or self._spent is None else self._spent + paid
        return self._spent

    @functools.cached_property
    def child_env(self) -> Mapping[str, str]:
        """The environment for the run's children, taken when its first tool starts (a run that
        runs no tool never computes it)."""
        return self.agent.child_env()

    def info(self, run_id: str) -> RunInfo:
        s = self.session
        return RunInfo(s.id, run_id, self.agent.workspace, s.mode)


async def drive(
    session: Session, start: Callable[[], Outcome | None] | None = None
) -> AsyncIterator[ev.RunEvent]:
    """Carry the session's open run forward until it ends or needs a human (``start``, when
    given, first opens a new run; the outcome it returns ends that run at once: a veto)."""
    if session._run is not None:
        raise UsageError(f"session {session.id} is already running; one run at a time")
    vetoed = start() if start is not None else None
    run = Run(session)
    session._run = run
    agent = run.agent
    try:
        if start is not None and vetoed is None and agent.trigger != "api":
            # A person's (or a parent's) prompt is on disk before the model is asked: a kill in
            # the first model call leaves an open run that resume carries on, not a lost prompt.
            # One fsync a run. A server's runs ("api") keep their admission's own durability.
            await session.committed()
        if vetoed is not None and (opened := session.fold.open_run) is not None:
            yield await _end(run, opened, vetoed)
        while True:
            state = session.fold
            run_id = state.open_run
            if run_id is None:
                break
            if run.abort.is_set():
                yield await _end(run, run_id, Outcome.aborted(run.abort.reason or "user"))
                break
            action = plan_replay(state, rerunnable=agent.rerunnable)
            if isinstance(action, Idle):
                break
            try:
                _observe(run)
                if isinstance(action, CallModel):
                    if state.run_turns >= agent.max_turns:
                        yield await _end(run, run_id, Outcome("max_turns"))
                        break
                    spent = _over_budget(run, run_id)
                    if spent is not None:
                        yield await _end(run, run_id, spent)
                        break
                    await asyncio.sleep(0)  # a step boundary: other sessions and timers run
                    async for item in maybe_compact(session, run_id, run.abort):
                        yield item
                    run.seen = len(session.events)
                    outcome: list[Outcome] = []
                    async for item in _call_model(run, run_id, outcome):
                        yield item
                    if outcome:
                        yield await _end(run, run_id, outcome[0])
                        break
                elif isinstance(action, Decide):
                    for call in action.calls:
                        event = _decide(run, run_id, call)
                        if isinstance(event, ApprovalDecided):
                            yield ev.Decision(event, call)
                    run.seen = len(session.events)
                elif isinstance(action, Execute):
                    async for item in _execute(run, run_id, action.calls):
                        yield item
                elif isinstance(action, AwaitApproval):
                    async for item in _ask(run, run_id, action):
                        yield item
                    if _still(run, AwaitApproval):
                        yield ev.Paused("awaiting_approval")
                        break
                elif isinstance(action, ResolveUncertain):
                    asked = False
                    async for item in _uncertain(run, run_id, action):
                        asked = asked or isinstance(item, ev.UncertainPending)
                        yield item
                    if asked and _still(run, ResolveUncertain):
                        yield ev.Paused("uncertain")
                        break
                elif isinstance(action, EndRun):
                    yield await _end(run, run_id, action.outcome)
                    break
            except HookFailed as exc:
                failed = Outcome.error("hook_failed", str(exc), retryable=False)
                yield await _end(run, run_id, failed)
                break
    finally:
        session._run = None
        with contextlib.suppress(KisoError):
            session.writer.flush()  # what is staged (read-only receipts) goes to disk soon
    if run.ended is not None:  # after the terminal event: the outcome on disk cannot change
        ended_run, ended = run.ended
        _observe(run, ended_run)
        agent.hooks.on_run_end(ended, run.info(ended_run))


def _over_budget(run: Run, run_id: str) -> Outcome | None:
    """``budget`` once the run's cost reaches ``agent.max_budget_usd`` (between turns, never
    mid-tool); an error when a turn's cost cannot be known, since the budget cannot be kept."""
    limit = run.agent.max_budget_usd
    if limit is None:
        return None
    spent = run.cost(run_id)
    if spent is None:
        return Outcome.error(
            "cost_unknown",
            "the run's cost cannot be known (a model turn came without token counts or with a "
            "model that has no price), so --max-budget-usd cannot be kept; the run was stopped",
        )
    return Outcome("budget") if spent >= limit else None


def _observe(run: Run, run_id: str | None = None) -> None:
    """Show the ``on_event`` hooks every event made durable since they last looked."""
    session = run.session
    hooks = run.agent.hooks
    if not hooks.by_point["on_event"]:
        return
    events = session.events
    durable = session.writer.durable_seq
    current = run_id or session.fold.open_run or ""
    while session.observed < len(events) and events[session.observed].seq <= durable:
        event = events[session.observed]
        session.observed += 1
        hooks.on_event(event, run.info(getattr(event, "run", None) or current))


async def _ask(run: Run, run_id: str, action: AwaitApproval) -> AsyncIterator[ev.RunEvent]:
    """Put the persisted questions to a person (or, headless, deny them) and report answers."""
    session, agent = run.session, run.agent
    calls = {cs.call.call_id: cs.call for cs in session.fold.turn or ()}
    for request in action.requests:
        calls.setdefault(request.call_id, ToolCall(request.call_id, request.name, request.input))
    if session.headless:  # a question an earlier, interactive run left: nobody here to answer
        for request in action.requests:
            call = calls[request.call_id]
            yield ev.Decision(
                _record(run, run_id, call, Verdict("deny", "headless", _PENDING)), call
            )
        return
    await session.committed()  # the question is on disk before anyone sees it
    run.seen = len(session.events)
    for request in action.requests:
        call = calls[request.call_id]
        yield ev.ApprovalRequest(call, request, agent.offer(call))
    for item in _answers(run, calls):
        yield item


async def _uncertain(run: Run, run_id: str, action: ResolveUncertain) -> AsyncIterator[ev.RunEvent]:
    """Re-run what is rerunnable (ruled by ``policy:idempotent``); ask a person about the rest."""
    session = run.session
    auto = [u for u in action.executions if u.auto_rerun]
    if auto:
        rulings = session.stage(
            *(
                ExecutionResolved(
                    run=run_id,
                    execution_id=u.execution_id,
                    call_id=u.call_id,
                    resolution="rerun",
                    decided_by="policy:idempotent",
                )
                for u in auto
            )
        )
        run.seen = len(session.events)
        for ruling in rulings:
            assert isinstance(ruling, ExecutionResolved)
            yield ev.Ruling(ruling)
        return
    await session.committed()
    running = frozenset(
        u.execution_id for u in action.executions if session.may_be_running(u.execution_id)
    )
    run.seen = len(session.events)
    yield ev.UncertainPending(action.executions, running)
    for item in _answers(run, {}):
        yield item


def _answers(run: Run, calls: dict[str, ToolCall]) -> list[ev.RunEvent]:
    """The verdicts and rulings a person gave while the loop was waiting at a question."""
    events = run.session.events
    found: list[ev.RunEvent] = []
    for event in events[run.seen :]:
        if isinstance(event, ApprovalDecided):
            found.append(ev.Decision(event, calls.get(event.call_id)))
        elif isinstance(event, ExecutionResolved):
            found.append(ev.Ruling(event))
    run.seen = len(events)
    return found


def _still(run: Run, kind: type) -> bool:
    """After a question was yielded: is the same kind of question still open?"""
    action = plan_replay(run.session.fold, rerunnable=run.agent.rerunnable)
    return isinstance(action, kind)


async def _end(run: Run, run_id: str, outcome: Outcome) -> ev.Terminal:
    session = run.session
    session.stage(RunEnded(run=run_id, outcome=outcome))
    await session.committed()
    run.seen = len(session.events)
    run.ended = (run_id, outcome)
    return ev.Terminal(outcome)


# --------------------------------------------------------------------------- approvals


def _verdict(run: Run, run_id: str, call: ToolCall) -> Verdict:
    """What the runtime, the schema and the approval chain say about ``call`` now (pure: no
    record is written). In a headless session an ask becomes a denial by ``headless``."""
    session, agent = run.session, run.agent
    tool = agent.tool(call.name)
    if tool is None:
        names = ", ".join(sorted(agent.tools)) or "none"
        return Verdict("deny", "runtime", f"there is no tool named {call.name!r} (tools: {names})")
    problem = agent.input_problem(tool, call.input)
    if problem is not None:
        return Verdict("deny", "schema", f"invalid input for {call.name}: {problem}")
    mode = session.mode
    ctx = CallContext(call, tool, agent.workspace, agent.home, mode, session.id, run_id)
    chain = agent.hooks.tool_hooks
    verdict = compose(chain, ctx, unattended=mode == "dontAsk")
    if verdict.decision == "ask" and session.headless:
        reason = _headless_reason(allowing_modes(chain, ctx))
        if verdict.reason and verdict.by.startswith("hook:"):  # a command hook says why
            reason = f"{reason} ({verdict.by} asked: {verdict.reason})"
        elif verdict.by.startswith(("permissions:", "sandbox")):  # a rule always asks
            reason = f"{reason} ({verdict.by} asks about it every time)"
        return Verdict("deny", "headless", reason)
    return verdict


def _decide(run: Run, run_id: str, call: ToolCall) -> Event:
    """Stage this call's verdict (or the question to a human) in the log's next batch."""
    verdict = _verdict(run, run_id, call)
    if verdict.decision == "ask":
        (event,) = run.session.stage(
            ApprovalRequested(
                run=run_id,
                call_id=call.call_id,
                name=call.name,
                input=call.input,
                speaker=verdict.by,
            )
        )
        return event
    return _record(run, run_id, call, verdict)


def _record(run: Run, run_id: str, call: ToolCall, verdict: Verdict) -> ApprovalDecided:
    (event,) = run.session.stage(
        ApprovalDecided(
            run=run_id,
            call_id=call.call_id,
            decision="approved" if verdict.decision == "allow" else "denied",
            decided_by=verdict.by,
            reason=verdict.reason,
            input_sha256=input_sha256(call.input),
            rule=verdict.rule,
        )
    )
    run.seen = len(run.session.events)
    assert isinstance(event, ApprovalDecided)
    return event


_PENDING = (
    "this call was waiting for a person's answer, and nobody can answer in a headless run; a "
    "question once asked is put again, not re-decided, so resume the session on a terminal to "
    "answer it"
)


def _headless_reason(modes: Sequence[str]) -> str:
    said = "nobody can approve this call in a headless run"
    if not modes:
        return f"{said}, and no approval mode would allow it; do it in an interactive session"
    named = " or ".join(modes)
    return (
        f"{said}; it would run without asking in mode {named} (start the run in that mode), "
        f"or approve it in an interactive session"
    )


# --------------------------------------------------------------------------- execution


def _first_batch(calls: Sequence[ToolCall], run: Run) -> list[ToolCall]:
    """The calls to run now: consecutive read-only calls together (at most four), else one."""

    def parallel(call: ToolCall) -> bool:
        tool = run.agent.tool(call.name)
        return tool is not None and tool.parallel_safe

    batch = [calls[0]]
    if parallel(calls[0]):
        for call in calls[1:]:
            if not parallel(call) or len(batch) == PARALLEL_READS:
                break
            batch.append(call)
    return batch


async def _execute(run: Run, run_id: str, calls: Sequence[ToolCall]) -> AsyncIterator[ev.RunEvent]:
    """Start a batch of calls, run their handlers, record their receipts.

    A call with effects runs alone, after its turn, verdict and start are durable; its receipt is
    durable before its ``tool_end``. Read-only calls (up to four, in parallel) start with their
    batch merely handed to the writer, and their receipts ride in the next batch.
    """
    session, agent = run.session, run.agent
    batch = _first_batch(calls, run)  # then re-plan: aborts are checked between batches
    tools = [agent.tool(call.name) for call in batch]
    effects = any(tool is None or not tool.rerunnable for tool in tools)
    first = session.next_seq
    ids = [f"{session.id}:{first + i}" for i in range(len(batch))]
    # The guards first: a store that cannot hold them stops the run before anything starts.
    guards = await _hold_guards(run, batch, tools, ids) if effects else [None] * len(batch)
    try:
        async for item in _started(
            run, run_id, batch, tools, ids=ids, guards=guards, effects=effects
        ):
            yield item
    finally:
        _release(guards)  # a guard no handler released: its start failed, or it never began


async def _started(
    run: Run,
    run_id: str,
    batch: Sequence[ToolCall],
    tools: Sequence[Tool | None],
    *,
    ids: Sequence[str],
    guards: Sequence[LivenessGuard | None],
    effects: bool,
) -> AsyncIterator[ev.RunEvent]:
    """The batch's starts staged (and durable when it has effects), its handlers run."""
    session = run.session
    starts = session.stage(
        *(
            ExecutionStarted(
                run=run_id,
                execution_id=ids[i],
                call_id=call.call_id,
                name=call.name,
                input=call.input,
            )
            for i, call in enumerate(batch)
        )
    )
    if effects:
        await session.committed()  # the turn, its verdict and this start: one fsync
    else:
        session.writer.flush()  # on its way to disk; nothing waits for it
    run.seen = len(session.events)
    for call, started in zip(batch, starts, strict=True):
        assert isinstance(started, ExecutionStarted)
        yield ev.ToolStart(call, started)
    queue: asyncio.Queue[ev.RunEvent | None] = asyncio.Queue()
    tasks = [
        asyncio.ensure_future(
            _run_one(
                run,
                run_id,
                call,
                tool,
                started=started,  # type: ignore[arg-type]
                durable=effects,
                guard=g,
                queue=queue,
            )
        )
        for call, tool, started, g in zip(batch, tools, starts, guards, strict=True)
    ]
    remaining = len(tasks)
    try:
        while remaining:
            got = await queue.get()
            if got is None:
                remaining -= 1
            else:
                yield got
    finally:
        running = [task for task in tasks if not task.done()]
        for task in running:  # the consumer went away, or the batch was cancelled
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    for task in tasks:  # each put its None last, so each is done
        if not task.cancelled() and (exc := task.exception()) is not None:
            raise exc


async def _run_one(
    run: Run,
    run_id: str,
    call: ToolCall,
    tool: Tool | None,
    *,
    started: ExecutionStarted,
    durable: bool,
    guard: LivenessGuard | None,
    queue: asyncio.Queue[ev.RunEvent | None],
) -> None:
    """One handler: its live output, its receipt (durable first if it has effects), its end.
    ``guard``: the execution's liveness guard, held when it has effects (and a log on disk)."""
    session = run.session
    try:
        began = time.monotonic()
        if tool is None:
            result = ToolResult(
                f"the tool {call.name!r} is not available in this agent any more; nothing ran",
                is_error=True,
                error_kind="fatal",
            )
        else:
            try:
                result = await _handler(run, call, tool, started=started, guard=guard, queue=queue)
            finally:
                if guard is not None and guard.held:
                    await asyncio.to_thread(_release, [guard])  # file I/O: off the loop
            try:
                if run.agent.hooks.by_point["after_tool"]:
                    result = run.agent.hooks.after_tool(call, result, run.info(run_id))
            except HookFailed:
                _receipt(session, run_id, call, started=started, result=result, began=began)
                await session.committed()
                raise
        finished = _receipt(session, run_id, call, started=started, result=result, began=began)
        if durable:
            await session.committed()  # the receipt, before anything can act on it
        run.seen = len(session.events)
        await queue.put(ev.ToolEnd(call, finished))
    finally:
        await queue.put(None)


def _receipt(
    session: Session,
    run_id: str,
    call: ToolCall,
    *,
    started: ExecutionStarted,
    result: ToolResult,
    began: float,
) -> ExecutionFinished:
    """Stage the receipt of one execution."""
    kind = result.error_kind if result.error_kind in ERROR_KINDS else None
    if result.error_kind is not None and kind is None:
        kind = "fatal"  # a tool's own word for its failure; the log keeps to the closed set
    (finished,) = session.stage(
        ExecutionFinished(
            run=run_id,
            execution_id=started.execution_id,
            call_id=call.call_id,
            ok=kind != "fatal",
            content=result.content,
            is_error=result.is_error,
            ms=int((time.monotonic() - began) * 1000),
            error_kind=kind,  # type: ignore[arg-type]
            truncated=result.truncated,
        )
    )
    assert isinstance(finished, ExecutionFinished)
    return finished


async def _handler(
    run: Run,
    call: ToolCall,
    tool: Tool,
    *,
    started: ExecutionStarted,
    guard: LivenessGuard | None,
    queue: asyncio.Queue[ev.RunEvent | None],
) -> ToolResult:
    """Run the handler; what it reports through ``ctx.progress`` goes out as ``tool_output``."""
    ctx = ToolContext(
        workspace=run.agent.workspace,
        execution_id=started.execution_id,
        session_id=run.session.id,
        call_id=call.call_id,
        env=run.child_env,
        sandbox=run.agent.sandbox,
        abort=run.abort,
        progress=_forward_to(queue, call, started.execution_id),
        fds=(guard.fd,) if guard is not None else (),
    )
    try:
        return await tool.run(dict(call.input), ctx)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return ToolResult(
            f"the tool {call.name} failed: {type(exc).__name__}: {exc}",
            is_error=True,
            error_kind="fatal",
        )


def _forward_to(
    queue: asyncio.Queue[ev.RunEvent | None], call: ToolCall, execution_id: str
) -> Callable[[str], None]:
    """A ``progress`` callable from any thread: each chunk is queued on the running loop."""
    loop = asyncio.get_running_loop()

    def progress(text: str) -> None:
        if isinstance(text, str) and text:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is watching
                loop.call_soon_threadsafe(queue.put_nowait, ev.ToolOutput(call, execution_id, text))

    return progress


async def _hold_guards(
    run: Run, batch: Sequence[ToolCall], tools: Sequence[Tool | None], ids: Sequence[str]
) -> list[LivenessGuard | None]:
    """The liveness guards of a batch with effects, held before its ``execution_started`` is
    written (sessions on disk only; one for each call whose tool is there to run).

    A guard that cannot be written (a full disk under KISO_HOME) is the store's failure, not the
    tool's: nothing is left behind, the tool never runs, nothing is recorded for the call, and a
    StoreError naming the file system ends the run; ``kiso resume`` runs the call once there is
    space (its start was never written, so there is nothing to rule on).
    """
    directory = run.session.live_dir
    held: list[LivenessGuard | None] = []
    if directory is None:
        return [None] * len(batch)
    for call, tool, execution_id in zip(batch, tools, ids, strict=True):
        if tool is None:
            held.append(None)
            continue
        try:
            held.append(await asyncio.to_thread(LivenessGuard.hold, directory, execution_id))
        except OSError as exc:
            _release(held)
            raise _store_failed(run, call, directory, execution_id, exc) from exc
        except BaseException:
            _release(held)
            raise
    return held


def _release(guards: Sequence[LivenessGuard | None]) -> None:
    """Release the guards; a session's guard directory left empty goes too (nothing of the
    runtime's bookkeeping stays beside the log once its processes are gone)."""
    for guard in guards:
        if guard is not None and guard.held and guard.release():
            with contextlib.suppress(OSError):  # not empty: a process still holds a guard
                guard.path.parent.rmdir()


def _store_failed(
    run: Run, call: ToolCall, directory: Path, execution_id: str, exc: OSError
) -> StoreError:
    """The error that ends a run whose bookkeeping could not be written: the store's, by name."""
    home = getattr(run.agent.store, "home", None)
    where = f" at {home}" if isinstance(home, Path) else ""
    said = describe_os_error(guard_path(directory, execution_id), exc, "create the liveness guard")
    return StoreError(
        f"could not write the session store{where}: {said}. The {call.name} call was not "
        f"run and nothing was recorded for it; once the store can be written, "
        f"`kiso resume {run.session.id}` runs it"
    )


# --------------------------------------------------------------------------- the model


def _request(run: Run, run_id: str) -> ModelRequest:
    session, agent = run.session, run.agent
    state = session.fold
    request = ModelRequest(
        system=session.pin_system_prompt(run_id),
        messages=tuple(state.messages),
        tools=agent.tool_specs(),
        turn=state.turns,
    )
    if agent.hooks.by_point["before_model"]:
        request = agent.hooks.before_model(request, run.info(run_id))
    return request


async def _call_model(run: Run, run_id: str, failure: list[Outcome]) -> AsyncIterator[ev.RunEvent]:
    """Stream one turn with retries; stage it, or put the run's failure outcome in ``failure``.

    A ``context_overflow`` refusal lowers the window to what the endpoint named, compacts once
    and retries once; a second refusal ends the run, naming the request's size and the window."""
    session, agent = run.session, run.agent
    hooks = agent.hooks
    request = _request(run, run_id)
    attempt = 0
    relieved = False
    while True:
        attempt += 1
        try:
            done: TurnDone | None = None
            async for item in _stream(run, request):
                if isinstance(item, TurnDone):
                    done = item
                else:
                    yield item
            assert done is not None
            break
        except _Aborted:
            failure.append(Outcome.aborted(run.abort.reason or "user"))
            return
        except ProviderError as exc:
            if exc.code == "context_overflow":
                learned = parse_window(exc.message)
                if learned is not None:
                    agent.window.learn(learned)
                if not relieved:
                    relieved = True
                    compacted = False
                    async for relief in compact(session, run_id, trigger="auto", abort=run.abort):
                        compacted = compacted or isinstance(relief, ev.Compaction)
                        yield relief
                    run.seen = len(session.events)
                    if compacted:
                        request = _request(run, run_id)
                        attempt = 0
                        continue
                size = sum(message_tokens(m) for m in request.messages)
                message = (
                    f"{exc.message} (this request: ~{size:,} tokens of messages; the window: "
                    f"{agent.window.current().describe()})"
                )
                failure.append(Outcome.error(exc.code, message, retryable=False))
                return
            if not exc.retryable or attempt > agent.max_retries:
                failure.append(Outcome.error(exc.code, exc.message, retryable=exc.retryable))
                return
            delay = exc.retry_after or agent.retry_base_delay * 2 ** (attempt - 1)
            delay = min(delay, 30.0) * (1 + random.random() * 0.1)
            yield ev.Retry(attempt, delay, exc.message)
            await asyncio.sleep(delay)
    try:
        (committed,) = session.stage(
            Assistant(
                run=run_id,
                blocks=_unique_call_ids(
                    _encodable(done.blocks), session.call_ids, session.next_seq
                ),
                stop=done.stop,  # type: ignore[arg-type]
                usage=done.usage,
                model=done.model,
                ms=int(run.model_ms),
            )
        )
    except InvalidEventError as exc:  # a turn that could not be read back: nothing is staged
        failure.append(Outcome.error("invalid_turn", str(exc), retryable=False))
        return
    run.seen = len(session.events)
    assert isinstance(committed, Assistant)
    if hooks.by_point["after_turn"]:
        hooks.after_turn(committed, run.info(run_id))
    yield ev.ModelTurn(committed)


async def _stream(
    run: Run, request: ModelRequest
) -> AsyncIterator[ev.TextDelta | ev.ThinkingDelta | TurnDone]:
    """One attempt: deltas live; the TurnDone last, only if the stream ended right after it."""
    agent = run.agent
    began = time.monotonic()
    iterator = agent.adapter.stream(request).__aiter__()
    done: TurnDone | None = None
    watchdog = _Watchdog(agent.idle_timeout)
    try:
        while True:
            if run.abort.is_set():
                raise _Aborted
            try:
                # The watchdog covers the wait for the next item only, never the consumer's time.
                watchdog.waiting()
                item = await iterator.__anext__()
                watchdog.got()
            except StopAsyncIteration:
                break
            except asyncio.CancelledError:
                if not watchdog.fired():
                    raise
                raise ProviderError(
                    f"the model sent nothing for {agent.idle_timeout:g} s",
                    code="timeout",
                    retryable=True,
                ) from None
            if done is not None:
                raise ProviderError(
                    "the model's stream went on after its stop; the turn was not committed",
                    code="invalid_stream",
                    retryable=True,
                )
            if isinstance(item, TurnDone):
                done = item
            elif isinstance(item, TextDelta):
                yield ev.TextDelta(item.text)
            elif isinstance(item, ThinkingDelta):
                yield ev.ThinkingDelta(item.text)
    finally:
        watchdog.stop()
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
    if done is None:
        raise ProviderError(
            "the model's stream ended without a stop; the turn was not committed",
            code="incomplete_stream",
            retryable=True,
        )
    run.model_ms = (time.monotonic() - began) * 1000
    yield done


class _Watchdog:
    """Cancels the task waiting for the model's next item once it has waited ``timeout``
    seconds, like ``asyncio.timeout`` around each wait, but with one timer per stream instead
    of one per item: a wait only notes when it began, and the timer, when it fires early,
    sleeps again until the current wait would expire."""

    __slots__ = ("_cancelled", "_handle", "_loop", "_since", "_task", "_timeout")

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[Any] | None = None
        self._since: float | None = None
        self._cancelled = False
        self._handle: asyncio.TimerHandle | None = None

    def waiting(self) -> None:
        # The task that waits: not always the same one (a sync driver runs each step as its
        # own task).
        self._task = asyncio.current_task()
        self._since = now = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(now + self._timeout, self._check)

    def got(self) -> None:
        self._since = None

    def _check(self) -> None:
        since = self._since
        if since is None:  # the consumer has the item: look again a timeout from now
            self._handle = self._loop.call_at(self._loop.time() + self._timeout, self._check)
        elif self._loop.time() - since >= self._timeout and self._task is not None:
            self._handle = None
            self._cancelled = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(since + self._timeout, self._check)

    def fired(self) -> bool:
        """Whether the cancellation being handled is the watchdog's own (then it is taken back
        and the wait counts as a timeout); False for a cancellation from outside."""
        if not self._cancelled or self._task is None:
            return False
        self._cancelled = False
        return self._task.uncancel() == 0

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: str) -> str:
    return value if value.isascii() else _SURROGATE.sub("\ufffd", value)


def _value(value: Any) -> Any:
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_text(k) if isinstance(k, str) else k: _value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value


def _encodable(blocks: tuple[AssistantBlock, ...]) -> tuple[AssistantBlock, ...]:
    """A turn the log can hold: a lone surrogate (``"\\ud800"`` is valid JSON, but no UTF-8
    spells it) that a provider put in text or in a call's arguments becomes U+FFFD, instead of
    an invalid record that ends the run. Blocks without one are returned as they are."""
    return tuple(_encodable_block(block) for block in blocks)


def _encodable_block(block: AssistantBlock) -> AssistantBlock:
    if isinstance(block, ToolCall):
        try:
            fixed, name = _value(block.input), _text(block.name)
        except RecursionError:  # nested past any sense: the log refuses it, and the run ends
            return block
        if fixed != block.input or name != block.name:
            return ToolCall(block.call_id, name, fixed)
    elif isinstance(block, TextBlock | ThinkingBlock):
        text = _text(block.text)
        if text != block.text:
            return dataclasses.replace(block, text=text)
    return block


def _unique_call_ids(
    blocks: tuple[AssistantBlock, ...], taken: Set[str], seq: int
) -> tuple[AssistantBlock, ...]:
    """Call ids must be unique in the whole session, not only within a turn: a provider that
    omits them (``call_0`` every turn) or repeats them would otherwise let a tool keyed by its
    call id (``delegate``'s children) take a later call for an earlier one. ``taken``: the ids
    earlier turns declared; ``seq``: the seq this turn will get. A missing id becomes
    ``call_<i>``; a repeated one gets ``_<seq>`` (then ``_<i>``) added. Deterministic, and only
    ever applied before the turn is committed: a resume reads the ids back from the log."""
    seen: set[str] = set()
    out: list[AssistantBlock] = []
    for i, block in enumerate(blocks):
        if isinstance(block, ToolCall):
            call_id = block.call_id or f"call_{i}"
            if call_id in taken:
                call_id = f"{call_id}_{seq}"
            while call_id in seen or call_id in taken:
                call_id = f"{call_id}_{i}"
            seen.add(call_id)
            out.append(
                block if call_id == block.call_id else ToolCall(call_id, block.name, block.input)
            )
        else:
            out.append(block)
    return tuple(out)
