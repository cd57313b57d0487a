"""The loop: the one place that knows the turn order.

call the model -> commit the turn -> decide approvals -> execute -> record -> repeat

Each step starts from :func:`kiso.kernel.plan` over the durable log, so a fresh run and a resumed
one are the same code: after a crash the loop simply finds itself at whatever step the log says.
Every fact is appended (and fsynced) before anything acts on it or shows it: ``execution_started``
before the handler, the verdict before the execution, the ``assistant`` record only after the
provider's stream ended cleanly with exactly one stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from kiso.kernel import (
    ApprovalDecided,
    ApprovalRequested,
    Assistant,
    AwaitApproval,
    CallModel,
    Decide,
    EndRun,
    Execute,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    Idle,
    Outcome,
    ResolveUncertain,
    RunEnded,
    ToolCall,
    input_sha256,
)
from kiso.kernel.events import ERROR_KINDS, AssistantBlock
from kiso.kernel.recovery import plan_replay
from kiso.providers.base import ModelRequest, ProviderError, TextDelta, ThinkingDelta, TurnDone
from kiso.runtime import stream as ev
from kiso.runtime.approvals import CallContext, compose
from kiso.tools.base import AbortSignal, Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from kiso.runtime.session import Session

__all__ = ["drive"]

PARALLEL_READS = 4


class _Aborted(Exception):
    pass


async def drive(session: Session) -> AsyncIterator[ev.RunEvent]:
    """Carry the session's open run forward until it ends or needs a human."""
    agent = session.agent
    session.child_env = agent.child_env()  # the environment as it is when the run (re)starts
    while True:
        state = session.fold
        if state.open_run is None:
            return
        run = state.open_run
        if session.abort_requested:
            yield await _end(session, run, Outcome.aborted(session.abort_requested))
            return
        action = plan_replay(state, rerunnable=agent.rerunnable)
        if isinstance(action, Idle):
            return
        if isinstance(action, ResolveUncertain):
            auto = [u for u in action.executions if u.auto_rerun]
            for u in auto:
                (ruling,) = session.append(
                    ExecutionResolved(
                        run=run,
                        execution_id=u.execution_id,
                        call_id=u.call_id,
                        resolution="rerun",
                        decided_by="policy:idempotent",
                    )
                )
                assert isinstance(ruling, ExecutionResolved)
                yield ev.Ruling(ruling)
            if auto:
                continue
            yield ev.UncertainPending(action.executions)
            if _still(session, ResolveUncertain):
                yield ev.Paused("uncertain")
                return
        elif isinstance(action, AwaitApproval):
            calls = {c.call_id: c for c in _turn_calls(session)}
            for request in action.requests:
                call = calls.get(request.call_id) or ToolCall(
                    request.call_id, request.name, request.input
                )
                yield ev.ApprovalRequest(call, request)
            if _still(session, AwaitApproval):
                yield ev.Paused("awaiting_approval")
                return
        elif isinstance(action, Decide):
            for call in action.calls:
                event = _decide(session, run, call)
                if isinstance(event, ApprovalDecided):
                    yield ev.Decision(event)
        elif isinstance(action, Execute):
            async for item in _execute(session, run, action.calls):
                yield item
        elif isinstance(action, CallModel):
            if state.run_turns >= agent.max_turns:
                yield await _end(session, run, Outcome("max_turns"))
                return
            outcome: list[Outcome] = []
            async for item in _call_model(session, run, outcome):
                yield item
            if outcome:
                yield await _end(session, run, outcome[0])
                return
        elif isinstance(action, EndRun):
            yield await _end(session, run, action.outcome)
            return


def _still(session: Session, kind: type) -> bool:
    """After a question was yielded: is the same kind of question still open?"""
    action = plan_replay(session.fold, rerunnable=session.agent.rerunnable)
    return isinstance(action, kind)


def _turn_calls(session: Session) -> tuple[ToolCall, ...]:
    return tuple(cs.call for cs in session.fold.turn or ())


async def _end(session: Session, run: str, outcome: Outcome) -> ev.Terminal:
    session.append(RunEnded(run=run, outcome=outcome))
    return ev.Terminal(outcome)


# --------------------------------------------------------------------------- approvals


