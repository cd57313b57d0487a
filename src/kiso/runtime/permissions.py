"""Declarative permissions: ``allow``, ``ask`` and ``deny`` lists of tool patterns.

From the user config, a trusted project config (``deny`` and ``ask`` only: a project may tighten,
never loosen) and the flags ``--allowed-tools`` / ``--disallowed-tools``::

    "permissions": {"allow": ["shell(npm test)", "shell(git diff:*)", "edit_file(src/**)"],
                    "ask":   ["shell(git push:*)"],
                    "deny":  ["shell(rm:*)", "mcp__git__*", "read_file(.env)"]}

A pattern is ``Tool`` (the whole tool) or ``Tool(specifier)``. ``Tool`` may hold ``*``
(``mcp__git__*``, ``mcp__*``, ``*``). The specifier of a shell call is a command: ``npm test``
exactly, or ``git diff:*`` for the words ``git diff`` followed by anything (word by word:
``git diff --stat``, never ``git difftool``). For any other tool it is a path glob
(:mod:`kiso.runtime.globs`: ``*`` within a segment, ``**`` across them), relative to the
workspace unless it starts with ``/`` (absolute) or ``~/`` (the home directory).

How a rule matches depends on its list, erring on the safe side:

* an ``allow`` never allows a compound shell command (``;``, ``&&``, ``|``, ``$(``, backticks,
  redirections...), a destructive one (``rm``, ``git reset --hard``..., as the floor finds
  them), nor a file tool on a path under ``.git/`` or ``.kiso/`` or outside the workspace: the
  same limits as the "don't ask again" rules (:mod:`kiso.runtime.rules`);
* a ``deny`` or ``ask`` matches a shell command when any simple command in it matches, wherever
  it stands: after ``;``, ``&&`` or ``|``, inside ``$( )``, behind ``sudo``, ``env``, ``xargs``
  or in a ``sh -c "..."`` string (the line is split into words as the shell would, once as
  written and once with its quotes taken out). A path outside the workspace is matched by its
  ``../`` form, and a call with nothing a specifier could match (no path) is matched.

The hooks (:class:`PermissionsHook`, :class:`PermissionsAllowHook`) sit in the approval chain
(:mod:`kiso.runtime.approvals`) below the floor: deny > ask > allow among the rules, a deny in
every mode (``bypass`` too), an ask even where the mode would allow (``accept-edits``,
``bypass``; nobody to ask in ``dontAsk`` or a headless run: denied), an allow where the mode
would ask, never where it denies (``plan``). ``decided_by`` is ``permissions:<list>:<pattern>``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from kiso.kernel import ToolCall, UsageError
from kiso.runtime.globs import glob_regex
from kiso.runtime.hooks import CallContext, Hook, Verdict
from kiso.runtime.rules import _SHELL_META, PROTECTED_DIRS, destructive
from kiso.tools.base import Effects, Tool

__all__ = [
    "LISTS",
    "Pattern",
    "PermissionRule",
    "Permissions",
    "PermissionsAllowHook",
    "PermissionsError",
    "PermissionsHook",
    "parse_config",
    "parse_flags",
    "parse_pattern",
    "permission_hooks",
    "split_patterns",
]

Kind = Literal["allow", "ask", "deny"]
LISTS: tuple[Kind, ...] = ("allow", "ask", "deny")
ALLOWED_FLAG = "--allowed-tools"
DISALLOWED_FLAG = "--disallowed-tools"
_TOOL = re.compile(r"[A-Za-z0-9_\-*]+")
_SEPARATORS = "();<>|&`\n"
_SHAPE = (
    "write Tool or Tool(specifier), e.g. shell(npm test), shell(git diff:*), edit_file(src/**), "
    "mcp__git__*"
)


class PermissionsError(UsageError):
    """A malformed permissions entry or pattern; the caller adds the file and key, or the flag."""


@dataclass(frozen=True, slots=True)
class Pattern:
    """``Tool`` or ``Tool(specifier)``, as parsed."""

    tool: str
    specifier: str | None = None

    @property
    def text(self) -> str:
        return self.tool if self.specifier is None else f"{self.tool}({self.specifier})"

    def names(self, tool: str) -> bool:
        if "*" not in self.tool:
            return tool == self.tool
        return _wildcard(self.tool).fullmatch(tool) is not None

    @property
    def prefix(self) -> bool:
        """A shell specifier ending in ``:*``: a prefix of words."""
        return self.specifier is not None and self.specifier.endswith(":*")

    @property
    def words(self) -> list[str]:
        spec = self.specifier or ""
        return (spec[:-2] if self.prefix else spec).split()


@dataclass(frozen=True, slots=True)
class PermissionRule:
    kind: Kind
    pattern: Pattern
    source: str
    """Where it was written: a config file's path, ``--allowed-tools`` or ``--disallowed-tools``."""

    @property
    def decided_by(self) -> str:
        return f"permissions:{self.kind}:{self.pattern.text}"

    @property
    def said(self) -> str:
        """Where it was written, for a reason: ``--disallowed-tools``, ``permissions.deny in F``."""
        if self.source.startswith("--"):
            return self.source
        return f"permissions.{self.kind} in {self.source}"

    def matches(self, call: ToolCall, tool: Tool | None, workspace: Path, home: Path) -> bool:
        if not self.pattern.names(call.name):
            return False
        effects = tool.effects if tool is not None else Effects.OTHER
        if effects is Effects.SHELL:
            command = call.input.get("command")
            if not isinstance(command, str):
                return self.kind != "allow"
            if self.kind == "allow":
                return _allows_command(self.pattern, command, workspace)
            return self.pattern.specifier is None or _names_command(self.pattern, command)
        path = _path_of(call, tool)
        if self.kind == "allow":
            if path is not None:
                relative = _inside(path, workspace)
                if relative is None or _protected(relative):
                    return False
                return self.pattern.specifier is None or _glob_matches(
                    self.pattern.specifier, relative, path, workspace, home
                )
            return self.pattern.specifier is None
        if self.pattern.specifier is None or path is None:
            return True  # deny/ask: a call the specifier cannot judge is matched
        relative = os.path.relpath(os.path.normpath(os.path.join(workspace, path)), workspace)
        return _glob_matches(self.pattern.specifier, relative, path, workspace, home)


