"""The server-driven loop (``"execute": "tunnel"``): the agent's tools run over the tunnel.

The persona's tools become kiso tools whose handler sends a one-tool KML envelope to the
project's executer (:meth:`kyronix.server.tunnel.Relay.execute`) and returns its result entry to
the model; kiso's loop does the rest (the turn, ``execution_started`` made durable before the
request goes out, ``execution_finished`` with the result, the next turn).

Exactly once: the tool's ``executionId`` in that envelope is derived from the session and the
model's **call** (not from kiso's execution id, which is new on every attempt), so the request a
resumed run sends again after a crash carries the same id, and the executer's receipt answers it
(the stored result, or ``uncertain``) instead of running it again. That is why every tunnel tool
is re-run on resume without asking (:class:`TunnelAgent`): re-sending is not re-running.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from kiso.kernel import ExecutionFinished, RunStarted
from kiso.runtime import Agent
from kiso.tools.base import Tool, ToolContext, ToolResult, define_tool
from kyronix import kml
from kyronix.server.agents import Persona

if TYPE_CHECKING:
    from kyronix.server.tunnel import Relay

__all__ = ["TunnelAgent", "results_of_run", "tunnel_execution_id", "tunnel_tools"]

TIMEOUT_S = 300.0
"""How long one tool's request waits (for an executer to connect, and for its answer)."""


class TunnelAgent(Agent):
    """An agent whose tools all run over the tunnel: each is re-sent (same ids) on resume."""

    @cached_property
    def rerunnable(self) -> frozenset[str]:
        return frozenset(self.tools)


def tunnel_execution_id(session_id: str, call_id: str) -> str:
    """The tool's receipt key: the same for every attempt of the model's call."""
    return "exec_" + hashlib.sha256(f"{session_id}\x00{call_id}".encode()).hexdigest()[:32]


def _schema(params: Sequence[Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            p.name: {"type": "string", "description": p.description or p.name} for p in params
        },
        "required": [p.name for p in params if p.required],
        "additionalProperties": False,
    }


def tunnel_tools(persona: Persona, relay: Relay, project_id: str) -> list[Tool]:
    tools = []
    for spec in persona.tools:

        async def execute(
            args: dict[str, Any], ctx: ToolContext, name: str = spec.name
        ) -> ToolResult:
            from kyronix.server.tunnel import TunnelFailure

            exec_id = tunnel_execution_id(ctx.session_id, ctx.call_id or ctx.execution_id)
            call = kml.ToolCall(name, {k: str(v) for k, v in args.items()}, exec_id)
            envelope = kml.serialize(kml.Plan(tools=(call,)))
            try:
                frame = await relay.execute(
                    project_id, "req_" + exec_id[5:], envelope, timeout=TIMEOUT_S,
                    session_id=ctx.session_id,
                )  # fmt: skip
            except TunnelFailure as exc:
                return ToolResult(
                    json.dumps({"tool": name, "result": {"success": False, "error": exc.message,
                                "errorType": exc.code, "executionId": exec_id}}),
                    is_error=True,
                )  # fmt: skip
            results = frame.get("results") or []
            if not results:
                why = (frame.get("error") or {}).get("message", "the executer returned no result")
                entry: dict[str, Any] = {
                    "tool": name,
                    "result": {"success": False, "error": why, "executionId": exec_id},
                }
            else:
                entry = results[0]
            result = entry.get("result") if isinstance(entry, dict) else None
            ok = isinstance(result, dict) and result.get("success") is True
            return ToolResult(json.dumps(entry), is_error=not ok)

        tools.append(
            define_tool(spec.name, spec.description or spec.name, _schema(spec.params), execute)
        )
    return tools


def results_of_run(events: Sequence[Any], run: str) -> list[dict[str, Any]]:
    """The executer's result entries of a kiso run, in order (from its receipts in the log)."""
    out: list[dict[str, Any]] = []
    inside = False
    for ev in events:
        if isinstance(ev, RunStarted):
            inside = ev.run == run
        elif inside and isinstance(ev, ExecutionFinished) and ev.run == run:
            try:
                entry = json.loads(ev.content)
            except ValueError:
                entry = {"result": {"success": False, "error": ev.content}}
            if isinstance(entry, dict):
                out.append(entry)
    return out
