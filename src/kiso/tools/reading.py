"""The three reading tools: read_file, list_dir, search_text (effects ``read``)."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any

from kiso.tools._filecore import (
    BINARY_SNIFF,
    LIST_DEFAULT_DEPTH,
    LIST_MAX_DEPTH,
    LIST_MAX_ENTRIES,
    READ_DEFAULT_LINES,
    READ_LINE_CHARS,
    READ_MAX_LINES,
    SEARCH_DEFAULT_RESULTS,
    SEARCH_LINE_CHARS,
    SEARCH_MAX_FILE_BYTES,
    SEARCH_MAX_RESULTS,
    SKIPPED_DIRS,
    Refused,
    bool_arg,
    existing,
    guarded,
    int_arg,
    line_text,
    looks_binary,
    open_text,
    plural,
    real_root,
    regular_file,
    str_arg,
)
from kiso.tools.base import Effects, Tool, ToolContext, define_tool
from kiso.tools.paths import (
    PathOutsideWorkspace,
    display_path,
    open_beneath,
    open_dir_beneath,
    resolve_in_workspace,
)

__all__ = ["LIST_DIR", "READ_FILE", "SEARCH_TEXT"]

# ---------------------------------------------------------------------------------------------
# read_file


READ_FILE_DESCRIPTION = f"""\
Read a text file of the workspace, {READ_DEFAULT_LINES} lines at a time by default.

Lines come numbered like `cat -n` (line number, a tab, the line); the numbers are not part of the \
file. Lines longer than {READ_LINE_CHARS:,} characters are cut and marked. The result ends with a \
footer saying which lines were shown and how to continue, such as \
'[lines 1-200 of 950; continue with offset=201]' or '[lines 1-12 of 12 (end of file)]', and with \
'[rev:<revision>]'. Pass that revision to edit_file as expectedRevision so the edit is refused if \
the file changed in between. Directories (use list_dir) and binary files are refused.
"""

READ_FILE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "The file, relative to the workspace root (or absolute inside it).",
        },
        "offset": {
            "type": "integer",
            "minimum": 1,
            "description": "The first line to show, counting from 1 (default 1).",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": READ_MAX_LINES,
            "description": f"How many lines to show at most (default {READ_DEFAULT_LINES}).",
        },
    },
    "required": ["path"],
    "additionalProperties": False,
}


def _read_file(input: dict[str, Any], ctx: ToolContext) -> str:
    raw = str_arg(input, "path")
    offset = int_arg(input, "offset", 1, 1, None)
    limit = int_arg(input, "limit", READ_DEFAULT_LINES, 1, READ_MAX_LINES)
    target, shown = regular_file(ctx, raw)
    digest = hashlib.sha256()
    window: list[str] = []
    count = 0
    with open_text(ctx, target, shown) as fh:
        if looks_binary(fh.read(BINARY_SNIFF)):
            raise Refused(f"{shown} is a binary file (it contains NUL bytes); it was not read")
        fh.seek(0)
        for line in fh:
            digest.update(line)
            count += 1
            if offset <= count < offset + limit:
                window.append(_numbered(count, line_text(line)))
    if count == 0:
        footer = "[empty file: 0 lines]"
    elif offset > count:
        footer = (
            f"[offset {offset} is past the end of the file: it has {count} lines; "
            f"use an offset from 1 to {count}]"
        )
    else:
        last = offset + len(window) - 1
        if last < count:
            footer = f"[lines {offset}-{last} of {count}; continue with offset={last + 1}]"
        else:
            footer = f"[lines {offset}-{last} of {count} (end of file)]"
    trailer = f"[rev:{digest.hexdigest()[:16]}]"
    return "\n".join([*window, footer, trailer])


def _numbered(number: int, text: str) -> str:
    if len(text) > READ_LINE_CHARS:
        cut = f"[... line cut at {READ_LINE_CHARS:,} of {len(text):,} chars]"
        text = f"{text[:READ_LINE_CHARS]} {cut}"
    return f"{number:>6}\t{text}"


READ_FILE: Tool = define_tool(
    "read_file",
    READ_FILE_DESCRIPTION,
    READ_FILE_PARAMETERS,
    guarded(_read_file),
    effects=Effects.READ,
)


# ---------------------------------------------------------------------------------------------
# list_dir


LIST_DIR_DESCRIPTION = f"""\
List a directory of the workspace as an indented tree, sorted by name; directories end with '/' \
and symlinks show their target ('name -> target') without being followed.

