"""The two writing tools: write_file (idempotent) and edit_file (effects ``edit``)."""

from __future__ import annotations

import difflib
from typing import Any

from kiso.tools._filecore import (
    _DIFF_BUDGET,
    EDIT_MAX_EDITS,
    Refused,
    guarded,
    looks_binary,
    parent_dir,
    read_at,
    regular_file,
    revision,
    str_arg,
)
from kiso.tools.atomic import atomic_write_at
from kiso.tools.base import Effects, Tool, ToolContext, define_tool
from kiso.tools.paths import display_path, refuse_symlink_at, resolve_in_workspace

__all__ = ["EDIT_FILE", "WRITE_FILE"]

# ---------------------------------------------------------------------------------------------
# write_file


WRITE_FILE_DESCRIPTION = """\
Create a file in the workspace, or replace the whole content of an existing one, atomically.

Missing parent directories are created and an existing file keeps its permissions. Returns \
'wrote N bytes to <path> [rev:<revision>]'. To change part of an existing file, prefer edit_file: \
it sends only the changed text and refuses to work on a stale copy.
"""

WRITE_FILE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "The file to write, relative to the workspace root.",
        },
        "content": {
            "type": "string",
            "description": "The complete new content of the file (written as UTF-8).",
        },
    },
    "required": ["path", "content"],
    "additionalProperties": False,
}


def _encode(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError as exc:
        raise Refused(
            f"{what} cannot be written as UTF-8 ({exc.reason} at character {exc.start}); "
            f"remove the unpaired surrogate and try again"
        ) from None


def _write_file(input: dict[str, Any], ctx: ToolContext) -> str:
    raw = str_arg(input, "path")
    content = str_arg(input, "content")
    target = resolve_in_workspace(ctx.workspace, raw)
    shown = display_path(ctx.workspace, target)
    if target.is_dir():
        raise Refused(f"{shown} is a directory; give the path of a file inside it")
    if target.exists() and not target.is_file():
        raise Refused(f"{shown} is not a regular file (a device, pipe or socket); not written")
    data = _encode(content, "content")
    try:
        with parent_dir(ctx, target, create=True) as (dir_fd, name):
            refuse_symlink_at(dir_fd, name, shown)
            atomic_write_at(dir_fd, name, data)
    except (FileExistsError, NotADirectoryError):
        raise Refused(
            f"cannot create the directory for {shown}: a file is in the way of "
            f"{display_path(ctx.workspace, target.parent)}; choose another path"
        ) from None
    except IsADirectoryError:
        raise Refused(f"{shown} is a directory; give the path of a file inside it") from None
    return f"wrote {len(data)} bytes to {shown} [rev:{revision(data)}]"


WRITE_FILE: Tool = define_tool(
    "write_file",
    WRITE_FILE_DESCRIPTION,
    WRITE_FILE_PARAMETERS,
    guarded(_write_file),
    effects=Effects.EDIT,
    idempotent=True,
)


# ---------------------------------------------------------------------------------------------
# edit_file


EDIT_FILE_DESCRIPTION = f"""\
Change an existing text file by replacing exact pieces of its text.

Each edit replaces oldText with newText. oldText must appear exactly once in the file, character \
for character (whitespace and indentation included, without read_file's line numbers); include a \
few surrounding lines to make it unique. Edits apply in order, each to the result of the previous \
one, 1 to {EDIT_MAX_EDITS} per call. Nothing is written unless every edit applies. Pass the \
revision read_file returned ('[rev:...]') as expectedRevision: if the file changed since, the \
edit is refused and you should read the file again. Returns a summary and the new revision.
"""

EDIT_FILE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "The file to edit, relative to the workspace root.",
        },
        "edits": {
            "type": "array",
            "minItems": 1,
            "maxItems": EDIT_MAX_EDITS,
            "description": "The replacements, applied in order.",
            "items": {
                "type": "object",
                "properties": {
                    "oldText": {
                        "type": "string",
                        "minLength": 1,
                        "description": "The exact text to replace; must occur exactly once.",
                    },
                    "newText": {
                        "type": "string",
                        "description": "The text to put in its place (may be empty).",
                    },
                },
                "required": ["oldText", "newText"],
                "additionalProperties": False,
            },
        },
        "expectedRevision": {
            "type": "string",
            "description": "The rev: value read_file returned for this file, e.g. "
            "'3f2a9c0b1d4e5f60'; the edit is refused if the file has changed since.",
        },
    },
    "required": ["path", "edits"],
    "additionalProperties": False,
}


def _preview(text: str, width: int = 60) -> str:
    return repr(text[:width]) + ("..." if len(text) > width else "")


def _positions(text: str, needle: str) -> list[int]:
    """Every start of ``needle`` in ``text``, overlapping ones included."""
    found: list[int] = []
    start = text.find(needle)
    while start != -1:
        found.append(start)
        start = text.find(needle, start + 1)
    return found


def _normal_revision(value: str) -> str:
    value = value.strip().strip("[]").strip()
    if value.lower().startswith("rev:"):
        value = value[4:]
    return value.strip().lower()[:16]


