"""Running an agent: one driver, two modes.

The :class:`Driver` runs every Kyronix run the same way. It takes the run's kiso session from
the pool, consumes the run's event stream **once** (the text streamed to the handle, the usage
metered, the turn and the terminal noted), records the outcome in the session log, settles it,
and gives the session back. What differs between the two ways to run an agent is a small
:class:`Mode`:

* :class:`~kyronix.server.runs.plan.PlanMode` (the document's flow): the model answers with a
  KML plan; it is parsed and checked against the agent's tools, and a bad answer is sent back
  once for a correction;
* :class:`~kyronix.server.runs.tunnel.TunnelMode` (``"execute": "tunnel"``): the server runs the
  whole loop, each tool call sent to the project's executer over the tunnel.

A run lives in a task of its own (the HTTP request only watches its handle), bounded by the
run timeout; cut short (timeout, shutdown) it is recorded interrupted and its hold released; a
bug fails it with a 500 and releases its hold; a run this replica lost to another
(:class:`~kyronix.server.runs.settle.RunLost`) is left to that one and answered from its row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from kiso.kernel import Assistant
from kiso.kernel import Outcome as RunOutcome
from kiso.runtime import Agent, Compaction, ModelTurn, RunEvent, Session, Terminal, TextDelta
from kyronix.server.agents import Persona
from kyronix.server.config import ServerConfig
from kyronix.server.errors import error_body, is_storage_failure, storage_unavailable
from kyronix.server.runs import records
from kyronix.server.runs.follow import Follower
from kyronix.server.runs.handle import LiveRuns, RunHandle, RunRequest
from kyronix.server.runs.outcome import Meter, Outcome
from kyronix.server.runs.pool import SessionKey, SessionPool
from kyronix.server.runs.results import ResultsRecorder
from kyronix.server.runs.settle import RunLost, Settlement, end_open_run
from kyronix.server.tasks import Background

__all__ = ["Attempt", "Course", "Driver", "Mode"]

log = logging.getLogger("kyronix.server")

SETTLE_RETRY_S = 1.0
"""How soon a run whose end could not be written is tried again (doubling, up to the max)."""
SETTLE_RETRY_MAX_S = 30.0


@dataclass
class Attempt:
    """What one pass over a run's event stream saw."""

    text: str = ""
    """The text of the last model turn."""
    run: str | None = None
    """The kiso run id of the last model turn."""
    ended: RunOutcome | None = None
    """How the kiso run ended (None: the stream stopped without a terminal)."""

    def failed(self, *, need_text: bool) -> str | None:
        """Why the attempt produced no answer, or None when it did."""
        if self.ended is None or self.ended.kind not in ("completed", "max_turns"):
            return (
                self.ended.message
                if self.ended is not None and self.ended.message
                else ("no answer")
            )
        if need_text and not self.text:
            return "no answer"
        return None


class Course(Protocol):
    """One run in one mode: its own state, from its first stream to its outcome."""

    def start(self) -> AsyncIterator[RunEvent]:
        """The run's first event stream."""

    def turn(self, turn: Assistant, meter: Meter) -> None:
        """A model turn was committed (the mode may judge it)."""

    async def end(
        self, attempt: Attempt, meter: Meter, texts: list[str]
    ) -> Outcome | AsyncIterator[RunEvent]:
        """The stream ended: the outcome, or the stream of one more attempt."""


class Mode(Protocol):
    key: str | None
    """What the session's kiso session is kept open for, with the persona (``"tunnel"`` or
    None): a session opened in one mode is not reused in the other."""

    def agent(self, persona: Persona, project_id: str) -> Agent: ...

    def course(
        self, handle: RunHandle, session: Session, persona: Persona, req: RunRequest, *,
        resume: bool,
    ) -> Course: ...  # fmt: skip