depth 1 lists only the directory itself, 2 (the default) also its subdirectories, up to \
{LIST_MAX_DEPTH}. {", ".join(sorted(SKIPPED_DIRS))} are listed but not expanded. At most \
{LIST_MAX_ENTRIES} entries are shown, the shallowest first, with the true total: \
'[showing {LIST_MAX_ENTRIES} of 1,234 entries; ...]'. List a subdirectory to see more of it.
"""

LIST_DIR_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "The directory, relative to the workspace root (default '.').",
        },
        "depth": {
            "type": "integer",
            "minimum": 1,
            "maximum": LIST_MAX_DEPTH,
            "description": f"How many levels to list (default {LIST_DEFAULT_DEPTH}).",
        },
    },
    "additionalProperties": False,
}


@dataclass(slots=True)
class _Node:
    label: str
    depth: int
    children: list[_Node] = field(default_factory=list)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _scan(dir_fd: int, depth: int, max_depth: int) -> tuple[list[_Node], bool]:
    """The sorted entries of the opened directory ``dir_fd`` (recursing, by fds that never
    follow a symlink, up to ``max_depth``) and its readability."""
    try:
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda entry: entry.name)
    except OSError:
        return [], False
    nodes: list[_Node] = []
    for entry in entries:
        if entry.is_symlink():
            try:
                target = os.readlink(entry.name, dir_fd=dir_fd)
            except OSError:
                target = "?"
            nodes.append(_Node(f"{entry.name} -> {target}", depth))
        elif entry.is_dir(follow_symlinks=False):
            node = _Node(f"{entry.name}/", depth)
            if entry.name in SKIPPED_DIRS:
                node.label += " [not expanded]"
            elif depth < max_depth:
                try:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError:
                    node.label += " [unreadable]"
                else:
                    try:
                        node.children, readable = _scan(sub, depth + 1, max_depth)
                    finally:
                        os.close(sub)
                    if not readable:
                        node.label += " [unreadable]"
            nodes.append(node)
        else:
            nodes.append(_Node(entry.name, depth))
    return nodes, True


def _preorder(nodes: list[_Node]) -> Iterator[_Node]:
    for node in nodes:
        yield node
        yield from _preorder(node.children)


def _list_dir(input: dict[str, Any], ctx: ToolContext) -> str:
    raw = str_arg(input, "path", ".")
    depth = int_arg(input, "depth", LIST_DEFAULT_DEPTH, 1, LIST_MAX_DEPTH)
    target = existing(ctx, raw)
    shown = display_path(ctx.workspace, target)
    if not target.is_dir():
        raise Refused(f"{shown} is a file, not a directory; use read_file to read it")
    try:
        dir_fd = open_dir_beneath(real_root(ctx), target)
    except PermissionError:
        raise Refused(
            f"{shown} cannot be read (permission denied); list another directory"
        ) from None
    try:
        nodes, readable = _scan(dir_fd, 1, depth)
    finally:
        os.close(dir_fd)
    if not readable:
        raise Refused(f"{shown} cannot be read (permission denied); list another directory")
    ordered = list(_preorder(nodes))
    total = len(ordered)
    # Keep the shallowest entries: every parent is then kept before any of its children.
    by_depth = sorted(range(total), key=lambda i: (ordered[i].depth, i))
    keep = set(by_depth[:LIST_MAX_ENTRIES])
    lines = [shown if shown.endswith("/") else f"{shown}/"]
    lines += ["  " * node.depth + node.label for i, node in enumerate(ordered) if i in keep]
    if total == 0:
        lines.append("[empty directory]")
    elif total > LIST_MAX_ENTRIES:
        lines.append(
            f"[showing {LIST_MAX_ENTRIES} of {total:,} entries; list a subdirectory or use a "
            f"smaller depth to see the rest]"
        )
    else:
        lines.append(f"[{plural(total, 'entry', 'entries')}]")
    return "\n".join(lines)


LIST_DIR: Tool = define_tool(
    "list_dir", LIST_DIR_DESCRIPTION, LIST_DIR_PARAMETERS, guarded(_list_dir), effects=Effects.READ
)


# ---------------------------------------------------------------------------------------------
# search_text


SEARCH_TEXT_DESCRIPTION = f"""\
Search the text files of the workspace for lines matching a Python regular expression.

