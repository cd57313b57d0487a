"""The child side of delegation: what a kiso started by ``delegate`` may do.

The parent (:mod:`kiso.runtime.subagents`) starts each child as an ordinary headless kiso with
these environment variables; :func:`child_role` reads them and :func:`kiso.cli.setup.prepare`
applies the result:

==========================  ===========================================================
``KISO_SUBAGENT_DEPTH``     1 in a child (absent or 0: not a child). A child is never
                            offered ``delegate``: delegation does not nest.
``KISO_SUBAGENT_ROLE``      explorer, reviewer (read-only tools), implementer, tester
                            (every tool)
``KISO_SUBAGENT_SCOPE``     a JSON list of path globs relative to the workspace: writes
                            outside them are denied, and the ``shell`` tool (and any
                            other tool that is neither a read nor a file edit) is not
                            offered, since nothing could keep a command inside them
``KISO_SUBAGENT_PARENT``    the parent session id (the child's header ``parent``)
==========================  ===========================================================

The role's policy (:class:`RoleHook`) allows the role's tools without asking: a child is
headless and the human approved the delegation. The catastrophe floor still applies (a deny
outranks an allow), and so does every other hook's deny.

Scope globs: ``*`` and ``?`` stay within one path segment, ``**`` spans any number of them,
and a glob also covers everything under the directory it names (``src`` covers ``src/a.py``).
A path is matched after symbolic links are resolved, so a link cannot lead a write out.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kiso.kernel import UsageError, ascii_int
from kiso.kernel.ids import SESSION_ID_PATTERN
from kiso.runtime.globs import glob_regex
from kiso.runtime.hooks import CallContext, Hook, Verdict
from kiso.tools.base import Effects, Tool

__all__ = [
    "READ_ONLY_ROLES",
    "ROLES",
    "WORKTREE_ROLES",
    "ChildRole",
    "RoleHook",
    "child_role",
    "in_scope",
    "scope_problem",
]

ROLES = ("explorer", "reviewer", "implementer", "tester")
READ_ONLY_ROLES = frozenset({"explorer", "reviewer"})
"""Roles that read only, in the parent's own workspace."""
WORKTREE_ROLES = frozenset({"implementer", "tester"})
"""Roles that get every tool, in a detached git worktree of the parent's repository."""


@dataclass(frozen=True, slots=True)
class ChildRole:
    """What this process is, when a parent's ``delegate`` started it."""

    role: str
    parent: str
    depth: int = 1
    scope: tuple[str, ...] = ()

    def restrict(self, tools: Sequence[Tool]) -> list[Tool]:
        """The tools this role is offered, in their order (never ``delegate``)."""
        kept = [t for t in tools if t.name != "delegate"]
        if self.role in READ_ONLY_ROLES:
            return [t for t in kept if t.effects is Effects.READ]
        if self.scope:
            return [t for t in kept if t.effects in (Effects.READ, Effects.EDIT)]
        return kept

    def hook(self, tools: Sequence[Tool]) -> RoleHook:
        return RoleHook(self, frozenset(t.name for t in tools))


class RoleHook(Hook):
    """Allows the role's tools without asking; denies a write outside the scope, and any tool
    the role was not offered."""

    def __init__(self, role: ChildRole, allowed: frozenset[str]) -> None:
        self.role = role
        self.allowed = allowed
        self.name = f"subagent:{role.role}"

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        name = ctx.call.name
        if ctx.tool is None or name not in self.allowed:
            return Verdict("deny", self.name, f"a {self.role.role} subagent has no tool {name!r}")
        if self.role.scope and ctx.tool.effects is Effects.EDIT:
            path = ctx.call.input.get("path")
            if not isinstance(path, str) or not in_scope(path, ctx.workspace, self.role.scope):
                allowed = ", ".join(self.role.scope)
                return Verdict(
                    "deny",
                    self.name,
                    f"{path!r} is outside this task's scope; it may write only: {allowed}",
                )
        return Verdict("allow", self.name, f"the {self.role.role} role allows {name}")


def child_role(environ: Mapping[str, str] | None = None) -> ChildRole | None:
    """The role this process was started with, or None when it is not a subagent. Raises
    :class:`UsageError` naming the variable when the environment is inconsistent."""
    env = os.environ if environ is None else environ
    raw_depth = env.get("KISO_SUBAGENT_DEPTH", "").strip()
    if raw_depth in ("", "0"):
        return None
    if ascii_int(raw_depth) is None:
        raise UsageError(f"KISO_SUBAGENT_DEPTH must be a whole number, got {raw_depth!r}")
    role = env.get("KISO_SUBAGENT_ROLE", "")
    if role not in ROLES:
        raise UsageError(
            f"KISO_SUBAGENT_DEPTH is {raw_depth}, so this is a subagent, but "
            f"KISO_SUBAGENT_ROLE is {role!r}: it must be one of {', '.join(ROLES)}"
        )
    parent = env.get("KISO_SUBAGENT_PARENT", "")
    if not SESSION_ID_PATTERN.fullmatch(parent):
        raise UsageError(f"KISO_SUBAGENT_PARENT must be the parent session id, got {parent!r}")
    scope: tuple[str, ...] = ()
    raw_scope = env.get("KISO_SUBAGENT_SCOPE", "")
    if raw_scope:
        try:
            value = json.loads(raw_scope)
        except ValueError:
            value = None
        if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
            raise UsageError(
                f"KISO_SUBAGENT_SCOPE must be a JSON list of path globs, got {raw_scope!r}"
            )
        for glob in value:
            problem = scope_problem(glob)
            if problem is not None:
                raise UsageError(f"KISO_SUBAGENT_SCOPE: {problem}")
        scope = tuple(value)
    return ChildRole(role, parent, int(raw_depth), scope)


def scope_problem(glob: str) -> str | None:
    """Why ``glob`` cannot be a scope entry, or None."""
    if not glob.strip():
        return "a scope glob is empty"
    if glob.startswith(("/", "~")) or "\\" in glob or "\x00" in glob:
        return f"scope glob {glob!r} must be a path relative to the workspace, with '/' separators"
    if ".." in glob.split("/"):
        return f"scope glob {glob!r} must not contain '..'"
    return None


def in_scope(path: str, workspace: Path, scope: Sequence[str]) -> bool:
    """Whether ``path`` (relative to ``workspace``, or absolute) falls under one of ``scope``."""
    root = os.path.realpath(workspace)
    target = os.path.realpath(os.path.join(root, os.path.expanduser(path)))
    if target != root and os.path.commonpath((root, target)) != root:
        return False
    rel = os.path.relpath(target, root).replace(os.sep, "/")
    parts = rel.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(_glob(g).fullmatch(c) for g in scope for c in candidates)


def _glob(glob: str) -> re.Pattern[str]:
    text = glob.strip().strip("/")
    while text.startswith("./"):
        text = text[2:]
    return glob_regex(text, any_depth=True)
