"""Tunnel mode (``"execute": "tunnel"``): the server runs the whole agent loop, each tool over the
tunnel.

The persona's tools become kiso tools whose handler sends a one-tool KML envelope to the
project's executer (:meth:`kyronix.server.relay.Relay.execute`) and returns its result entry to
the model; kiso's loop does the rest (the turn, ``execution_started`` made durable before the
request goes out, ``execution_finished`` with the result, the next turn).

Exactly once: the tool's ``executionId`` in that envelope is derived from the session and the
model's **call** (:func:`kiso.kernel.execution.call_execution_id`, keyed with the server's
secret), not from kiso's execution id, which is new on every attempt. So the request a resumed
run sends again after a crash carries the same id, and the executer's receipt answers it (the
stored result, or ``uncertain``) instead of running it again. That is why every tunnel tool is
re-run on resume without asking (:class:`TunnelAgent`): re-sending is not re-running.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, TypeGuard

from kiso.kernel import (
    Assistant,
    Compacted,
    ExecutionFinished,
    ExecutionStarted,
    RunEnded,
    RunStarted,
    SessionStore,
    SettingChanged,
)
from kiso.kernel.execution import call_execution_id, request_id_of
from kiso.runtime import Agent, RunEvent, Session
from kiso.runtime.rules import RulesFile
from kiso.tools.base import Tool, ToolContext, ToolResult, define_tool
from kyronix import kml
from kyronix.executer.results import ResultEntry
from kyronix.executer.results import ToolResult as ToolResult_
from kyronix.server.agents import Persona
from kyronix.server.config import ServerConfig
from kyronix.server.models import ModelChoice
from kyronix.server.relay import Relay, TunnelFailure
from kyronix.server.runs.drive import Attempt
from kyronix.server.runs.handle import TAKEN_OVER, RunHandle, RunRequest
from kyronix.server.runs.outcome import Meter, Outcome, charge
from kyronix.server.sessions import RESULT_KEY, with_results
from kyronix.wire import EntryDict

__all__ = ["TIMEOUT_S", "TURNS", "TunnelAgent", "TunnelMode", "failed_entry", "results_of_run"]

TIMEOUT_S = 300.0
"""How long one tool's request waits (for an executer to connect, and for its answer)."""
TURNS = 20
"""Model turns a server-driven run may take."""


class TunnelAgent(Agent):
    """An agent whose tools all run over the tunnel: each is re-sent (same ids) on resume."""

    @cached_property
    def rerunnable(self) -> frozenset[str]:
        return frozenset(self.tools)


class TunnelMode:
    key: str | None = "tunnel"

    def __init__(
        self,
        config: ServerConfig,
        models: ModelChoice,
        *,
        store: SessionStore,
        workspace: Path,
        relay: Relay,
        id_key: bytes,
    ) -> None:
        self.config = config
        self.models = models
        self.store = store
        self.workspace = workspace
        self.relay = relay
        self.id_key = id_key
        """Keys the tools' execution ids and request ids (the server's secret, derived)."""
        self._rules = RulesFile(config.home / "rules.json")  # never written: nobody asks here

    def agent(self, persona: Persona, project_id: str) -> Agent:
        return TunnelAgent(
            adapter=self.models.tunnel_adapter(persona),
            tools=self.tools(persona, project_id),
            store=self.store,
            system_prompt=persona.tunnel_instructions,
            workspace=self.workspace,
            rules=self._rules,
            mode="bypass",  # the executer's permissions are the boundary; nobody here can ask
            max_turns=TURNS,
            max_retries=2,
            trigger="api",
            home=self.config.home,
        )

    def tools(self, persona: Persona, project_id: str) -> list[Tool]:
        relay, key = self.relay, self.id_key
        tools = []
        for spec in persona.tools:

            async def execute(
                args: dict[str, Any], ctx: ToolContext, name: str = spec.name
            ) -> ToolResult:
                exec_id = call_execution_id(ctx.session_id, ctx.call_id or ctx.execution_id, key)
                call = kml.ToolCall(name, {k: str(v) for k, v in args.items()}, exec_id)
                envelope = kml.serialize(kml.Plan(tools=(call,)))
                try:
                    frame = await relay.execute(
                        project_id, request_id_of(exec_id, key), envelope, timeout=TIMEOUT_S
                    )
                except TunnelFailure as exc:
                    failed = failed_entry(name, args, exec_id, exc.message, exc.code)
                    return ToolResult(json.dumps(failed), is_error=True)
                entry: EntryDict
                if frame.results:
                    entry = frame.results[0]
                elif frame.error is not None:
                    message, code = frame.error["message"], frame.error["code"]
                    entry = failed_entry(name, args, exec_id, message, code)
                else:
                    why = "the executer returned no result"
                    entry = failed_entry(name, args, exec_id, why, "executer_error")
                ok = entry["result"].get("success") is True
                return ToolResult(json.dumps(entry), is_error=not ok)

            tools.append(
                define_tool(spec.name, spec.description or spec.name, _schema(spec.params), execute)
            )
        return tools

    def course(
        self, handle: RunHandle, session: Session, persona: Persona, req: RunRequest, *,
        resume: bool,
    ) -> TunnelCourse:  # fmt: skip
        return TunnelCourse(self, handle, session, req, resume=resume)


