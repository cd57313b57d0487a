"""Skills: instructions a model loads when it needs them, one resident line each until then.

A skill is a directory holding ``SKILL.md``, whose first lines are a ``---`` fenced frontmatter
with two keys, ``name`` (the directory's name) and ``description`` (one line)::

    ---
    name: release
    description: Cut a release: bump the version, tag, write the changelog
    ---
    1. Read CHANGELOG.md ...

Three tiers, so a skill costs one line of prompt until it is used:

1. :func:`skills_prompt` — one index line per skill (``- <name>: <description>``), for the system
   prompt;
2. :func:`read_skill_tool` — the ``read_skill`` tool returns the body (after the frontmatter),
   capped at :data:`BODY_CAP` bytes with the cut said; an unknown name lists the installed ones;
3. the skill's other files: ``read_skill`` with ``file`` (a path inside the skill's directory),
   the same cap.

Where skills come from (:func:`discover_skills`), user first:

* ``$KISO_SKILLS_DIR`` if set, else ``$KISO_HOME/skills`` (``<dir>/<name>/SKILL.md``);
* the project's ``.kiso/skills/<name>/SKILL.md``, only when the trust gate applied the project,
  parsed from the bytes the gate hashed (:attr:`kiso.runtime.trust.Gate.project_files`), never
  re-read from disk.

A project never shadows a user's skill: the user's wins and a notice says so. A file that is not
a skill (no frontmatter, no ``name`` or ``description``, a ``name`` that is not its directory's)
is skipped with a notice naming it, never an error. Parsing (:func:`parse_skill`) is pure; only
:func:`discover_skills` and the tool's user-file reads touch the disk.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kiso.kernel import UsageError
from kiso.tools.base import Tool, ToolContext, ToolResult, define_tool

__all__ = [
    "BODY_CAP",
    "FILE_CAP",
    "SKILL_FILE",
    "Skill",
    "SkillError",
    "Skills",
    "discover_skills",
    "find_skill",
    "parse_frontmatter",
    "parse_skill",
    "read_skill_tool",
    "skill_turn",
    "skills_dir",
    "skills_prompt",
]

SKILL_FILE = "SKILL.md"
BODY_CAP = 32 * 1024
"""Bytes of a skill's body (or of one of its other files) ``read_skill`` returns."""
FILE_CAP = 1024 * 1024
"""Bytes of a user's SKILL.md read from disk; a larger file is skipped with a notice."""
PROJECT_SKILLS = "skills"
"""Where a project's skills live, relative to its ``.kiso/`` (the trust snapshot's keys)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

Source = Literal["user", "project"]


class SkillError(UsageError):
    """A SKILL.md is not a skill; the message names the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    description: str
    body: str
    """SKILL.md after its frontmatter."""
    path: str
    """Where it came from, for messages: an absolute path."""
    source: Source = "user"
    files: Mapping[str, bytes] | None = field(default=None, compare=False, repr=False)
    """A project skill's other files (relative path → the trusted bytes); None for a user
    skill, whose files are read from :attr:`directory` when asked for."""

    @property
    def directory(self) -> Path:
        return Path(self.path).parent


@dataclass(frozen=True, slots=True)
class Skills:
    """What :func:`discover_skills` found: the skills by name, and what to tell the user."""

    skills: tuple[Skill, ...] = ()
    notices: tuple[str, ...] = ()


# ------------------------------------------------------------------------------ pure parsing


def parse_frontmatter(text: str, *, where: str = "SKILL.md") -> tuple[dict[str, str], str]:
    """The ``key: value`` pairs of the ``---`` block opening ``text``, and the rest (the body).

    Only flat ``key: value`` lines (values may be quoted); blank lines and ``#`` comments are
    skipped. Raises :class:`SkillError` naming ``where`` when there is no closed block.
    """
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise SkillError(
            f"{where}: has no frontmatter; start it with a '---' line, then 'name: ...' and "
            f"'description: ...', then '---'"
        )
    values: dict[str, str] = {}
    for i, line in enumerate(lines[1:], start=1):
        stripped = line.strip()
        if stripped == "---":
            return values, "".join(lines[i + 1 :])
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition(":")
        if not sep or not key.strip():
            raise SkillError(
                f"{where}: frontmatter line {i + 1} is not 'key: value' ({stripped[:60]!r})"
            )
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    raise SkillError(f"{where}: the frontmatter is never closed; end it with a '---' line")