def _decide(session: Session, run: str, call: ToolCall) -> ApprovalDecided | ApprovalRequested:
    agent = session.agent
    tool = agent.tool(call.name)
    digest = input_sha256(call.input)

    def verdict(
        decision: str, by: str, reason: str | None, rule: str | None = None
    ) -> ApprovalDecided:
        (event,) = session.append(
            ApprovalDecided(
                run=run,
                call_id=call.call_id,
                decision="approved" if decision == "allow" else "denied",
                decided_by=by,
                reason=reason,
                input_sha256=digest,
                rule=rule,
            )
        )
        assert isinstance(event, ApprovalDecided)
        return event

    if tool is None:
        names = ", ".join(sorted(agent.tools)) or "none"
        return verdict("deny", "runtime", f"there is no tool named {call.name!r} (tools: {names})")
    problem = agent.input_problem(tool, call.input)
    if problem is not None:
        return verdict("deny", "schema", f"invalid input for {call.name}: {problem}")
    ctx = CallContext(call, tool, agent.workspace, agent.home)
    chosen = compose(agent.policies(session.mode), ctx, unattended=session.mode == "dontAsk")
    if chosen.decision == "ask":
        (event,) = session.append(
            ApprovalRequested(
                run=run, call_id=call.call_id, name=call.name, input=call.input, speaker=chosen.by
            )
        )
        assert isinstance(event, ApprovalRequested)
        return event
    return verdict(chosen.decision, chosen.by, chosen.reason, chosen.rule)


# --------------------------------------------------------------------------- execution


def _first_batch(calls: Sequence[ToolCall], session: Session) -> list[ToolCall]:
    """The calls to run now: consecutive read-only calls together (at most four), else one."""

    def parallel(call: ToolCall) -> bool:
        tool = session.agent.tool(call.name)
        return tool is not None and tool.parallel_safe

    batch = [calls[0]]
    if parallel(calls[0]):
        for call in calls[1:]:
            if not parallel(call) or len(batch) == PARALLEL_READS:
                break
            batch.append(call)
    return batch


async def _execute(
    session: Session, run: str, calls: Sequence[ToolCall]
) -> AsyncIterator[ev.RunEvent]:
    batch = _first_batch(calls, session)  # then re-plan: aborts are checked between batches
    if len(batch) == 1:
        async for item in _execute_call(session, run, batch[0]):
            yield item
        return
    queue: asyncio.Queue[ev.RunEvent | None] = asyncio.Queue()

    async def one(call: ToolCall) -> None:
        try:
            async for item in _execute_call(session, run, call):
                await queue.put(item)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(one(call)) for call in batch]
    remaining = len(tasks)
    try:
        while remaining:
            got = await queue.get()
            if got is None:
                remaining -= 1
            else:
                yield got
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        exc = task.exception()
        if exc is not None:
            raise exc


