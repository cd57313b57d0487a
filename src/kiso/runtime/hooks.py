"""The runtime's hook points: where policies, observers and extensions plug into a run.

A :class:`Hook` overrides any of eight methods; the defaults do nothing, and the runtime only calls
the ones a hook overrides. Built-ins are hooks like any other: the catastrophe floor, the approval
modes and the "don't ask again" rules are the first three ``before_tool`` hooks of every agent
(:mod:`kiso.runtime.approvals`), and an extension registers its hooks exactly the same way::

    class NoFridays(Hook):
        name = "no-fridays"

        def before_tool(self, ctx: CallContext) -> Verdict | None:
            if ctx.tool is not None and not ctx.tool.read_only and is_friday():
                return Verdict("deny", self.name, "no changes on Fridays")
            return None  # abstain

    agent = Agent(..., hooks=[NoFridays()])

==================  ======================================  ===================================
point               when                                    may
==================  ======================================  ===================================
``on_user_message`` a run starts with a person's prompt     return a rewrite (what the ``user``
                                                            record holds) or a :class:`Veto`
                                                            (the run ends ``error``/``vetoed``)
``on_event``        an event of the log is durable          observe (called at step boundaries,
                                                            in log order, once per event)
``before_model``    a model request is about to be sent     return a replacement request
``after_turn``      a model turn was committed to the log   observe
``before_tool``     a call has no verdict on disk yet       allow, deny (with a reason), ask,
                                                            or abstain (``None``)
``after_tool``      a handler returned, before its receipt  return a replacement result
``on_compaction``   a summary was committed (``compacted``) observe
``on_run_end``      ``run_ended`` is durable                observe
==================  ======================================  ===================================

``before_tool`` verdicts compose deny > allow > ask (:func:`kiso.runtime.approvals.compose`): a
hook that raises there counts as an ask, so a broken policy never decides silently. A hook that
raises anywhere else ends the run with an ``error`` outcome naming it (code ``hook_failed``). A
verdict is written to the log with the hook's name as ``decided_by``; a call with a verdict on disk
is never put to the hooks again, even after a crash.

Shell commands from config (``hooks`` in ``config.json``) plug in at ``before_tool``,
``after_tool`` and ``on_run_end`` as constrain-only hooks: :mod:`kiso.runtime.command_hooks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from kiso.kernel import Assistant, Compacted, Event, Outcome, RunError, ToolCall, UsageError

if TYPE_CHECKING:
    from kiso.providers.base import ModelRequest
    from kiso.tools.base import Tool, ToolResult

__all__ = [
    "HOOK_POINTS",
    "CallContext",
    "Hook",
    "HookChain",
    "HookFailed",
    "Policy",
    "PolicyHook",
    "RunInfo",
    "Verdict",
    "Veto",
]

HOOK_POINTS = (
    "on_user_message",
    "on_event",
    "before_model",
    "after_turn",
    "before_tool",
    "after_tool",
    "on_compaction",
    "on_run_end",
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a ``before_tool`` hook says about a call."""

    decision: Literal["allow", "deny", "ask"]
    by: str
    """Recorded as ``decided_by`` (``mode:default``, ``floor``, ``rule:…``, an extension's name)."""
    reason: str | None = None
    """For a deny: what the model is told. For an ask: shown to the person asked."""
    rule: str | None = None
    """The "don't ask again" rule that allowed the call, if one did."""


@dataclass(frozen=True, slots=True)
class Veto:
    """What an ``on_user_message`` hook returns to refuse a prompt: the run ends before any model
    request, with an ``error`` outcome (code ``vetoed``) carrying the reason."""

    reason: str
    by: str = ""
    """Filled in with the hook's name when the chain records it."""


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Which run a hook is called for."""

    session_id: str
    run_id: str
    workspace: Path
    mode: str


@dataclass(frozen=True, slots=True)
class CallContext:
    """A call waiting for a verdict, with what a policy needs to judge it."""

    call: ToolCall
    tool: Tool | None
    workspace: Path
    home: Path
    """The user's home directory (the floor protects it)."""
    mode: str = "default"
    """The approval mode in force for the session."""
    session_id: str = ""
    run_id: str = ""