def parse_skill(
    directory: str,
    text: str,
    *,
    path: str,
    source: Source = "user",
    files: Mapping[str, bytes] | None = None,
) -> Skill:
    """The skill in ``text`` (a SKILL.md found in ``directory``), or :class:`SkillError`."""
    values, body = parse_frontmatter(text, where=path)
    name, description = values.get("name", ""), values.get("description", "")
    if not name:
        raise SkillError(f"{path}: the frontmatter has no 'name'; add 'name: {directory}'")
    if not description:
        raise SkillError(
            f"{path}: the frontmatter has no 'description'; add one line saying when to use it"
        )
    if name != directory:
        raise SkillError(
            f"{path}: its name {name!r} differs from its directory {directory!r}; rename one "
            f"so they match"
        )
    if not _NAME.fullmatch(name):
        raise SkillError(
            f"{path}: name {name!r} must be letters, digits, '.', '_' or '-' (at most 64)"
        )
    return Skill(name, " ".join(description.split()), body.lstrip("\n"), path, source, files)


def skills_prompt(skills: Sequence[Skill]) -> str:
    """The resident index for the system prompt: a heading and one line per skill, or ``""``."""
    if not skills:
        return ""
    lines = [f"- {s.name}: {s.description}" for s in sorted(skills, key=lambda s: s.name)]
    return (
        "Available skills (load one with read_skill before doing what it describes):\n"
        + "\n".join(lines)
    )


def skill_turn(skill: Skill, args: str = "") -> str:
    """The user turn ``/<name> [args]`` sends: run the skill, with the arguments if any."""
    args = args.strip()
    turn = f"Run the skill {skill.name!r}: load it with read_skill and follow it."
    return f"{turn}\nArguments: {args}" if args else turn


def find_skill(skills: Iterable[Skill], name: str) -> Skill | None:
    return next((s for s in skills if s.name == name), None)


def _merge(user: Sequence[Skill], project: Sequence[Skill]) -> tuple[list[Skill], list[str]]:
    by_name = {s.name: s for s in user}
    notices: list[str] = []
    for skill in project:
        mine = by_name.get(skill.name)
        if mine is not None:
            notices.append(
                f"skill {skill.name!r}: the project's {skill.path} is not used; your own "
                f"{mine.path} wins (a project never replaces a user's skill)"
            )
            continue
        by_name[skill.name] = skill
    return sorted(by_name.values(), key=lambda s: s.name), notices


# ------------------------------------------------------------------------------------- I/O


def skills_dir(home: Path, environ: Mapping[str, str] | None = None) -> Path:
    """``$KISO_SKILLS_DIR``, else ``<home>/skills``."""
    env = os.environ if environ is None else environ
    return Path(env["KISO_SKILLS_DIR"]) if env.get("KISO_SKILLS_DIR") else home / "skills"


def discover_skills(
    home: Path,
    *,
    environ: Mapping[str, str] | None = None,
    project_files: Mapping[str, bytes] | None = None,
    project_root: Path | None = None,
) -> Skills:
    """The user's skills and, when ``project_files`` (the trust gate's bytes) are given, the
    project's; a bad file is a notice, never an exception."""
    notices: list[str] = []
    user = _user_skills(skills_dir(home, environ), notices)
    project = _project_skills(project_files or {}, project_root, notices)
    merged, shadowed = _merge(user, project)
    return Skills(tuple(merged), tuple(notices + shadowed))


def _user_skills(root: Path, notices: list[str]) -> list[Skill]:
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    except OSError as exc:
        notices.append(f"{root}: cannot list the skills ({exc.strerror}); none of them loaded")
        return []
    found: list[Skill] = []
    for directory in names:
        if directory.startswith(".") or not (root / directory).is_dir():
            continue
        path = root / directory / SKILL_FILE
        raw = _read_regular(path, FILE_CAP)
        if isinstance(raw, str):
            if raw != "missing":
                notices.append(f"{path}: {raw}; skill {directory!r} not loaded")
            else:
                notices.append(f"{root / directory}: has no {SKILL_FILE}; not a skill")
            continue
        found += _parsed(directory, raw, str(path), "user", files=None, notices=notices)
    return found


def _project_skills(
    files: Mapping[str, bytes], root: Path | None, notices: list[str]
) -> list[Skill]:
    base = (root / ".kiso" if root is not None else Path(".kiso")) / PROJECT_SKILLS
    found: list[Skill] = []
    for rel in sorted(files):
        parts = rel.split("/")
        if len(parts) != 3 or parts[0] != PROJECT_SKILLS or parts[2] != SKILL_FILE:
            continue
        directory = parts[1]
        prefix = f"{PROJECT_SKILLS}/{directory}/"
        own = {k.removeprefix(prefix): v for k, v in files.items() if k.startswith(prefix)}
        path = str(base / directory / SKILL_FILE)
        found += _parsed(directory, files[rel], path, "project", files=own, notices=notices)
    return found