class Driver:
    def __init__(
        self,
        config: ServerConfig,
        *,
        pool: SessionPool,
        settlement: Settlement,
        recorder: ResultsRecorder,
        live: LiveRuns,
        follower: Follower,
        plan: Mode,
        tunnel: Mode,
    ) -> None:
        self.config = config
        self.pool = pool
        self.settlement = settlement
        self.recorder = recorder
        self.live = live
        self.follower = follower
        self.plan = plan
        self.tunnel = tunnel
        self._retries = Background("a settle retry")

    def launch(
        self, handle: RunHandle, persona: Persona, req: RunRequest, *, resume: bool = False
    ) -> None:
        """Run it in a task of its own."""
        self.live.launch(handle, self._execute(handle, persona, req, resume=resume))

    async def _execute(
        self, handle: RunHandle, persona: Persona, req: RunRequest, *, resume: bool
    ) -> None:
        try:
            async with asyncio.timeout(self.config.run_timeout):
                outcome = await self._converse(handle, persona, req, resume=resume)
        except TimeoutError:
            await self._cut(handle, "timeout")
            return
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._cut(handle, "shutdown"))
            raise
        except RunLost:
            await self._lost(handle)
            return
        except Exception as exc:
            if await self._taken_from_us(handle):  # its lease went with it (a writer refused)
                await self._lost(handle)
                return
            outcome = self._failed(handle, exc)
        try:
            await asyncio.shield(self.settlement.settle(handle, outcome))
        except RunLost:
            await self._lost(handle)
            return
        except Exception as exc:  # its end could not be written: answer now, settle later
            if not is_storage_failure(exc):
                log.exception("run %s could not be settled", handle.id)
            self._answer_unsettled(handle)
            return
        if outcome.ok and outcome.issues_ids:
            self.recorder.remember(
                handle.project_id, handle.session_id, outcome.execution_ids, outcome.key_id
            )

    async def _taken_from_us(self, handle: RunHandle) -> bool:
        """Whether another replica owns the run now (or it ended there)."""
        try:
            row = await asyncio.to_thread(
                self.settlement.db.read, lambda c: records.get(c, handle.id)
            )
        except Exception:  # the database cannot tell: the run is still ours to end
            return False
        return row is not None and (row.status != "running" or row.owner != self.settlement.owner)

    def _failed(self, handle: RunHandle, exc: Exception) -> Outcome:
        """The outcome of a run that raised: the storage failed (503, the one clear error), or a
        bug (500). Either way nothing is charged, and the server lives."""
        if is_storage_failure(exc):
            log.error(
                "run %s: the database cannot write (%s); answered 503 storage_unavailable",
                handle.id, type(exc).__name__,
            )  # fmt: skip
            failed = storage_unavailable()
            return Outcome.failure(
                handle.id, handle.session_id, 503, failed.code, failed.message,
                details={"runId": handle.id}, recorded_in_log=False,
            )  # fmt: skip
        log.exception("run %s failed unexpectedly", handle.id)
        return Outcome.failure(
            handle.id, handle.session_id, 500, "internal_error",
            f"the run failed inside the server ({type(exc).__name__})",
            recorded_in_log=False,
        )  # fmt: skip

    def _answer_unsettled(self, handle: RunHandle) -> None:
        """The run's end could not be written (the database refuses writes): its client gets
        503 ``storage_unavailable`` now, and the run is recorded interrupted (its hold released,
        its session freed) as soon as the database writes again, retried in the background."""
        failed = storage_unavailable()
        body = error_body(failed.code, failed.message, {"runId": handle.id})
        handle.finish(503, body)
        self._retries.spawn(self._settle_later(handle.id))

    async def _settle_later(self, run_id: str) -> None:
        delay = SETTLE_RETRY_S
        while True:
            await asyncio.sleep(delay)
            try:
                await asyncio.to_thread(self.settlement.interrupt, run_id, "storage unavailable")
            except Exception:
                delay = min(delay * 2, SETTLE_RETRY_MAX_S)
                continue
            log.info("run %s: the database writes again; the run is settled", run_id)
            return

    async def close(self) -> None:
        """Stop the background retries (a run still unsettled is settled at the next start)."""
        await self._retries.close(cancel=True)

    async def _cut(self, handle: RunHandle, why: str) -> None:
        await self.settlement.interrupt_handle(handle, why)
        if not handle.done:  # not ours to interrupt any more: another replica has it
            await self._lost(handle)

    async def _lost(self, handle: RunHandle) -> None:
        """Another replica took the run over while this one was paused: stop, say so, and
        answer this replica's watchers with what the run's row says (followed to its end)."""
        log.warning(
            "run %s was taken over by another replica while this one could not heartbeat; "
            "this replica stopped working on it and wrote nothing more",
            handle.id,
        )
        await self.follower.answer_from_row(handle)

    async def _converse(
        self, handle: RunHandle, persona: Persona, req: RunRequest, *, resume: bool
    ) -> Outcome:
        mode = self.tunnel if req.execute == "tunnel" else self.plan
        key: SessionKey = (persona, mode.key)
        writer, handle.writer = handle.writer, None
        session = await self.pool.acquire(
            mode.agent(persona, req.project_id), handle.session_id, handle.project_id, key, writer
        )
        keep = False
        try:
            course = mode.course(handle, session, persona, req, resume=resume)
            outcome = await self._drive(handle, course)
            if not outcome.staged:
                self.settlement.stage(session, outcome, handle.project_id)
                await session.committed()
            self.settlement.committed(session, outcome)
            keep = True
            return outcome
        except BaseException:
            # cut short (shutdown, timeout): end the open kiso run so the log says so
            with contextlib.suppress(Exception):
                end_open_run(session.writer, handle.id, "the run was cut short")
            raise
        finally:
            await self.pool.done_with(handle.session_id, key, session, keep=keep)

    async def _drive(self, handle: RunHandle, course: Course) -> Outcome:
        """The one consumer of a run's events."""
        meter = Meter()
        texts: list[str] = []
        stream = course.start()
        while True:
            attempt = Attempt()
            async for ev in stream:
                if isinstance(ev, TextDelta):
                    handle.add_text(ev.text)
                elif isinstance(ev, ModelTurn):
                    attempt.text, attempt.run = ev.event.text, ev.event.run
                    meter.add(ev.event.model, ev.event.usage)
                    course.turn(ev.event, meter)
                elif isinstance(ev, Compaction) and ev.event.usage is not None:
                    meter.add(ev.event.model or "", ev.event.usage)  # the summary is paid for too
                elif isinstance(ev, Terminal):
                    attempt.ended = ev.outcome
            texts.append(attempt.text)
            step = await course.end(attempt, meter, texts)
            if isinstance(step, Outcome):
                return step
            handle.new_attempt()
            stream = step
