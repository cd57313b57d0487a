"""The approval chain: policies that each allow, deny, ask, or abstain; composed deny > allow > ask.

The chain for a call is: the catastrophe floor (deny only, in every mode), the mode, the
"don't ask again" rules, then any policies the host adds. Every policy sees every call; the
composition takes the first deny, else the first allow, else the first ask (its policy is the
"speaker" of the question). A policy that raises counts as an ask. If every policy abstains, a
human is asked. In ``dontAsk`` mode, an ask becomes a deny: nobody is there to answer.

Modes (``mode:<name>`` in ``decided_by``):

===============  ===========================================================================
default          reads allowed; edits, shell and anything else ask
accept-edits     reads and file edits allowed (except under .git/ and .kiso/); the rest asks
plan             read-only: reads allowed, everything else denied with a reason
dontAsk          reads allowed; whatever would ask is denied (for unattended runs)
bypass           everything allowed (the floor still denies)
===============  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from kiso.kernel import KisoError, ToolCall
from kiso.runtime.rules import PROTECTED_DIRS, RulesFile
from kiso.tools.base import Effects, Tool

__all__ = [
    "MODES",
    "CallContext",
    "FloorPolicy",
    "ModePolicy",
    "Policy",
    "RulesPolicy",
    "Verdict",
    "check_mode",
    "compose",
]

MODES = ("default", "accept-edits", "plan", "dontAsk", "bypass")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise KisoError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    return mode


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Literal["allow", "deny", "ask"]
    by: str
    reason: str | None = None
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class CallContext:
    call: ToolCall
    tool: Tool | None
    workspace: Path
    home: Path


class Policy(Protocol):
    name: str

    def decide(self, ctx: CallContext) -> Verdict | None:
        """A verdict, or None to abstain."""
        ...


def _effects(ctx: CallContext) -> Effects:
    return ctx.tool.effects if ctx.tool is not None else Effects.OTHER


class ModePolicy:
    def __init__(self, mode: str) -> None:
        self.mode = check_mode(mode)
        self.name = f"mode:{mode}"

    def decide(self, ctx: CallContext) -> Verdict | None:
        effects = _effects(ctx)
        if self.mode == "bypass":
            return Verdict("allow", self.name, "bypass mode allows every call")
        if effects is Effects.READ:
            return Verdict("allow", self.name, "reads are allowed")
        if self.mode == "plan":
            return Verdict(
                "deny",
                self.name,
                "plan mode is read-only: describe the change instead of making it",
            )
        if self.mode == "accept-edits" and effects is Effects.EDIT:
            path = ctx.call.input.get("path")
            parts = Path(str(path)).parts if isinstance(path, str) else ()
            if any(p in PROTECTED_DIRS for p in parts):
                return Verdict("ask", self.name, "edits under .git/ or .kiso/ always ask")
            return Verdict("allow", self.name, "accept-edits mode allows file edits")
        if self.mode == "dontAsk":
            return None  # abstain: an ask from the composition becomes a deny
        return Verdict("ask", self.name)


class FloorPolicy:
    """The catastrophe floor: denies destructive commands on unrecoverable targets."""

    name = "floor"

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def decide(self, ctx: CallContext) -> Verdict | None:
        if not self.enabled or _effects(ctx) is not Effects.SHELL:
            return None
        command = ctx.call.input.get("command")
        if not isinstance(command, str):
            return None
        from kiso.runtime.floor import check_command

        refusal = check_command(command, workspace=ctx.workspace, home=ctx.home)
        if refusal is None:
            return None
        return Verdict("deny", "floor", refusal.reason)


class RulesPolicy:
    name = "rules"

    def __init__(self, rules: RulesFile) -> None:
        self.rules = rules

    def decide(self, ctx: CallContext) -> Verdict | None:
        rule = self.rules.match(ctx.call, ctx.tool, ctx.workspace)
        if rule is None:
            return None
        return Verdict(
            "allow", f"rule:{rule.text}", f"allowed by the rule '{rule.text}'", rule.text
        )


def compose(policies: Sequence[Policy], ctx: CallContext, *, unattended: bool = False) -> Verdict:
    """deny > allow > ask; abstain is no opinion; a raising policy asks; no opinion asks."""
    verdicts: list[Verdict] = []
    for policy in policies:
        try:
            verdict = policy.decide(ctx)
        except Exception as exc:  # a broken policy must not decide silently
            verdict = Verdict("ask", policy.name, f"the policy {policy.name} failed: {exc}")
        if verdict is not None:
            verdicts.append(verdict)
    for decision in ("deny", "allow", "ask"):
        chosen = next((v for v in verdicts if v.decision == decision), None)
        if chosen is not None:
            break
    else:
        chosen = Verdict("ask", "default")
    if chosen.decision == "ask" and unattended:
        return Verdict(
            "deny",
            "mode:dontAsk",
            "dontAsk mode denies what would need a human's approval",
        )
    return chosen