def _parsed(
    directory: str,
    raw: bytes,
    path: str,
    source: Source,
    *,
    files: Mapping[str, bytes] | None,
    notices: list[str],
) -> list[Skill]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        notices.append(f"{path}: not UTF-8 text (byte {exc.start}); skill not loaded")
        return []
    try:
        return [parse_skill(directory, text, path=path, source=source, files=files)]
    except SkillError as exc:
        notices.append(f"{exc}; skill not loaded")
        return []


def _read_regular(path: Path, cap: int) -> bytes | str:
    """The bytes of the regular file ``path`` (not following a final symlink), or why not:
    ``"missing"`` or a sentence."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        if os.path.islink(path):
            return "is a symbolic link, which kiso does not follow"
        return f"cannot open it ({exc.strerror})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "is not a regular file"
        data = os.read(fd, cap + 1)
    except OSError as exc:
        return f"cannot read it ({exc.strerror})"
    finally:
        os.close(fd)
    if len(data) > cap:
        return f"larger than {cap} bytes"
    return data


# ---------------------------------------------------------------------------------- the tool


def _capped(text: str, what: str) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= BODY_CAP:
        return text
    kept = raw[:BODY_CAP].decode("utf-8", "ignore")
    return f"{kept}\n[cut: {what} is {len(raw)} bytes; read_skill returns at most {BODY_CAP}]"


def _skill_file(skill: Skill, rel: str) -> str | ToolResult:
    parts = rel.replace("\\", "/").split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return ToolResult(
            f"file {rel!r}: give a path inside the skill's directory, such as "
            f"'scripts/check.sh' (no '..', not absolute)",
            is_error=True,
            error_kind="invalid_input",
        )
    clean = "/".join(parts)
    if skill.files is not None:
        data = skill.files.get(clean)
        if data is None:
            listed = ", ".join(sorted(k for k in skill.files if k != SKILL_FILE)) or "none"
            return ToolResult(
                f"skill {skill.name!r} has no file {clean!r}; its files: {listed}",
                is_error=True,
                error_kind="precondition",
            )
    else:
        target = skill.directory.joinpath(*parts)
        real, root = os.path.realpath(target), os.path.realpath(skill.directory)
        if not real.startswith(root + os.sep):
            return ToolResult(
                f"file {clean!r} of skill {skill.name!r} resolves outside the skill's directory; "
                f"kiso reads only files inside it",
                is_error=True,
                error_kind="precondition",
            )
        got = _read_regular(Path(real), FILE_CAP)
        if isinstance(got, str):
            why = "does not exist" if got == "missing" else got
            return ToolResult(
                f"file {clean!r} of skill {skill.name!r} {why}",
                is_error=True,
                error_kind="precondition",
            )
        data = got
    return _capped(data.decode("utf-8", "replace"), f"{clean}")


def read_skill_tool(skills: Sequence[Skill]) -> Tool:
    """The ``read_skill`` tool over ``skills`` (read-only: it changes nothing)."""
    by_name = {s.name: s for s in skills}

    def execute(args: dict[str, Any], ctx: ToolContext) -> str | ToolResult:
        name = str(args.get("name", ""))
        skill = by_name.get(name)
        if skill is None:
            installed = ", ".join(sorted(by_name)) or "none"
            return ToolResult(
                f"no skill named {name!r}; installed skills: {installed}",
                is_error=True,
                error_kind="invalid_input",
            )
        rel = args.get("file")
        if isinstance(rel, str) and rel and rel != SKILL_FILE:
            return _skill_file(skill, rel)
        head = (
            f"[skill {skill.name} from {skill.path}; its other files: read_skill with "
            f"name={skill.name!r} and file=<path inside its directory>]\n"
        )
        return head + _capped(skill.body, f"skill {skill.name!r}")

    return define_tool(
        "read_skill",
        "Load a skill listed under 'Available skills': its instructions (name), or one of its "
        "other files (name and file, a path inside the skill's directory).",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The skill's name, as listed"},
                "file": {
                    "type": "string",
                    "description": "Optional: a file of the skill, relative to its directory",
                },
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        execute,
        effects="read",
    )
