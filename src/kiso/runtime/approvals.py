"""The approval chain: ``before_tool`` hooks that allow, deny, ask or abstain; deny > allow > ask.

The chain for a call is: the catastrophe floor (:class:`FloorHook`, deny only, in every mode),
the session's mode (:class:`ModeHook`), the "don't ask again" rules (:class:`RulesHook`), the
declarative permissions (:class:`PermissionsHook` for deny and ask, which only tighten, and
:class:`PermissionsAllowHook`; :mod:`kiso.runtime.permissions`), then
the agent's own hooks and policies (:mod:`kiso.runtime.hooks`): built-ins plug in exactly as
extensions do. Every hook sees every call; the composition takes the first deny, else the first
allow, else the first ask (its hook is the "speaker" of the question). A hook that raises counts
as an ask. If every hook abstains, a human is asked. A ``constrain_only`` hook (every extension's
hooks, :mod:`kiso.runtime.extensions`) composes the same way among its kind, but its verdict
replaces the built-in chain's only where it is stricter (deny > ask > allow): an extension can
ask about or deny a call the mode allows, never allow one the floor, the mode or a rule would
deny or ask about. In ``dontAsk`` mode an ask becomes a deny,
and in a headless run (nobody to ask) it becomes a deny by ``headless`` naming the modes that
would allow the call (:func:`allowing_modes`).

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

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kiso.kernel import UsageError
from kiso.runtime.hooks import CallContext, Hook, Policy, PolicyHook, Verdict
from kiso.runtime.permissions import PermissionsAllowHook, PermissionsHook
from kiso.runtime.rules import PROTECTED_DIRS, RulesFile
from kiso.tools.base import Effects
from kiso.tools.sandbox import Sandbox

__all__ = [
    "MODES",
    "CallContext",
    "FloorHook",
    "ModeHook",
    "PermissionsAllowHook",
    "PermissionsHook",
    "Policy",
    "RulesHook",
    "SandboxHook",
    "Verdict",
    "allowing_modes",
    "as_hooks",
    "check_mode",
    "compose",
]

MODES = ("default", "accept-edits", "plan", "dontAsk", "bypass")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    return mode


def _effects(ctx: CallContext) -> Effects:
    return ctx.tool.effects if ctx.tool is not None else Effects.OTHER


class ModeHook(Hook):
    """The session's approval mode (``ctx.mode``), as the voice ``mode:<name>``."""

    name = "mode"

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        mode = ctx.mode
        by = f"mode:{mode}"
        effects = _effects(ctx)
        if mode == "bypass":
            return Verdict("allow", by, "bypass mode allows every call")
        if effects is Effects.READ:
            return Verdict("allow", by, "reads are allowed")
        if mode == "plan":
            return Verdict(
                "deny", by, "plan mode is read-only: describe the change instead of making it"
            )
        if mode == "accept-edits" and effects is Effects.EDIT:
            path = ctx.call.input.get("path")
            parts = Path(str(path)).parts if isinstance(path, str) else ()
            if any(p in PROTECTED_DIRS for p in parts):
                return Verdict("ask", by, "edits under .git/ or .kiso/ always ask")
            return Verdict("allow", by, "accept-edits mode allows file edits")
        if mode == "dontAsk":
            return None  # abstain: an ask from the composition becomes a deny
        return Verdict("ask", by)


class FloorHook(Hook):
    """The catastrophe floor: denies destructive commands on unrecoverable targets."""

    name = "floor"

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def before_tool(self, ctx: CallContext) -> Verdict | None:
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


class RulesHook(Hook):
    """The "don't ask again" rules in force in the session's project: allow-only."""

    name = "rules"
    allow_only = True

    def __init__(self, rules: RulesFile) -> None:
        self.rules = rules

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        grant = self.rules.find(ctx.call, ctx.tool, ctx.workspace)
        if grant is None:
            return None
        rule = grant.rule
        where = f"{grant.scope}, {self.rules.path} line {grant.line}"
        return Verdict(
            "allow", f"rule:{rule.text}", f"allowed by the rule '{rule.text}' ({where})", rule.text
        )


class SandboxHook(Hook):
    """A ``shell`` call asking to run ``outside_sandbox`` is put to a person, whatever the mode
    or a rule says (it only tightens); with nobody to ask (headless, ``dontAsk``) it is denied.
    Without a working sandbox the flag changes nothing, so it abstains."""

    name = "sandbox"
    constrain_only = True

    def __init__(self, sandbox: Callable[[], Sandbox | None]) -> None:
        self.sandbox = sandbox

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        sandbox = self.sandbox()
        if sandbox is None or not sandbox.available or _effects(ctx) is not Effects.SHELL:
            return None
        if ctx.call.input.get("outside_sandbox") is not True:
            return None
        why = ctx.call.input.get("justification")
        said = f": {why.strip()}" if isinstance(why, str) and why.strip() else ""
        return Verdict(
            "ask",
            "sandbox",
            f"runs OUTSIDE the {sandbox.mode} sandbox, with your full access{said}",
        )


def as_hooks(items: Iterable[Hook | Policy]) -> list[Hook]:
    """Hooks as given; an object with only ``decide(ctx)`` (a policy) becomes a hook."""
    return [item if isinstance(item, Hook) else PolicyHook(item) for item in items]


def compose(
    hooks: Sequence[Hook | Policy], ctx: CallContext, *, unattended: bool = False
) -> Verdict:
    """deny > allow > ask; abstain is no opinion; a raising hook asks; no opinion asks.

    ``unattended`` (``dontAsk``): an ask becomes a deny, because nobody is there to answer.
    """
    verdicts: list[Verdict] = []
    constrained: list[Verdict] = []  # from constrain_only hooks: they may only tighten
    settled = False  # an earlier hook allowed or denied: an allow-only hook can change nothing
    for hook in hooks:
        if settled and getattr(hook, "allow_only", False):
            continue
        try:
            verdict = hook.before_tool(ctx) if isinstance(hook, Hook) else hook.decide(ctx)
        except Exception as exc:  # a broken policy must not decide silently
            verdict = Verdict("ask", hook.name, f"the policy {hook.name} failed: {exc}")
        if verdict is not None:
            tighten_only = getattr(hook, "constrain_only", False)
            (constrained if tighten_only else verdicts).append(verdict)
            settled = settled or (verdict.decision != "ask" and not tighten_only)
    chosen = _strongest(verdicts)
    if constrained:
        theirs = _strongest(constrained)
        if _STRICTNESS[theirs.decision] > _STRICTNESS[chosen.decision]:
            chosen = theirs
    if chosen.decision == "ask" and unattended:
        return Verdict(
            "deny",
            "mode:dontAsk",
            "dontAsk mode denies what would need a human's approval",
        )
    return chosen


_STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}


def _strongest(verdicts: Sequence[Verdict]) -> Verdict:
    for decision in ("deny", "allow", "ask"):
        for verdict in verdicts:
            if verdict.decision == decision:
                return verdict
    return Verdict("ask", "default")


def allowing_modes(hooks: Sequence[Hook | Policy], ctx: CallContext) -> list[str]:
    """The modes in which the chain would allow this call without asking anyone."""
    from dataclasses import replace

    return [
        mode
        for mode in MODES
        if mode != ctx.mode and compose(hooks, replace(ctx, mode=mode)).decision == "allow"
    ]
