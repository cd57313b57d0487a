"""What an approval may offer: one decision, made by the runtime, that every edge only renders.

:func:`approval_offer` says, for a call waiting for a human, which "don't ask again" rule choosing
it would write (or, in words for a person, why none is offered) and the one warning line the call
carries. An edge (the terminal's panel, a server, an SDK host) shows that; it does not read the
command itself. The shell command is read by the floor's parser (tree-sitter-bash, through
:func:`kiso.runtime.floor.destructive_commands`), the only one there is:

* a destructive command anywhere in the line (``rm``, ``find -delete``, ``git reset --hard``...,
  in pipelines, lists, subshells, ``$( )``, ``sh -c``, ``eval``, ``xargs``, wrappers,
  here-documents fed to a shell) gets no rule, whatever it aims at;
* an irreversible delete (recursive ``rm``, ``find -delete``/``-exec rm``, ``git checkout --``,
  ``git reset --hard``, ``git clean -f``) carries one warning naming what goes; nothing else
  carries one ("a warning on every dangerous command teaches the eye to skip warnings");
* everything else gets the narrowest rule (:func:`kiso.runtime.rules.rule_for`), or none for
  compound commands and paths under ``.git/``, ``.kiso/`` or outside the workspace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kiso.kernel import ToolCall
from kiso.runtime.floor import Destruction, destructive_commands
from kiso.runtime.rules import Rule, rule_for
from kiso.tools.base import Effects, Tool

__all__ = [
    "COMPOUND",
    "DESTRUCTIVE",
    "IRREVERSIBLE",
    "NO_COMMAND",
    "OUTSIDE",
    "OUTSIDE_SANDBOX",
    "PROTECTED",
    "UNKNOWN_TOOL",
    "UNREADABLE",
    "Offer",
    "approval_offer",
    "refuse_always",
]

IRREVERSIBLE = "an irreversible delete is asked about every time"
UNREADABLE = "a command the safety floor cannot read through is asked about every time"
DESTRUCTIVE = "destructive commands always ask"
COMPOUND = "compound commands, substitutions and redirections always ask"
NO_COMMAND = "a shell call without a command cannot have a rule"
PROTECTED = "paths under .git/ or .kiso/ always ask"
OUTSIDE = "paths outside the workspace always ask"
UNKNOWN_TOOL = "a tool kiso does not know cannot have a rule"
OUTSIDE_SANDBOX = "a command outside the sandbox is asked about every time"


@dataclass(frozen=True, slots=True)
class Offer:
    """What the approval of one call may offer, as the runtime decided it."""

    rule: Rule | None
    """The "don't ask again" rule choosing it would write; None when it is not offered."""
    no_rule_because: str | None
    """Why "don't ask again" is not offered, for a person (None when it is)."""
    warning: str | None
    """The one warning line: only for irreversible deletes, naming what goes; else None."""
    destructions: tuple[Destruction, ...] = ()
    """Every destructive command the floor's parser found in a shell call."""
    project: Path | None = None
    """The project "don't ask again" scopes the rule to (:func:`kiso.runtime.rules.project_of`
    the workspace; ``Agent.offer`` fills it in). "In every project" is the other, explicit scope."""


def approval_offer(call: ToolCall, tool: Tool | None, workspace: Path, home: Path) -> Offer:
    """What approving ``call`` may offer: its rule, or why it has none, and its warning. Pure."""
    if tool is None:
        return Offer(None, UNKNOWN_TOOL, None)
    if tool.effects is Effects.SHELL:
        command = call.input.get("command")
        if not isinstance(command, str) or not command.strip():
            return Offer(None, NO_COMMAND, None)
        if call.input.get("outside_sandbox") is True:
            found = destructive_commands(command, workspace=workspace, home=home)
            return Offer(None, OUTSIDE_SANDBOX, None, found)
        found = destructive_commands(command, workspace=workspace, home=home)
        irreversible = [d for d in found if d.irreversible]
        if irreversible:
            warning = "; ".join(dict.fromkeys(d.warning for d in irreversible))
            readable = any(d.kind != "unreadable" for d in irreversible)
            return Offer(None, IRREVERSIBLE if readable else UNREADABLE, warning, found)
        if found:
            return Offer(None, DESTRUCTIVE, None, found)
        rule = rule_for(call, tool, workspace)
        return Offer(rule, None if rule is not None else COMPOUND, None, found)
    rule = rule_for(call, tool, workspace)
    if rule is not None:
        return Offer(rule, None, None)
    path = call.input.get("path")
    inside = isinstance(path, str) and _inside(path, workspace)
    return Offer(None, PROTECTED if inside else OUTSIDE, None)


def refuse_always(call: ToolCall, tool: Tool | None, workspace: Path, home: Path) -> str | None:
    """Why ``approve(always=True)`` must refuse this call (no rule may cover it), or None."""
    return approval_offer(call, tool, workspace, home).no_rule_because


def _inside(path: str, workspace: Path) -> bool:
    """Lexically, as the rules read paths: no file system access."""
    relative = os.path.relpath(os.path.normpath(os.path.join(workspace, path)), workspace)
    return relative != ".." and not relative.startswith("../")