class TunnelCourse:
    def __init__(
        self, mode: TunnelMode, handle: RunHandle, session: Session, req: RunRequest, *,
        resume: bool,
    ) -> None:  # fmt: skip
        self.mode = mode
        self.handle = handle
        self.session = session
        self.req = req
        self.resume = resume
        self.kiso_run: str | None = session.fold.open_run if resume else None
        self.ended_in_log = False
        """Resumed after its kiso run had ended: the answer is in the log, nothing runs."""

    def start(self) -> AsyncIterator[RunEvent]:
        session = self.session
        if not self.resume:
            return session.run(with_results(self.req.input, session.events), source="user")
        # the stream starts again: this run's text so far, from the log
        self.handle.new_attempt(TAKEN_OVER)
        this = self.kiso_run or _last_run(session.events)
        said = [e.text for e in session.events if isinstance(e, Assistant) and e.run == this]
        self.handle.add_text("".join(said))
        if session.fold.open_run is not None:
            return session.resume()
        if this is not None and not _answered_after(session.events, this):
            # its kiso run ended (the tools ran, the answer is written) and the server stopped
            # before the answer was recorded and charged: the log holds the outcome
            self.kiso_run, self.ended_in_log = this, True
            return _nothing()
        # the server stopped before the run's first event was durable: run it now
        return session.run(with_results(self.req.input, session.events), source="user")

    def turn(self, turn: Assistant, meter: Meter) -> None:
        self.kiso_run = turn.run

    async def end(
        self, attempt: Attempt, meter: Meter, texts: list[str]
    ) -> Outcome | AsyncIterator[RunEvent]:
        handle, session = self.handle, self.session
        kiso_run = self.kiso_run or _last_run(session.events)
        if self.ended_in_log and kiso_run is not None:
            attempt, meter = _ended(session.events, kiso_run)
        results = results_of_run(session.events, kiso_run) if kiso_run else []
        why = attempt.failed(need_text=False)
        if why is not None:
            return Outcome.failure(
                handle.id, handle.session_id, 502, "model_error", f"the run did not finish: {why}",
                details={"runId": handle.id, "results": results},
                texts=list(handle.texts), usage=meter.usage, results=results,
            )  # fmt: skip
        ids = [r["result"]["executionId"] for r in results]
        outcome = Outcome(
            handle.id, handle.session_id, 200, response=attempt.text, execution_ids=tuple(ids),
            results=results, cost=charge(self.mode.config, meter.usd), usage=meter.usage,
            texts=list(handle.texts),
        )  # fmt: skip
        return outcome  # recorded, with its results and its charge, in one transaction


async def _nothing() -> AsyncIterator[RunEvent]:
    return
    yield  # an async generator that yields nothing


def _answered_after(events: Sequence[Any], run: str) -> bool:
    """Whether a Kyronix run's outcome was recorded after kiso run ``run`` began (it belongs to
    an earlier Kyronix run of the session, then)."""
    seen = False
    for ev in events:
        if isinstance(ev, RunStarted) and ev.run == run:
            seen = True
        elif seen and isinstance(ev, SettingChanged) and ev.key == RESULT_KEY:
            return True
    return False


def _ended(events: Sequence[Any], run: str) -> tuple[Attempt, Meter]:
    """What the log says kiso run ``run`` did: its last text, how it ended, what it cost."""
    attempt, meter = Attempt(run=run), Meter()
    inside = False
    for ev in events:
        if isinstance(ev, RunStarted):
            inside = ev.run == run
        elif not inside:
            continue
        elif isinstance(ev, Assistant) and ev.run == run:
            attempt.text = ev.text
            meter.add(ev.model, ev.usage)
        elif isinstance(ev, Compacted) and ev.usage is not None:
            meter.add(ev.model or "", ev.usage)
        elif isinstance(ev, RunEnded) and ev.run == run:
            attempt.ended = ev.outcome
    return attempt, meter


def _schema(params: Sequence[Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            p.name: {"type": "string", "description": p.description or p.name} for p in params
        },
        "required": [p.name for p in params if p.required],
        "additionalProperties": False,
    }


def _last_run(events: Sequence[Any]) -> str | None:
    for ev in reversed(events):
        if isinstance(ev, RunStarted):
            return ev.run
    return None


def failed_entry(
    tool: str, args: dict[str, Any], execution_id: str, error: str, error_type: str
) -> EntryDict:
    """The entry of a tool the executer never answered for: the executer's own result type."""
    result = ToolResult_(False, "", execution_id, error=error, error_type=error_type)
    return ResultEntry(tool, {k: str(v) for k, v in args.items()}, result).to_dict()


def _is_entry(value: Any) -> TypeGuard[EntryDict]:
    result = value.get("result") if isinstance(value, dict) else None
    return (
        isinstance(value, dict)
        and isinstance(value.get("tool"), str)
        and isinstance(result, dict)
        and isinstance(result.get("executionId"), str)
    )


def results_of_run(events: Sequence[Any], run: str) -> list[EntryDict]:
    """The executer's result entries of a kiso run, in order (from its receipts in the log)."""
    out: list[EntryDict] = []
    started: dict[str, ExecutionStarted] = {}
    inside = False
    for ev in events:
        if isinstance(ev, RunStarted):
            inside = ev.run == run
        elif inside and isinstance(ev, ExecutionStarted):
            started[ev.execution_id] = ev
        elif inside and isinstance(ev, ExecutionFinished) and ev.run == run:
            try:
                entry = json.loads(ev.content)
            except ValueError:
                entry = None
            if _is_entry(entry):
                out.append(entry)
            else:  # the tool failed before any executer answered
                call = started.get(ev.execution_id)
                name = call.name if call is not None else "?"
                args = dict(call.input) if call is not None else {}
                out.append(failed_entry(name, args, ev.execution_id, ev.content, "server_error"))
    return out