@dataclass(frozen=True, slots=True)
class Permissions:
    """Every rule in force, from every source."""

    rules: tuple[PermissionRule, ...] = ()

    def plus(self, other: Permissions) -> Permissions:
        return Permissions(self.rules + other.rules)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def first(
        self, kind: Kind, call: ToolCall, tool: Tool | None, workspace: Path, home: Path
    ) -> PermissionRule | None:
        for rule in self.rules:
            if rule.kind == kind and rule.matches(call, tool, workspace, home):
                return rule
        return None

    def hides(self, tool: str) -> bool:
        """A ``deny`` of the whole tool: the model is not shown it at all."""
        return any(
            r.kind == "deny" and r.pattern.specifier is None and r.pattern.names(tool)
            for r in self.rules
        )

    def unknown(self, tools: Iterable[str]) -> list[str]:
        """A note for each pattern that names no tool in ``tools`` (MCP patterns excepted: their
        servers may not be up yet), with the closest name when there is one."""
        names = sorted(set(tools))
        notes: list[str] = []
        for rule in self.rules:
            pattern = rule.pattern
            if pattern.tool.startswith("mcp__") or any(pattern.names(n) for n in names):
                continue
            close = difflib.get_close_matches(pattern.tool, names, n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            notes.append(
                f"permissions: {rule.kind} {pattern.text} ({rule.said}) names no tool kiso "
                f"offers{hint}"
            )
        return notes

    def describe(self) -> dict[str, list[str]]:
        return {kind: [r.pattern.text for r in self.rules if r.kind == kind] for kind in LISTS}


# --------------------------------------------------------------------------- parsing


def parse_pattern(text: str) -> Pattern:
    """One pattern; :class:`PermissionsError` saying what is wrong with it otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise PermissionsError(f"an empty pattern; {_SHAPE}")
    written = text.strip()
    open_at = written.find("(")
    tool = written if open_at < 0 else written[:open_at].strip()
    if not _TOOL.fullmatch(tool):
        if ")" in written and open_at < 0:
            raise PermissionsError(f"{written!r} has a ')' with no '('; {_SHAPE}")
        raise PermissionsError(
            f"{written!r}: a tool name is letters, digits, '_', '-' and '*'; {_SHAPE}"
        )
    if open_at < 0:
        return Pattern(tool)
    if not written.endswith(")"):
        raise PermissionsError(f"{written!r} has an unclosed '('; {_SHAPE}")
    spec = written[open_at + 1 : -1].strip()
    if not _balanced(spec):
        raise PermissionsError(f"{written!r} has unbalanced parentheses; {_SHAPE}")
    if not spec:
        raise PermissionsError(
            f"{written!r} has an empty specifier: write {tool} for the whole tool"
        )
    if tool == "shell":
        body = spec[:-2] if spec.endswith(":*") else spec
        if not body.strip():
            raise PermissionsError(
                f"{written!r}: a command prefix needs words before ':*' (write shell for every "
                f"command)"
            )
        if "*" in body:
            raise PermissionsError(
                f"{written!r}: a shell pattern is an exact command or a prefix ending in ':*' "
                f"(shell(npm run:*)); '*' elsewhere is not a wildcard"
            )
        spec = " ".join(body.split()) + (":*" if spec.endswith(":*") else "")
    return Pattern(tool, spec)


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def split_patterns(values: Iterable[str]) -> list[str]:
    """Patterns from flag values: separated by commas and/or spaces, outside parentheses
    (``"shell(npm test),read_file edit_file(src/**)"`` is three)."""
    out: list[str] = []
    for value in values:
        depth, word = 0, list[str]()
        for char in value:
            if char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
            if depth <= 0 and (char == "," or char.isspace()):
                if word:
                    out.append("".join(word))
                word = []
                continue
            word.append(char)
        if word:
            out.append("".join(word))
    return out


def parse_flags(allowed: Iterable[str], disallowed: Iterable[str]) -> Permissions:
    """The rules of ``--allowed-tools`` and ``--disallowed-tools``; an error names the flag."""
    rules: list[PermissionRule] = []
    given: tuple[tuple[str, Kind, list[str]], ...] = (
        (ALLOWED_FLAG, "allow", list(allowed)),
        (DISALLOWED_FLAG, "deny", list(disallowed)),
    )
    for flag, kind, values in given:
        patterns = split_patterns(values)
        if values and not patterns:
            raise PermissionsError(f"{flag}: no pattern given; {_SHAPE}")
        for text in patterns:
            try:
                pattern = parse_pattern(text)
            except PermissionsError as exc:
                raise PermissionsError(f"{flag}: {exc}") from None
            rules.append(PermissionRule(kind, pattern, flag))
    return Permissions(tuple(rules))


def parse_config(raw: Any, where: str, *, project: bool) -> Permissions:
    """``"permissions": {"allow": [...], "ask": [...], "deny": [...]}`` of the file ``where``;
    the message of an error starts with the key (the caller adds the file)."""
    if not isinstance(raw, Mapping):
        raise PermissionsError(
            'permissions: must be an object such as {"allow": [], "ask": [], "deny": []}'
        )
    unknown = sorted(set(raw) - set(LISTS))
    if unknown:
        raise PermissionsError(
            f"permissions.{unknown[0]}: unknown key; known keys: allow, ask, deny"
        )
    if project and raw.get("allow"):
        raise PermissionsError(
            "permissions.allow: a project config may only tighten permissions (deny, ask), "
            "never allow; put allow rules in your user config (~/.kiso/config.json) or pass "
            "--allowed-tools"
        )
    rules: list[PermissionRule] = []
    for kind in LISTS:
        entries = raw.get(kind, [])
        if not isinstance(entries, list):
            raise PermissionsError(
                f'permissions.{kind}: must be a list of patterns such as ["shell(npm test)"]'
            )
        for index, text in enumerate(entries):
            if not isinstance(text, str):
                raise PermissionsError(
                    f"permissions.{kind}[{index}]: must be a pattern string, got {text!r}"
                )
            try:
                pattern = parse_pattern(text)
            except PermissionsError as exc:
                raise PermissionsError(f"permissions.{kind}[{index}]: {exc}") from None
            rules.append(PermissionRule(kind, pattern, where))
    return Permissions(tuple(rules))


# --------------------------------------------------------------------------- matching


def _wildcard(tool: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in tool.split("*")))


def _allows_command(pattern: Pattern, command: str, workspace: Path) -> bool:
    if not command.strip() or _SHELL_META.search(command):
        return False
    if pattern.specifier is not None:
        words, wanted = command.split(), pattern.words
        if pattern.prefix:
            if words[: len(wanted)] != wanted:
                return False
        elif words != wanted:
            return False
    return not destructive(command, workspace)


def _names_command(pattern: Pattern, command: str) -> bool:
    """Does any simple command in ``command`` match (deny and ask)? Conservative: every run of
    words between operators is tried from every position, as written and unquoted."""
    from kiso.runtime.floor.parse import tolerant_tokens

    wanted = pattern.words
    unquoted = command.replace('"', " ").replace("'", " ")
    for source in (command, unquoted):
        segment: list[str] = []
        for token in [*tolerant_tokens(source), ";"]:
            if token and all(c in _SEPARATORS for c in token):
                if _segment_matches(segment, wanted, pattern.prefix):
                    return True
                segment = []
            else:
                segment.append(token)
    return False


def _segment_matches(words: Sequence[str], wanted: Sequence[str], prefix: bool) -> bool:
    n = len(wanted)
    for i in range(len(words) - n + 1):
        first = words[i]
        if first != wanted[0] and not first.endswith("/" + wanted[0]):
            continue
        if list(words[i + 1 : i + n]) != list(wanted[1:]):
            continue
        if prefix or i + n == len(words):
            return True
    return False


def _path_of(call: ToolCall, tool: Tool | None) -> str | None:
    path = call.input.get("path")
    if isinstance(path, str):
        return path
    properties = tool.parameters.get("properties", {}) if tool is not None else {}
    if isinstance(properties, dict) and "path" in properties and "path" not in call.input:
        return "."  # list_dir, search_text: the workspace when no path is given
    return None


def _inside(path: str, workspace: Path) -> str | None:
    absolute = os.path.normpath(os.path.join(workspace, path))
    rel = os.path.relpath(absolute, workspace)
    return None if rel == ".." or rel.startswith("../") else PurePosixPath(rel).as_posix()


def _protected(relative: str) -> bool:
    return any(part in PROTECTED_DIRS for part in PurePosixPath(relative).parts)


def _glob_matches(spec: str, relative: str, path: str, workspace: Path, home: Path) -> bool:
    if spec.startswith(("/", "~/")):
        absolute = os.path.normpath(os.path.join(workspace, os.path.expanduser(path)))
        target = os.path.normpath(str(home) + spec[1:]) if spec.startswith("~/") else spec
        return glob_regex(target, any_depth=True).fullmatch(absolute) is not None
    return glob_regex(spec, any_depth=True).fullmatch(relative) is not None


# --------------------------------------------------------------------------- the hooks


class PermissionsHook(Hook):
    """The ``deny`` and ``ask`` rules: they only ever tighten (constrain-only), so an ask wins
    over a mode's or a rule's allow, and a deny over everything but the floor's own deny."""

    name = "permissions"
    constrain_only = True

    def __init__(self, permissions: Permissions) -> None:
        self.permissions = permissions

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        for kind in ("deny", "ask"):
            rule = self.permissions.first(kind, ctx.call, ctx.tool, ctx.workspace, ctx.home)
            if rule is not None:
                verb = "denied" if kind == "deny" else "always asks"
                reason = f"{verb} by the permission rule {rule.pattern.text} ({rule.said})"
                return Verdict(kind, rule.decided_by, reason)
        return None


class PermissionsAllowHook(Hook):
    """The ``allow`` rules: allow-only, like the "don't ask again" rules."""

    name = "permissions"
    allow_only = True

    def __init__(self, permissions: Permissions) -> None:
        self.permissions = permissions

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        rule = self.permissions.first("allow", ctx.call, ctx.tool, ctx.workspace, ctx.home)
        if rule is None:
            return None
        reason = f"allowed by the permission rule {rule.pattern.text} ({rule.said})"
        return Verdict("allow", rule.decided_by, reason)


def permission_hooks(permissions: Permissions | None) -> list[Hook]:
    """The two hooks, or none when there are no rules."""
    if not permissions:
        return []
    return [PermissionsHook(permissions), PermissionsAllowHook(permissions)]
