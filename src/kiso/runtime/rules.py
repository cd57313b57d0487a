""" "Don't ask again": allow-only rules in a file a person can read, edit and delete.

``$KISO_HOME/dont-ask-again.rules``, one rule per line, each under the section that says where it
applies::

    # comments and blank lines are ignored
    [project /home/ana/app]    the rules below apply only in this project
    shell: npm test            a command prefix: "npm test", "npm test -- -k x"
    edit_file: src/**          a path glob, relative to the workspace

    [every project]            the rules below apply wherever kiso runs
    read_file                  the whole tool

A session's project is the git root of its workspace (the nearest directory at or above it
holding ``.git``), else the workspace itself; a ``[project <path>]`` section applies when its path,
symlinks resolved, is that project, and never anywhere else (not in another repository nested
inside it either). The file lives in ``$KISO_HOME``, never in a repository, so a cloned repository
cannot carry grants. Rules above the first section were written by a kiso that did not record a
scope: they apply in every project (:func:`unscoped_notice` says so, and how to scope them).

A rule can only allow. It never allows a shell command with control operators, substitutions or
redirections (``;``, ``&&``, ``|``, ``$(``, backticks, ``>``...), never a destructive one (``rm``,
``git reset --hard``... as :func:`kiso.runtime.floor.destructive_commands` finds them, whatever the
rule's prefix says: ``shell: git reset`` does not allow ``git reset --hard``), never a file tool on
a path under ``.git/`` or ``.kiso/``, and the floor denies before any rule is consulted
(deny > allow), so a destructive command or a write into ``.git`` reaches a human every time.
Deleting a line revokes it; deleting the file revokes them all. A malformed line or section is a
loud error naming the file and line.
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

__all__ = [
    "EVERY_PROJECT",
    "RULES_FILE",
    "Grant",
    "Rule",
    "RulesError",
    "RulesFile",
    "destructive",
    "project_of",
    "rule_for",
    "unscoped_notice",
]

RULES_FILE = "dont-ask-again.rules"
HEADER = (
    '# kiso: "don\'t ask again" rules. Allow-only: each line lets one tool (and, for shell, a\n'
    "# command prefix; for files, a path glob) run without asking. Delete a line, or this file,\n"
    "# to be asked again. Destructive commands and writes into .git/ or .kiso/ always ask.\n"
    "# Rules under a [project /path] line apply only in that project (its git root, else the\n"
    "# directory kiso runs in); rules under [every project] apply wherever kiso runs.\n"
)
EVERY_PROJECT = "[every project]"
_LINE = re.compile(r"^(?P<tool>[A-Za-z0-9_\-]+)(?:\s*:\s*(?P<pattern>.*\S))?\s*$")
_SECTION = re.compile(r"^\[\s*(?P<body>.*?)\s*\]$")
_EVERY = re.compile(r"^every\s+project$")
_PROJECT = re.compile(r"^project\s+(?P<path>.+)$")
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


def project_of(workspace: str | os.PathLike[str]) -> Path:
    """The project a session in ``workspace`` belongs to: the git root of the workspace (symlinks
    resolved), else the workspace itself. A project-scoped rule applies only there."""
    from kiso.runtime.prompt import git_root

    real = Path(os.path.realpath(workspace))
    return git_root(real) or real


@dataclass(frozen=True, slots=True)
class Grant:
    """A rule as the file holds it: where it applies, and the line it is on."""

    rule: Rule
    project: str | None
    """The project's path as the section names it (``~`` expanded); None: every project."""
    line: int
    unscoped: bool = False
    """Above the first section: written by a kiso that recorded no scope (every project)."""

    @property
    def scope(self) -> str:
        """``every project``, or ``project <path>``: where the rule applies, for a person."""
        return "every project" if self.project is None else f"project {self.project}"


def _section_line(project: str | os.PathLike[str] | None) -> str:
    return EVERY_PROJECT if project is None else f"[project {os.fspath(project)}]"


def _same(a: str, b: str | os.PathLike[str]) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


