""" "Don't ask again": allow-only rules in a file a person can read, edit and delete.

``$KISO_HOME/dont-ask-again.rules``, one rule per line::

    # comments and blank lines are ignored
    shell: npm test            a command prefix: "npm test", "npm test -- -k x"
    edit_file: src/**          a path glob, relative to the workspace
    read_file                  the whole tool

A rule can only allow. It never allows a shell command with control operators, substitutions or
redirections (``;``, ``&&``, ``|``, ``$(``, backticks, ``>``...), never a destructive one (``rm``,
``git reset --hard``... as :func:`kiso.runtime.floor.destructive_commands` finds them, whatever the
rule's prefix says: ``shell: git reset`` does not allow ``git reset --hard``), never a file tool on
a path under ``.git/`` or ``.kiso/``, and the floor denies before any rule is consulted
(deny > allow), so a destructive command or a write into ``.git`` reaches a human every time.
Deleting a line revokes it; deleting the file revokes them all. A malformed line is a loud error
naming the file and line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from kiso.kernel import ToolCall, UsageError
from kiso.kernel.layout import make_private_dirs
from kiso.runtime.globs import glob_regex
from kiso.tools.base import Effects, Tool

__all__ = ["RULES_FILE", "Rule", "RulesError", "RulesFile", "destructive", "rule_for"]

RULES_FILE = "dont-ask-again.rules"
HEADER = (
    '# kiso: "don\'t ask again" rules. Allow-only: each line lets one tool (and, for shell, a\n'
    "# command prefix; for files, a path glob) run without asking. Delete a line, or this file,\n"
    "# to be asked again. Destructive commands and writes into .git/ or .kiso/ always ask.\n"
)
_LINE = re.compile(r"^(?P<tool>[A-Za-z0-9_\-]+)(?:\s*:\s*(?P<pattern>.*\S))?\s*$")
_SHELL_META = re.compile(r"[;&|<>`$()\n\\]")
PROTECTED_DIRS = (".git", ".kiso")


class RulesError(UsageError):
    """The rules file is malformed; the message names the file and the line."""


@dataclass(frozen=True, slots=True)
class Rule:
    tool: str
    pattern: str | None = None

    @property
    def text(self) -> str:
        return self.tool if self.pattern is None else f"{self.tool}: {self.pattern}"

    def matches(self, call: ToolCall, tool: Tool | None, workspace: Path) -> bool:
        if call.name != self.tool:
            return False
        effects = tool.effects if tool is not None else Effects.OTHER
        if effects is Effects.SHELL:
            command = call.input.get("command")
            if not isinstance(command, str) or _SHELL_META.search(command):
                return False
            if self.pattern is not None:
                words, prefix = command.split(), self.pattern.split()
                if words[: len(prefix)] != prefix:
                    return False
            return not destructive(command, workspace)
        path = call.input.get("path")
        if isinstance(path, str):
            relative = _relative(path, workspace)
            if relative is None or _protected(relative):
                return False
            return self.pattern is None or _glob(self.pattern).fullmatch(relative) is not None
        return self.pattern is None


def _relative(path: str, workspace: Path) -> str | None:
    absolute = os.path.normpath(os.path.join(workspace, path))
    try:
        rel = os.path.relpath(absolute, workspace)
    except ValueError:
        return None
    return None if rel == ".." or rel.startswith("../") else PurePosixPath(rel).as_posix()


def _protected(relative: str) -> bool:
    return any(part in PROTECTED_DIRS for part in PurePosixPath(relative).parts)


def _glob(pattern: str) -> re.Pattern[str]:
    return glob_regex(pattern)


def destructive(command: str, workspace: Path) -> bool:
    """Is there a destructive command in ``command``, whatever it aims at?

    Whether there is one does not depend on the home directory (only what it would reach does),
    so the workspace stands in for it. The parser is loaded on first use.
    """
    from kiso.runtime.floor import destructive_commands

    return bool(destructive_commands(command, workspace=workspace, home=workspace))


def rule_for(call: ToolCall, tool: Tool | None, workspace: Path) -> Rule | None:
    """The narrowest rule that would allow ``call`` again, or None where none may exist.

    None for a compound or destructive shell command and for a path under ``.git/``, ``.kiso/``
    or outside the workspace; :func:`kiso.runtime.offers.approval_offer` says which, and why.
    """
    effects = tool.effects if tool is not None else Effects.OTHER
    if effects is Effects.SHELL:
        command = call.input.get("command")
        if not isinstance(command, str) or not command.strip() or _SHELL_META.search(command):
            return None
        if destructive(command, workspace):
            return None
        return Rule(call.name, " ".join(command.split()))
    path = call.input.get("path")
    if isinstance(path, str):
        relative = _relative(path, workspace)
        if relative is None or _protected(relative):
            return None
        return Rule(call.name, relative)
    return Rule(call.name)


class RulesFile:
    """The rules file, read fresh on every decision so that an edit takes effect at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._where = os.fspath(path)
        self._cache: tuple[tuple[int, int, int], list[Rule]] | None = None

    def load(self) -> list[Rule]:
        """The rules as the file says now (re-read whenever its size, mtime or inode change)."""
        try:
            st = os.stat(self._where)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise RulesError(f"cannot read {self.path}: {exc.strerror}") from None
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._cache is not None and self._cache[0] == stamp:
            return list(self._cache[1])
        rules = self._parse()
        self._cache = (stamp, rules)
        return list(rules)

    def _parse(self) -> list[Rule]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise RulesError(f"cannot read {self.path}: {exc.strerror}") from None
        rules: list[Rule] = []
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            m = _LINE.match(stripped)
            if m is None:
                raise RulesError(
                    f"{self.path}, line {number}: {stripped!r} is not a rule; write "
                    f"'tool' or 'tool: pattern' (or delete the line)"
                )
            rules.append(Rule(m["tool"], m["pattern"]))
        return rules

    def match(self, call: ToolCall, tool: Tool | None, workspace: Path) -> Rule | None:
        for rule in self.load():
            if rule.matches(call, tool, workspace):
                return rule
        return None

    def add(self, rule: Rule) -> None:
        """Append ``rule`` (atomically: the file is rewritten and renamed into place)."""
        existing = self.load()
        if rule in existing:
            return
        try:
            current = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = HEADER
        if current and not current.endswith("\n"):
            current += "\n"
        make_private_dirs(self.path.parent)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, (current + rule.text + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "rules": [r.text for r in self.load()]}