Each matching line is reported once as 'path:line: text', the path relative to the workspace root \
(ready for read_file) and the text cut to {SEARCH_LINE_CHARS} characters around the match. \
Binary files, files over {SEARCH_MAX_FILE_BYTES // (1024 * 1024)} MiB and the directories \
{", ".join(sorted(SKIPPED_DIRS))} are skipped. At most max_results lines are shown, with the true \
total: '[showing 200 of 3,456 matches in 87 files]'; narrow the pattern, path or glob to see the \
rest. Escape regex characters to match them literally (for example 'foo\\(' for 'foo(').
"""

SEARCH_TEXT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "minLength": 1,
            "description": "A Python regular expression, matched against each line.",
        },
        "path": {
            "type": "string",
            "description": "A directory to search recursively, or one file (default '.').",
        },
        "glob": {
            "type": "string",
            "description": "Only search files whose name matches, e.g. '*.py' or '*.{ts,tsx}'; "
            "a glob with '/' is matched against the workspace-relative path, e.g. 'src/**/*.py'.",
        },
        "case_sensitive": {
            "type": "boolean",
            "description": "Match case exactly (default true).",
        },
        "max_results": {
            "type": "integer",
            "minimum": 1,
            "maximum": SEARCH_MAX_RESULTS,
            "description": f"How many matching lines to show at most "
            f"(default {SEARCH_DEFAULT_RESULTS}).",
        },
    },
    "required": ["pattern"],
    "additionalProperties": False,
}


@dataclass(slots=True)
class _Tally:
    shown: list[str] = field(default_factory=list)
    matches: int = 0
    files_matched: int = 0
    files_searched: int = 0
    binary_skipped: int = 0
    large_skipped: int = 0


def _expand_braces(glob: str) -> list[str]:
    """'*.{ts,tsx}' -> ['*.ts', '*.tsx'] (nested and repeated groups too)."""
    match = re.search(r"\{([^{}]*)\}", glob)
    if match is None:
        return [glob]
    head, tail = glob[: match.start()], glob[match.end() :]
    return [out for alt in match.group(1).split(",") for out in _expand_braces(head + alt + tail)]


def _glob_matches(globs: list[str], rel: str) -> bool:
    name = PurePosixPath(rel).name
    for glob in globs:
        if "/" not in glob:
            if fnmatchcase(name, glob):
                return True
            continue
        # '*' also matches '/', so 'src/**/*.py' covers nested files; a '**/' step may be empty.
        variants = {glob, glob.replace("**/", "")}
        if glob.startswith("**/"):
            variants.add(glob[3:])
        if any(fnmatchcase(rel, v) if "/" in v else fnmatchcase(name, v) for v in variants):
            return True
    return False


_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC

Opener = Callable[[], int]
"""Opens one file to search (an fd), or raises OSError."""


def _search_files(ctx: ToolContext, top: Path) -> Iterator[tuple[str, Opener]]:
    """(shown path, opener) of the files under ``top``, in sorted order, walked by directory
    fds beneath the workspace (a directory swapped for a symlink is never entered).

    SKIPPED_DIRS are not entered, symlinked directories are not followed, and a symlinked file is
    searched (under its own name) only when its target is inside the workspace.
    """
    root = real_root(ctx)
    if not top.is_dir():
        yield display_path(ctx.workspace, top), lambda: open_beneath(root, top, _FILE_FLAGS)
        return
    top_fd = open_dir_beneath(root, top)
    try:
        for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=top_fd):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
            for name in sorted(filenames):
                path = Path(os.path.normpath(os.path.join(top, dirpath, name)))
                shown = display_path(ctx.workspace, path)
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    try:
                        real = resolve_in_workspace(ctx.workspace, str(path), must_exist=True)
                    except (PathOutsideWorkspace, OSError):
                        continue
                    yield shown, functools.partial(open_beneath, root, real, _FILE_FLAGS)
                elif stat.S_ISREG(st.st_mode):
                    yield shown, functools.partial(os.open, name, _FILE_FLAGS, dir_fd=dir_fd)
    finally:
        os.close(top_fd)


def _clip(text: str, start: int) -> str:
    """At most SEARCH_LINE_CHARS characters of ``text``, around the match at ``start``."""
    if len(text) <= SEARCH_LINE_CHARS:
        return text
    begin = max(0, min(start - 40, len(text) - SEARCH_LINE_CHARS))
    end = begin + SEARCH_LINE_CHARS
    return f"{'[...]' if begin else ''}{text[begin:end]}{'[...]' if end < len(text) else ''}"


def _search_one(
    opener: Opener, rel: str, regex: re.Pattern[str], limit: int, tally: _Tally
) -> None:
    try:
        fh = os.fdopen(opener(), "rb")
    except OSError:
        return  # unreadable files are skipped like binary ones
    try:
        with fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                return  # FIFOs, devices and sockets are never read
            if st.st_size > SEARCH_MAX_FILE_BYTES:
                tally.large_skipped += 1
                return
            if looks_binary(fh.read(BINARY_SNIFF)):
                tally.binary_skipped += 1
                return
            fh.seek(0)
            tally.files_searched += 1
            hits = 0
            for number, line in enumerate(fh, 1):
                text = line_text(line)
                found = regex.search(text)
                if found is None:
                    continue
                hits += 1
                if len(tally.shown) < limit:
                    tally.shown.append(f"{rel}:{number}: {_clip(text, found.start())}")
    except OSError:
        return  # unreadable files are skipped like binary ones
    tally.matches += hits
    tally.files_matched += 1 if hits else 0


def _search_text(input: dict[str, Any], ctx: ToolContext) -> str:
    pattern = str_arg(input, "pattern")
    raw = str_arg(input, "path", ".")
    glob = input.get("glob")
    if glob is not None and not isinstance(glob, str):
        raise Refused(f"glob must be a string such as '*.py', got {glob!r}")
    case_sensitive = bool_arg(input, "case_sensitive", True)
    limit = int_arg(input, "max_results", SEARCH_DEFAULT_RESULTS, 1, SEARCH_MAX_RESULTS)
    try:
        regex = re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
    except re.error as exc:
        raise Refused(
            f"invalid regular expression {pattern!r}: {exc}. Use Python re syntax; to match one "
            f"of . * + ? ( ) [ ] {{ }} | \\ ^ $ literally, put a backslash before it"
        ) from None
    top = existing(ctx, raw)
    if not top.is_dir() and not top.is_file():
        shown = display_path(ctx.workspace, top)
        raise Refused(f"{shown} is not a regular file or a directory; it cannot be searched")
    globs = _expand_braces(glob) if glob else None
    tally = _Tally()
    for rel, opener in _search_files(ctx, top):
        if globs is None or _glob_matches(globs, rel):
            _search_one(opener, rel, regex, limit, tally)
    skipped = []
    if tally.binary_skipped:
        skipped.append(f"{plural(tally.binary_skipped, 'binary file', 'binary files')} skipped")
    if tally.large_skipped:
        mib = SEARCH_MAX_FILE_BYTES // (1024 * 1024)
        skipped.append(f"{plural(tally.large_skipped, 'file', 'files')} over {mib} MiB skipped")
    notes = "".join(f"; {note}" for note in skipped)
    matches = plural(tally.matches, "match", "matches")
    in_files = plural(tally.files_matched, "file", "files")
    if tally.matches == 0:
        searched = plural(tally.files_searched, "file", "files")
        footer = f"[no matches in {searched} searched{notes}]"
    elif tally.matches > len(tally.shown):
        footer = f"[showing {len(tally.shown):,} of {matches} in {in_files}{notes}]"
    else:
        footer = f"[{matches} in {in_files}{notes}]"
    return "\n".join([*tally.shown, footer])


SEARCH_TEXT: Tool = define_tool(
    "search_text",
    SEARCH_TEXT_DESCRIPTION,
    SEARCH_TEXT_PARAMETERS,
    guarded(_search_text),
    effects=Effects.READ,
)
