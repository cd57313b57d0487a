"""The system prompt kiso-code sends: how to work, where it is, and the project's instructions.

:func:`build_system_prompt` puts together, in this order:

1. the built-in instructions (:data:`BASE_PROMPT`): what kiso is and how to work — read before
   editing, prefer ``edit_file``, run the checks, be brief — or the text of
   ``--system-prompt-file`` in their place;
2. the environment: the workspace path, the OS and the shell the ``shell`` tool runs, today's
   date, and, in a git repository, the branch and a short status (read with
   :func:`kiso.tools.gitsafe.safe_git`, so no program the repository names runs);
3. the project's instructions: in every directory from the git root (or the workspace, outside a
   repository) down to the workspace, ``AGENTS.md`` — or ``CLAUDE.md`` where there is no
   AGENTS.md — nearest last, at most :data:`INSTRUCTIONS_CAP` bytes in all (the cut is said);
4. ``--append-system-prompt``'s text.

A file that is a symlink is read only when it resolves inside the repository (a cloned
``AGENTS.md -> ~/.ssh/id_rsa`` would otherwise send the key to the model provider).

The prompt in force is recorded in the session's log (a ``setting_changed`` with key
``system_prompt``) the first time it is sent, and a resumed session keeps the recorded one even
if AGENTS.md changed since (:attr:`kiso.runtime.Session.system_prompt`), so its requests are
byte-identical. docs/adr/0014-the-system-prompt-is-recorded.md says why.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BASE_PROMPT",
    "INSTRUCTIONS_CAP",
    "INSTRUCTION_FILES",
    "Instructions",
    "SystemPrompt",
    "build_system_prompt",
    "estimate_tokens",
    "find_instructions",
    "git_root",
    "git_summary",
]

INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md")
"""The project instruction files, by preference: CLAUDE.md is read only where AGENTS.md is not."""
INSTRUCTIONS_CAP = 32 * 1024
"""Bytes of project instructions kept, all files together."""
STATUS_LINES = 10
"""Lines of ``git status --short`` shown; the rest are counted."""

BASE_PROMPT = """\
You are kiso, a coding agent. You work in the user's project through tools: read_file, \
list_dir, search_text, write_file, edit_file and shell. Every tool call and its result is \
recorded; calls with side effects may need the user's approval, and a denied call comes back \
with the reason.

How to work:
- Read before you edit: look at the files and the code around a change before making it, and \
follow the project's conventions.
- Change existing files with edit_file (exact replacements); use write_file for new files or a \
full rewrite.
- After a change, run the project's checks (its tests, linters or build) with shell and fix what \
you broke. Say what you ran and what it printed; never claim a check passed that you did not run.
- Keep changes to what was asked. Do not commit, push or delete work unless asked.
- Be brief: answer in a few sentences, lead with the result, and show code only when it helps."""


def estimate_tokens(text: str) -> int:
    """A token count for ``text`` without a tokenizer: about four bytes a token."""
    return (len(text.encode("utf-8")) + 3) // 4


@dataclass(frozen=True, slots=True)
class Instructions:
    path: Path
    text: str
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    text: str
    sources: tuple[str, ...] = ()
    """The instruction files it includes, farthest first."""

    @property
    def tokens(self) -> int:
        return estimate_tokens(self.text)


def git_root(workspace: Path) -> Path | None:
    """The nearest directory at or above ``workspace`` holding ``.git`` (a directory or a
    worktree's file), or None."""
    for directory in (workspace, *workspace.parents):
        if os.path.lexists(directory / ".git"):
            return directory
    return None


def _read_inside(path: Path, root: Path, limit: int) -> tuple[str, bool] | None:
    """The text of ``path`` (at most ``limit`` bytes, and whether it was cut) if it is a regular
    file that resolves inside ``root``; None otherwise."""
    try:
        real = Path(os.path.realpath(path))
        if real != root and root not in real.parents:
            return None
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    cut = len(data) > limit
    return data[:limit].decode("utf-8", "replace"), cut


def find_instructions(workspace: Path, *, cap: int = INSTRUCTIONS_CAP) -> list[Instructions]:
    """AGENTS.md (else CLAUDE.md) of every directory from the git root down to ``workspace``,
    farthest first, within ``cap`` bytes in all."""
    workspace = Path(os.path.realpath(workspace))
    root = git_root(workspace) or workspace
    chain = [workspace, *workspace.parents]
    directories = list(reversed(chain[: chain.index(root) + 1]))
    found: list[Instructions] = []
    left = cap
    for directory in directories:
        for name in INSTRUCTION_FILES:
            if left <= 0:
                break
            read = _read_inside(directory / name, root, left)
            if read is None:
                continue
            text, cut = read
            found.append(Instructions(directory / name, text, cut))
            left -= len(text.encode("utf-8"))
            break
    return found


def git_summary(workspace: Path) -> str | None:
    """``branch X; N changed`` and the first lines of ``git status --short``, or None outside
    a repository (or when git is missing or slow)."""
    if git_root(workspace) is None:
        return None
    from kiso.tools.gitsafe import safe_git

    try:
        result = safe_git(["status", "--short", "--branch", "--no-renames"], workspace, timeout=3)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    lines = result.stdout.decode("utf-8", "replace").splitlines()
    if not lines:
        return None
    head, changes = lines[0], lines[1:]
    branch = head[3:] if head.startswith("## ") else head
    if branch.startswith("No commits yet on "):
        branch = branch.removeprefix("No commits yet on ") + " (no commits yet)"
    summary = [f"branch {branch}; " + (f"{len(changes)} changed" if changes else "clean")]
    summary += [f"  {line}" for line in changes[:STATUS_LINES]]
    if len(changes) > STATUS_LINES:
        summary.append(f"  … and {len(changes) - STATUS_LINES} more")
    return "\n".join(summary)


def _shell() -> str:
    return "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"


def build_system_prompt(
    workspace: str | os.PathLike[str],
    *,
    today: _dt.date | None = None,
    base: str | None = None,
    append: str | None = None,
) -> SystemPrompt:
    """The system prompt for a session in ``workspace``: ``base`` replaces the built-in
    instructions (``--system-prompt-file``), ``append`` is added at the end
    (``--append-system-prompt``)."""
    ws = Path(os.path.realpath(workspace))
    date = today or _dt.date.today()
    system = platform.system() or "unknown OS"
    env = [
        f"- Working directory (the workspace; tools resolve paths against it): {ws}",
        f"- OS: {system} {platform.release()} ({platform.machine()}); the shell tool runs "
        f"{_shell()}",
        f"- Today's date: {date.isoformat()}",
    ]
    git = git_summary(ws)
    if git is not None:
        first, *rest = git.splitlines()
        env.append(f"- Git: {first}")
        env += [f"  {line}" for line in rest]
    else:
        env.append("- Git: not a git repository")
    parts = [(base if base is not None else BASE_PROMPT).strip(), "Environment:\n" + "\n".join(env)]
    found = find_instructions(ws)
    if found:
        blocks = []
        for item in found:
            shown = os.path.relpath(item.path, ws)
            body = item.text.rstrip("\n")
            if item.truncated:
                body += f"\n[cut: project instructions are capped at {INSTRUCTIONS_CAP} bytes]"
            blocks.append(f'<instructions path="{shown}">\n{body}\n</instructions>')
        parts.append(
            "Project instructions (from the repository; the nearest directory's come last and "
            "win where they disagree):\n" + "\n".join(blocks)
        )
    if append:
        parts.append(append.strip())
    return SystemPrompt("\n\n".join(parts) + "\n", tuple(str(i.path) for i in found))