async def _execute_call(session: Session, run: str, call: ToolCall) -> AsyncIterator[ev.RunEvent]:
    """``execution_started`` (durable), then the handler, then the receipt (durable).

    While the handler runs, what it reports through ``ctx.on_output`` is yielded as
    ``tool_output`` events (live only, never logged), all of them before ``tool_end``.
    """
    agent = session.agent
    (started,) = session.append(
        ExecutionStarted(
            run=run,
            execution_id=f"{session.id}:{session.next_seq}",
            call_id=call.call_id,
            name=call.name,
            input=call.input,
        )
    )
    assert isinstance(started, ExecutionStarted)
    yield ev.ToolStart(call, started)
    began = time.monotonic()
    tool = agent.tool(call.name)
    if tool is None:
        result = ToolResult(
            f"the tool {call.name!r} is not available in this agent any more; nothing ran",
            is_error=True,
            error_kind="fatal",
        )
    else:
        chunks: asyncio.Queue[str | None] = asyncio.Queue()  # None: the handler is done
        abort = AbortSignal()
        if session.abort_requested:
            abort.set(session.abort_requested)
        ctx = ToolContext(
            workspace=agent.workspace,
            execution_id=started.execution_id,
            session_id=session.id,
            env=session.child_env,
            abort=abort,
            progress=_forward_to(chunks),
        )
        session._aborts.add(abort)
        task = asyncio.create_task(_run_tool(tool, call, ctx))
        task.add_done_callback(lambda _: chunks.put_nowait(None))
        try:
            done = False
            while not done:
                parts = [await chunks.get()]
                while not chunks.empty():  # one event for everything that arrived meanwhile
                    parts.append(chunks.get_nowait())
                done = None in parts
                text = "".join(part for part in parts if part)
                if text:
                    yield ev.ToolOutput(call, started.execution_id, text)
        finally:
            if not task.done():  # the consumer went away or the batch was cancelled
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        result = task.result()
    kind = result.error_kind if result.error_kind in ERROR_KINDS else None
    if result.error_kind is not None and kind is None:
        kind = "fatal"  # a tool's own word for its failure; the log keeps to the closed set
    (finished,) = session.append(
        ExecutionFinished(
            run=run,
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
    yield ev.ToolEnd(call, finished)


async def _run_tool(tool: Tool, call: ToolCall, ctx: ToolContext) -> ToolResult:
    try:
        return await tool.run(dict(call.input), ctx)
    except Exception as exc:
        return ToolResult(
            f"the tool {call.name} failed: {type(exc).__name__}: {exc}",
            is_error=True,
            error_kind="fatal",
        )


def _forward_to(chunks: asyncio.Queue[str | None]) -> Callable[[str], None]:
    """An ``on_output`` callable from any thread: each chunk is queued on the running loop."""
    loop = asyncio.get_running_loop()

    def on_output(text: str) -> None:
        if isinstance(text, str) and text:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is watching
                loop.call_soon_threadsafe(chunks.put_nowait, text)

    return on_output


# --------------------------------------------------------------------------- the model


async def _call_model(
    session: Session, run: str, failure: list[Outcome]
) -> AsyncIterator[ev.RunEvent]:
    """Stream one turn with retries; commit it, or put the run's failure outcome in ``failure``."""
    agent = session.agent
    state = session.fold
    request = ModelRequest(
        system=agent.system_prompt,
        messages=tuple(state.messages),
        tools=agent.tool_specs(),
        turn=state.turns,
    )
    attempt = 0
    while True:
        attempt += 1
        try:
            done: TurnDone | None = None
            async for item in _stream(session, request):
                if isinstance(item, TurnDone):
                    done = item
                else:
                    yield item
            assert done is not None
            break
        except _Aborted:
            failure.append(Outcome.aborted(session.abort_requested or "user"))
            return
        except ProviderError as exc:
            if not exc.retryable or attempt > agent.max_retries:
                failure.append(Outcome.error(exc.code, exc.message, retryable=exc.retryable))
                return
            delay = exc.retry_after or agent.retry_base_delay * 2 ** (attempt - 1)
            delay = min(delay, 30.0) * (1 + random.random() * 0.1)
            yield ev.Retry(attempt, delay, exc.message)
            await asyncio.sleep(delay)
    (committed,) = session.append(
        Assistant(
            run=run,
            blocks=_unique_call_ids(done.blocks),
            stop=done.stop,  # type: ignore[arg-type]
            usage=done.usage,
            model=done.model,
            ms=int(session.last_model_ms),
        )
    )
    assert isinstance(committed, Assistant)
    yield ev.ModelTurn(committed)


async def _stream(
    session: Session, request: ModelRequest
) -> AsyncIterator[ev.TextDelta | ev.ThinkingDelta | TurnDone]:
    """One attempt: deltas live; the TurnDone last, only if the stream ended right after it."""
    agent = session.agent
    began = time.monotonic()
    iterator = agent.adapter.stream(request).__aiter__()
    done: TurnDone | None = None
    try:
        while True:
            if session.abort_requested:
                raise _Aborted
            try:
                async with asyncio.timeout(agent.idle_timeout):
                    item = await iterator.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
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
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
    if done is None:
        raise ProviderError(
            "the model's stream ended without a stop; the turn was not committed",
            code="incomplete_stream",
            retryable=True,
        )
    session.last_model_ms = (time.monotonic() - began) * 1000
    yield done


def _unique_call_ids(blocks: tuple[AssistantBlock, ...]) -> tuple[AssistantBlock, ...]:
    """Call ids must be unique within a turn; a provider that repeats or omits one is fixed."""
    seen: set[str] = set()
    out: list[AssistantBlock] = []
    for i, block in enumerate(blocks):
        if isinstance(block, ToolCall):
            call_id = block.call_id or f"call_{i}"
            while call_id in seen:
                call_id = f"{call_id}_{i}"
            seen.add(call_id)
            out.append(
                block if call_id == block.call_id else ToolCall(call_id, block.name, block.input)
            )
        else:
            out.append(block)
    return tuple(out)
