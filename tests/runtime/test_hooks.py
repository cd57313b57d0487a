"""The hook points: every one is called where the docs say, and built-ins plug in the same way."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import (
    ApprovalDecided,
    Assistant,
    ExecutionFinished,
    MemorySessionStore,
    Outcome,
    RefusedError,
    ToolCall,
)
from kiso.providers import FauxAdapter, ModelRequest
from kiso.runtime import Agent, CallContext, Hook, RunInfo, Verdict
from kiso.runtime.approvals import FloorHook, ModeHook, RulesHook
from kiso.tools import builtin_tools
from kiso.tools.base import ToolContext, ToolResult, define_tool

OBJ = {"type": "object", "properties": {"tag": {"type": "string"}}}


class Recorder(Hook):
    name = "extension:recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def before_model(self, request: ModelRequest, run: RunInfo) -> ModelRequest | None:
        self.seen.append(("before_model", len(request.messages)))
        return dataclasses.replace(request, system="you are tested")

    def after_turn(self, turn: Assistant, run: RunInfo) -> None:
        self.seen.append(("after_turn", turn.stop))

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        self.seen.append(("before_tool", ctx.call.input.get("tag")))
        if ctx.call.input.get("tag") == "forbidden":
            return Verdict("deny", self.name, "tag 'forbidden' is not allowed here")
        return None

    def after_tool(self, call: ToolCall, result: ToolResult, run: RunInfo) -> ToolResult | None:
        self.seen.append(("after_tool", result.content))
        return ToolResult(result.content.upper())

    def on_run_end(self, outcome: Outcome, run: RunInfo) -> None:
        self.seen.append(("on_run_end", outcome.kind))


def agent(tmp_path: Path, turns: list[dict[str, Any]], hooks: list[Hook], **kw: Any) -> Agent:
    requests: list[ModelRequest] = []

    class Capturing(FauxAdapter):
        def stream(self, request: ModelRequest) -> Any:
            requests.append(request)
            return super().stream(request)

    def echo(args: dict[str, Any], ctx: ToolContext) -> str:
        return f"echo {args['tag']} in {ctx.session_id}"

    a = Agent(
        adapter=Capturing(turns),
        tools=[define_tool("echo", "Echo", OBJ, echo, effects="other")],
        store=MemorySessionStore(),
        workspace=tmp_path,
        mode="bypass",
        hooks=hooks,
        **kw,
    )
    a.requests = requests  # type: ignore[attr-defined]
    return a


def call(tag: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "echo", "input": {"tag": tag}}]}


def test_every_hook_point_is_called_in_order(tmp_path: Path) -> None:
    hook = Recorder()
    a = agent(tmp_path, [call("x"), call("forbidden"), {"text": "done"}], [hook])
    with a.session("s") as session:
        list(session.run_sync("go"))
        log = list(session.events)
    assert hook.seen == [
        ("before_model", 1),
        ("after_turn", "tool_use"),
        ("before_tool", "x"),
        ("after_tool", "echo x in s"),
        ("before_model", 3),
        ("after_turn", "tool_use"),
        ("before_tool", "forbidden"),
        ("before_model", 5),
        ("after_turn", "end_turn"),
        ("on_run_end", "completed"),
    ]
    assert all(r.system == "you are tested" for r in a.requests)  # type: ignore[attr-defined]
    receipts = [e for e in log if isinstance(e, ExecutionFinished)]
    assert [r.content for r in receipts] == ["ECHO X IN S"]  # transformed before the receipt
    verdicts = [e for e in log if isinstance(e, ApprovalDecided)]
    # A deny wins over the bypass mode's allow; the verdict names the hook that decided.
    assert [(v.decision, v.decided_by) for v in verdicts] == [
        ("approved", "mode:bypass"),
        ("denied", "extension:recorder"),
    ]
    assert verdicts[1].reason == "tag 'forbidden' is not allowed here"


def test_the_modes_the_floor_and_the_rules_are_the_first_hooks(tmp_path: Path) -> None:
    a = agent(tmp_path, [], [])
    chain = a.hooks.tool_hooks
    assert [type(h) for h in chain[:3]] == [FloorHook, ModeHook, RulesHook]


def test_a_raising_hook_ends_the_run_with_an_error_naming_it(tmp_path: Path) -> None:
    class Broken(Hook):
        name = "extension:broken"

        def after_turn(self, turn: Assistant, run: RunInfo) -> None:
            raise RuntimeError("boom")

    a = agent(tmp_path, [call("x"), {"text": "done"}], [Broken()])
    with a.session("s") as session:
        out = list(session.run_sync("go"))
    terminal = out[-1]
    assert terminal.type == "terminal"
    assert terminal.outcome.code == "hook_failed"  # type: ignore[union-attr]
    assert "extension:broken" in (terminal.outcome.message or "")  # type: ignore[union-attr]
    assert "boom" in (terminal.outcome.message or "")  # type: ignore[union-attr]


def test_a_raising_before_tool_hook_asks_instead_of_deciding(tmp_path: Path) -> None:
    class Broken(Hook):
        name = "extension:broken"

        def before_tool(self, ctx: CallContext) -> Verdict | None:
            raise RuntimeError("boom")

    a = agent(tmp_path, [call("x"), {"text": "done"}], [Broken()], policies=())
    a_default = Agent(
        adapter=FauxAdapter([call("x"), {"text": "done"}]),
        tools=list(a.tools.values()),
        store=MemorySessionStore(),
        workspace=tmp_path,
        mode="default",
        hooks=[Broken()],
    )
    with a_default.session("s") as session:
        kinds = [ev.type for ev in session.run_sync("go")]
    assert kinds[-1] == "paused" and "approval_request" in kinds


def test_a_tool_context_has_the_session_the_workspace_and_an_abort_signal(
    tmp_path: Path,
) -> None:
    seen: list[ToolContext] = []

    def look(args: dict[str, Any], ctx: ToolContext) -> str:
        seen.append(ctx)
        ctx.progress("working\n")
        return "looked"

    a = Agent(
        adapter=FauxAdapter([{"tool_calls": [{"name": "look", "input": {}}]}, {"text": "ok"}]),
        tools=[define_tool("look", "Look", {"type": "object"}, look, effects="read")],
        store=MemorySessionStore(),
        workspace=tmp_path,
    )
    with a.session("ctx") as session:
        out = list(session.run_sync("go"))
    (ctx,) = seen
    assert ctx.session_id == "ctx" and ctx.workspace == tmp_path.resolve()
    assert ctx.execution_id.startswith("ctx:") and not ctx.abort.is_set()
    assert [ev.text for ev in out if ev.type == "tool_output"] == ["working\n"]  # type: ignore[union-attr]


def test_always_is_refused_for_an_irreversible_delete_by_the_runtime(tmp_path: Path) -> None:
    commands = [  # destructive, though not of anything the floor protects: so they are asked
        "rm -rf build",
        "cd build && ls | xargs rm -r",
        "sh -c 'rm -r dist'",
        "find . -name '*.o' -delete",
        "rm notes.txt",
        "git -C /tmp/elsewhere reset --hard",
    ]
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "shell", "input": {"command": c}} for c in commands]},
        {"text": "ok"},
    ]
    a = Agent(
        adapter=FauxAdapter(turns),
        tools=builtin_tools(),
        store=MemorySessionStore(),
        workspace=tmp_path,
    )
    with a.session("d") as session:
        refused = []
        for ev in session.run_sync("clean"):
            if ev.type == "approval_request":
                offer = session.offer(ev.call_id)
                assert offer.rule is None and offer.no_rule_because
                with pytest.raises(RefusedError, match="don't ask again"):
                    session.approve(ev.call_id, always=True)
                refused.append(ev.call.input["command"])  # type: ignore[union-attr]
                session.deny(ev.call_id, "not now")
        assert refused == commands
        assert not a.rules.load()  # no rule was written for any of them