def _line_delta(before: str, after: str) -> tuple[int, int]:
    """Lines added and removed between two versions of a file (a line diff of what changed)."""
    old, new = before.splitlines(), after.splitlines()
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    end = 0
    while end < min(len(old), len(new)) - start and old[-1 - end] == new[-1 - end]:
        end += 1
    old, new = old[start : len(old) - end], new[start : len(new) - end]
    if len(old) * len(new) > _DIFF_BUDGET:
        return len(new), len(old)  # too big to diff quickly: count the changed span
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    added = removed = 0
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            removed += i2 - i1
            added += j2 - j1
    return added, removed


def _edits_arg(input: dict[str, Any]) -> list[tuple[str, str]]:
    edits = input.get("edits")
    if not isinstance(edits, list) or not 1 <= len(edits) <= EDIT_MAX_EDITS:
        raise Refused(
            f"edits must be a list of 1 to {EDIT_MAX_EDITS} objects with oldText, newText"
        )
    pairs: list[tuple[str, str]] = []
    for number, edit in enumerate(edits, 1):
        old = edit.get("oldText") if isinstance(edit, dict) else None
        new = edit.get("newText") if isinstance(edit, dict) else None
        if not isinstance(old, str) or not isinstance(new, str):
            raise Refused(f"edit {number} must be an object with string oldText and newText")
        if not old:
            raise Refused(
                f"edit {number}: oldText is empty; give the exact text to replace, or use "
                f"write_file to write a whole file"
            )
        if old == new:
            raise Refused(f"edit {number}: oldText and newText are the same; nothing would change")
        pairs.append((old, new))
    return pairs


def _apply(text: str, old: str, new: str, where: str) -> str:
    """``text`` with the one occurrence of ``old`` replaced by ``new``; refuse 0 or several."""
    found = _positions(text, old)
    if not found and "\r\n" in text and "\r" not in old:
        # A CRLF file edited with LF text: match and write with the file's line endings.
        old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
        found = _positions(text, old)
    if not found:
        raise Refused(
            f"{where}: oldText was not found: {_preview(old)}. Nothing was written. oldText must "
            f"match the current text exactly, whitespace and indentation included; read the file "
            f"again with read_file and copy the text from it"
        )
    if len(found) > 1:
        lines = ", ".join(str(text.count("\n", 0, pos) + 1) for pos in found[:10])
        raise Refused(
            f"{where}: oldText matches {len(found)} places (starting on lines {lines}): "
            f"{_preview(old)}. Nothing was written. Include more surrounding text in oldText so "
            f"that it matches exactly one place"
        )
    return text[: found[0]] + new + text[found[0] + len(old) :]


def _edit_file(input: dict[str, Any], ctx: ToolContext) -> str:
    raw = str_arg(input, "path")
    edits = _edits_arg(input)
    expected = input.get("expectedRevision")
    if expected is not None and not isinstance(expected, str):
        raise Refused(f"expectedRevision must be the string read_file returned, got {expected!r}")
    if expected is not None and not expected.strip():
        expected = None  # a blank revision is no revision
    target, shown = regular_file(ctx, raw)
    # Read and write through one directory fd: the file edited is the file read.
    with parent_dir(ctx, target) as (dir_fd, name):
        return _edit_at(
            dir_fd, name, shown, data=read_at(dir_fd, name, shown), edits=edits, expected=expected
        )


def _edit_at(
    dir_fd: int,
    name: str,
    shown: str,
    *,
    data: bytes,
    edits: list[tuple[str, str]],
    expected: str | None,
) -> str:
    current = revision(data)
    if expected is not None and (wanted := _normal_revision(expected)) != current:
        raise Refused(
            f"{shown} changed since it was read: expectedRevision is rev:{wanted} but the file "
            f"is now rev:{current}. Nothing was written. Read the file again with "
            f"read_file and make the edit against its current text",
            kind="precondition",
        )
    if looks_binary(data):
        raise Refused(f"{shown} is a binary file (it contains NUL bytes); it cannot be edited")
    # surrogateescape round-trips bytes that are not UTF-8, so untouched parts stay byte-exact.
    original = text = data.decode("utf-8", errors="surrogateescape")
    for number, (old, new) in enumerate(edits, 1):
        where = f"edit {number} of {len(edits)} in {shown}"
        if number > 1:
            where += " (applied to the result of the edits before it)"
        text = _apply(text, old, new, where)
    added, removed = _line_delta(original, text)
    new_data = _encode(text, "the edited text")
    atomic_write_at(dir_fd, name, new_data)
    count = f"{len(edits)} edit{'s' if len(edits) != 1 else ''}"
    return f"edited {shown}: {count}, +{added} -{removed} lines [rev:{revision(new_data)}]"


EDIT_FILE: Tool = define_tool(
    "edit_file",
    EDIT_FILE_DESCRIPTION,
    EDIT_FILE_PARAMETERS,
    guarded(_edit_file),
    effects=Effects.EDIT,
)