class RulesFile:
    """The rules file, read fresh on every decision so that an edit takes effect at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._where = os.fspath(path)
        self._cache: tuple[tuple[int, int, int], list[Grant]] | None = None

    def grants(self) -> list[Grant]:
        """Every rule in the file with its scope (re-read whenever its size, mtime or inode
        change); a malformed line or section raises :class:`RulesError` naming it."""
        try:
            st = os.stat(self._where)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise RulesError(f"cannot read {self.path}: {exc.strerror}") from None
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._cache is not None and self._cache[0] == stamp:
            return list(self._cache[1])
        grants = self._parse()
        self._cache = (stamp, grants)
        return list(grants)

    def load(self) -> list[Rule]:
        """Every rule in the file, whatever project it applies in."""
        return [g.rule for g in self.grants()]

    def in_force(self, workspace: str | os.PathLike[str]) -> list[Grant]:
        """The rules that apply in ``workspace``'s project: its own section's, then every
        project's. Another project's never do."""
        grants = self.grants()
        if not grants:
            return []
        project = project_of(workspace)
        mine = {p for p in {g.project for g in grants} if p is not None and _same(p, project)}
        return [g for g in grants if g.project in mine] + [g for g in grants if g.project is None]

    def unscoped(self) -> list[Grant]:
        """The rules written without a scope (above the first section): they apply everywhere."""
        return [g for g in self.grants() if g.unscoped]

    def _parse(self) -> list[Grant]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise RulesError(f"cannot read {self.path}: {exc.strerror}") from None
        grants: list[Grant] = []
        project: str | None = None
        unscoped = True
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            if stripped.startswith("["):
                project, unscoped = self._section(stripped, number), False
                continue
            m = _LINE.match(stripped)
            if m is None:
                raise RulesError(
                    f"{self.path}, line {number}: {stripped!r} is not a rule; write "
                    f"'tool' or 'tool: pattern' (or delete the line)"
                )
            grants.append(Grant(Rule(m["tool"], m["pattern"]), project, number, unscoped))
        return grants

    def _section(self, stripped: str, number: int) -> str | None:
        """The project a section line names, None for ``[every project]``; else a loud error."""
        m = _SECTION.match(stripped)
        every = m is not None and _EVERY.match(m["body"]) is not None
        named = _PROJECT.match(m["body"]) if m is not None else None
        if every:
            return None
        if named is None:
            raise RulesError(
                f"{self.path}, line {number}: {stripped!r} is not a section; write "
                f"'[project /absolute/path/of/the/project]' or '{EVERY_PROJECT}'"
            )
        path = os.path.expanduser(named["path"].strip())
        if not os.path.isabs(path):
            raise RulesError(
                f"{self.path}, line {number}: the project in {stripped!r} is not an absolute "
                f"path; write '[project /absolute/path/of/the/project]'"
            )
        return path

    def find(self, call: ToolCall, tool: Tool | None, workspace: Path) -> Grant | None:
        """The first rule in force in ``workspace``'s project that allows ``call``, or None."""
        for grant in self.in_force(workspace):
            if grant.rule.matches(call, tool, workspace):
                return grant
        return None

    def match(self, call: ToolCall, tool: Tool | None, workspace: Path) -> Rule | None:
        grant = self.find(call, tool, workspace)
        return grant.rule if grant is not None else None

    def add(self, rule: Rule, *, project: str | os.PathLike[str] | None) -> None:
        """Write ``rule`` under ``project``'s section (None: ``[every project]``), creating the
        section at the end if there is none; atomically (rewritten and renamed into place).

        ``project`` is recorded as given: pass :func:`project_of` the session's workspace."""
        if project is not None and ("\n" in os.fspath(project) or "\r" in os.fspath(project)):
            raise RulesError(f"a project path with a line break cannot be written to {self.path}")
        grants = self.grants()
        if any(
            g.rule == rule
            and (g.project is None if project is None else g.project and _same(g.project, project))
            for g in grants
        ):
            return
        try:
            current = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = HEADER
        lines = current.splitlines()
        at: int | None = None  # after the last rule of the section's last block
        inside = False
        for index, line in enumerate(lines):
            stripped = line.strip()
            if stripped.startswith("["):
                named = self._section(stripped, index + 1)
                inside = (
                    named is None
                    if project is None
                    else named is not None and _same(named, project)
                )
                if inside:
                    at = index + 1
            elif inside and stripped and not stripped.startswith("#"):
                at = index + 1
        if at is None:
            if lines and lines[-1].strip():
                lines.append("")
            lines += [_section_line(project), rule.text]
        else:
            lines.insert(at, rule.text)
        make_private_dirs(self.path.parent)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, ("\n".join(lines) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "rules": [r.text for r in self.load()]}


def unscoped_notice(rules: RulesFile, workspace: str | os.PathLike[str]) -> str | None:
    """What to tell a person whose rules file holds rules written without a scope (by a kiso
    before scopes): that they apply in every project, and how to scope them. None if it holds
    none. Reads the file (a malformed one raises :class:`RulesError`)."""
    old = rules.unscoped()
    if not old:
        return None
    texts = ", ".join(f"'{g.rule.text}'" for g in old[:3]) + (", ..." if len(old) > 3 else "")
    lines = f"line {old[0].line}" if len(old) == 1 else f"lines {old[0].line}-{old[-1].line}"
    return (
        f'the "don\'t ask again" rules above the first section of {rules.path} ({lines}: '
        f"{texts}) apply in every project: they were written before rules had a scope. To keep "
        f"a rule to this project, move its line under a '[project {project_of(workspace)}]' "
        f"line; to keep it everywhere, under '{EVERY_PROJECT}' (and this notice stops)"
    )