class Hook:
    """Override what you need; each default does nothing (and is never called)."""

    name: str = "hook"
    allow_only: bool = False
    """Its ``before_tool`` can only allow or abstain (the "don't ask again" rules): it is not
    consulted once an earlier hook has allowed or denied, since it could change nothing."""
    constrain_only: bool = False
    """Its ``before_tool`` can only make a call stricter (an extension's hooks): its verdict wins
    only where it is stricter (deny > ask > allow) than what the built-in chain decided, so it
    never turns the floor's, a mode's or a rule's ask or deny into an allow."""

    def on_user_message(self, text: str, run: RunInfo) -> str | Veto | None:
        """Return a rewrite of a person's prompt, a :class:`Veto`, or None to leave it."""
        return None

    def on_event(self, event: Event, run: RunInfo) -> None:
        """An event of the log is durable (observe only)."""

    def before_model(self, request: ModelRequest, run: RunInfo) -> ModelRequest | None:
        """Return a replacement for the request about to be sent, or None to leave it."""
        return None

    def after_turn(self, turn: Assistant, run: RunInfo) -> None:
        """A model turn is committed to the log (durable before any of its effects runs)."""

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        """A verdict on a call with none on disk yet, or None to abstain."""
        return None

    def after_tool(self, call: ToolCall, result: ToolResult, run: RunInfo) -> ToolResult | None:
        """Return a replacement for the handler's result before its receipt is written."""
        return None

    def on_compaction(self, event: Compacted, run: RunInfo) -> None:
        """A summary replaced older history (the ``compacted`` record is committed)."""

    def on_run_end(self, outcome: Outcome, run: RunInfo) -> None:
        """The run ended; ``run_ended`` is durable."""


class Policy(Protocol):
    """The older spelling of a ``before_tool`` hook: a ``name`` and ``decide(ctx)``."""

    name: str

    def decide(self, ctx: CallContext) -> Verdict | None: ...


class PolicyHook(Hook):
    """A :class:`Policy` as a hook."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        return self.policy.decide(ctx)


class HookFailed(RunError):
    """A hook raised; the run ends with an ``error`` outcome naming it."""

    def __init__(self, hook: Hook, point: str, exc: BaseException) -> None:
        super().__init__(f"the hook {hook.name!r} failed in {point}: {type(exc).__name__}: {exc}")
        self.hook = hook
        self.point = point


class HookChain:
    """The hooks of an agent, sorted by point: only the overridden methods are called."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        self.hooks = tuple(hooks)
        self.by_point: dict[str, tuple[Hook, ...]] = {
            point: tuple(h for h in self.hooks if _overrides(h, point)) for point in HOOK_POINTS
        }
        self.tool_hooks = self.by_point["before_tool"]
        """The approval chain, in order."""

    def on_user_message(self, text: str, run: RunInfo) -> str | Veto:
        """The prompt piped through every hook; the first veto stops the chain."""
        for hook in self.by_point["on_user_message"]:
            try:
                said = hook.on_user_message(text, run)
                if said is not None and not isinstance(said, str | Veto):
                    raise UsageError(f"it returned {type(said).__name__}; return str, Veto or None")
            except Exception as exc:
                raise HookFailed(hook, "on_user_message", exc) from exc
            if isinstance(said, Veto):
                return Veto(said.reason, said.by or hook.name)
            if said is not None:
                text = said
        return text

    def on_event(self, event: Event, run: RunInfo) -> None:
        for hook in self.by_point["on_event"]:
            try:
                hook.on_event(event, run)
            except Exception as exc:
                raise HookFailed(hook, "on_event", exc) from exc

    def before_model(self, request: ModelRequest, run: RunInfo) -> ModelRequest:
        for hook in self.by_point["before_model"]:
            try:
                replaced = hook.before_model(request, run)
                _expect(replaced, _model_request(), "a ModelRequest")
            except Exception as exc:
                raise HookFailed(hook, "before_model", exc) from exc
            if replaced is not None:
                request = replaced
        return request

    def after_turn(self, turn: Assistant, run: RunInfo) -> None:
        for hook in self.by_point["after_turn"]:
            try:
                hook.after_turn(turn, run)
            except Exception as exc:
                raise HookFailed(hook, "after_turn", exc) from exc

    def after_tool(self, call: ToolCall, result: ToolResult, run: RunInfo) -> ToolResult:
        for hook in self.by_point["after_tool"]:
            try:
                replaced = hook.after_tool(call, result, run)
                _expect(replaced, _tool_result(), "a ToolResult")
            except Exception as exc:
                raise HookFailed(hook, "after_tool", exc) from exc
            if replaced is not None:
                result = replaced
        return result

    def on_compaction(self, event: Compacted, run: RunInfo) -> None:
        for hook in self.by_point["on_compaction"]:
            try:
                hook.on_compaction(event, run)
            except Exception as exc:
                raise HookFailed(hook, "on_compaction", exc) from exc

    def on_run_end(self, outcome: Outcome, run: RunInfo) -> None:
        for hook in self.by_point["on_run_end"]:
            try:
                hook.on_run_end(outcome, run)
            except Exception as exc:
                raise HookFailed(hook, "on_run_end", exc) from exc


def _expect(value: object, kind: type, what: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise UsageError(f"it returned {type(value).__name__}; return {what} or None")


def _model_request() -> type:
    from kiso.providers.base import ModelRequest

    return ModelRequest


def _tool_result() -> type:
    from kiso.tools.base import ToolResult

    return ToolResult


def _overrides(hook: Hook, point: str) -> bool:
    wrapped = getattr(hook, "wrapped", None)  # a hook that delegates (an extension's)
    if isinstance(wrapped, Hook):
        return _overrides(wrapped, point)
    return getattr(type(hook), point, None) is not getattr(Hook, point)
