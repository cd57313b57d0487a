"""A real agent process for crash tests: the SDK, the built-in tools, the scripted model.

    python driver.py HOME WORKSPACE SESSION run PROMPT
    python driver.py HOME WORKSPACE SESSION resume [rerun|skipped|applied]

The model is KISO_FAUX_SCRIPT. Besides the six built-in tools there is ``effect``, which appends
its ``tag`` to WORKSPACE/effects.log (an append-only count of side effects), and ``peek``, a
read-only tool. Questions are answered as a person would: approvals with "yes", uncertain
executions with the ruling given on the command line. Every event is printed as one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kiso.kernel import JsonlSessionStore
from kiso.runtime import Agent
from kiso.tools import builtin_tools
from kiso.tools.base import ToolContext, define_tool


def effect(args: dict[str, Any], ctx: ToolContext) -> str:
    with open(ctx.workspace / "effects.log", "a", encoding="utf-8") as f:
        f.write(args["tag"] + "\n")
    return f"effect {args['tag']}"


def peek(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"peeked {args['tag']}"


def main(home: str, workspace: str, session_id: str, command: str, *rest: str) -> int:
    obj = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
    agent = Agent(
        tools=[
            *builtin_tools(),
            define_tool("effect", "Record a side effect", obj, effect, effects="other"),
            define_tool("peek", "Look at something", obj, peek, effects="read"),
        ],
        store=JsonlSessionStore(home),
        workspace=Path(workspace),
        mode="default",
        retry_base_delay=0.01,
    )
    ruling = rest[0] if command == "resume" and rest else None
    with agent.session(session_id) as session:
        events = session.run_sync(rest[0]) if command == "run" else session.resume_sync()
        for ev in events:
            print(json.dumps({"type": ev.type, **_describe(ev)}), flush=True)
            if ev.type == "approval_request":
                session.approve(ev.call_id)
            elif ev.type == "uncertain" and ruling is not None:
                for u in ev.executions:
                    if not u.auto_rerun:
                        session.resolve(u.execution_id, ruling)  # type: ignore[arg-type]
        print(json.dumps({"type": "exit", "state": session.state.value}), flush=True)
    return 0


def _describe(ev: Any) -> dict[str, Any]:
    if ev.type == "terminal":
        return {"outcome": ev.outcome.to_json()}
    if ev.type in ("tool_start", "tool_end"):
        return {"name": ev.call.name, "call_id": ev.call.call_id}
    if ev.type == "uncertain":
        return {"executions": [[u.execution_id, u.name] for u in ev.executions]}
    if ev.type == "approval_request":
        return {"call_id": ev.call_id}
    return {}


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
