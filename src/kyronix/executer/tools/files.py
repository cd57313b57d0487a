"""The eleven filesystem tools.

Every path argument arrives resolved by the one path sandbox (inside the base, symlinks followed).
Line numbers are 1-based and ranges inclusive. An edited file keeps its newline style (``\\n`` or
``\\r\\n``, decided by its first line ending) and whether it ends with a newline; every write is
atomic (temporary file, fsync, rename, fsync of the directory), so a crash leaves the old content
or the new, never half of it.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from kiso.tools.atomic import atomic_write
from kyronix.executer.tools.base import (
    Call,
    Param,
    SecurityError,
    ToolFailure,
    ToolOutput,
    ToolSpec,
)

__all__ = ["MAX_LIST_ENTRIES", "MAX_READ_BYTES", "TOOLS"]

MAX_READ_BYTES = 10 * 1024 * 1024
"""read_file refuses larger files (read_lines streams any size)."""
MAX_LIST_ENTRIES = 1000
_SNIFF = 8192


# -- reading -----------------------------------------------------------------------------------


def _read_text(path: Path, call: Call) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ToolFailure(
            f"{call.rel(path)} does not exist; check the name with list_dir",
            error_type="NotFound",
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise ToolFailure(f"{call.rel(path)} is a directory; use list_dir to see what is in it")
    if not stat.S_ISREG(st.st_mode):
        raise ToolFailure(f"{call.rel(path)} is not a regular file")
    if st.st_size > MAX_READ_BYTES:
        raise ToolFailure(
            f"{call.rel(path)} is {st.st_size:,} bytes, over the {MAX_READ_BYTES:,}-byte limit of "
            f"read_file; read a part of it with read_lines"
        )
    with open(path, "rb") as f:
        data = f.read(MAX_READ_BYTES + 1)
    if b"\x00" in data[:_SNIFF]:
        raise ToolFailure(f"{call.rel(path)} is a binary file; read_file only reads text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolFailure(
            f"{call.rel(path)} is not UTF-8 text (bad byte at offset {exc.start}); read_file "
            f"only reads text"
        ) from None


def read_file(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    text = _read_text(path, call)
    return ToolOutput(text, {"path": str(path), "bytes": len(text.encode("utf-8"))})


def read_lines(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    text = _read_text(path, call)
    lines = _Lines.parse(text).bodies()
    total = len(lines)
    start = call.args.get("start", 1)
    end = call.args.get("end", total)
    if start < 1:
        raise ToolFailure(f"start must be 1 or more (lines are numbered from 1), got {start}")
    if start > total:
        raise ToolFailure(
            f"start line {start} is past the end: {call.rel(path)} has {total} line(s)"
        )
    if end < start:
        raise ToolFailure(f"end ({end}) is before start ({start}); give start <= end")
    end = min(end, total)
    width = len(str(end))
    shown = lines[start - 1 : end]
    out = "\n".join(f"{n:>{width}}\t{line}" for n, line in enumerate(shown, start))
    return ToolOutput(
        out, {"path": str(path), "start": start, "end": end, "total": total, "lines": shown}
    )


def list_dir(call: Call) -> ToolOutput:
    path: Path = call.args.get("path") or call.base
    if not path.exists():
        raise ToolFailure(f"{call.rel(path)} does not exist", error_type="NotFound")
    if not path.is_dir():
        raise ToolFailure(f"{call.rel(path)} is a file, not a directory; use read_file")
    entries: list[str] = []
    with os.scandir(path) as it:
        for entry in it:
            entries.append(entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name)
    entries.sort()
    truncated = len(entries) > MAX_LIST_ENTRIES
    shown = entries[:MAX_LIST_ENTRIES]
    out = "\n".join(shown)
    if truncated:
        out += f"\n[... {len(entries) - MAX_LIST_ENTRIES:,} more entries not shown]"
    return ToolOutput(
        out, {"path": str(path), "entries": shown, "count": len(entries)}, truncated=truncated
    )


# -- writing -----------------------------------------------------------------------------------


def write_file(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    content: str = call.args["content"]
    if path == call.base or path.is_dir():
        raise ToolFailure(f"{call.rel(path)} is a directory; give a file path to write")
    created = not path.exists()
    _make_parents(path, call)
    data = content.encode("utf-8", "surrogatepass")
    atomic_write(path, data)
    verb = "created" if created else "overwrote"
    return ToolOutput(
        f"{verb} {call.rel(path)} ({len(data):,} bytes)",
        {"path": str(path), "bytes": len(data), "created": created},
    )


def delete_file(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    raw = call.raw.get("path")
    if path == call.base:
        raise SecurityError("refusing to delete the base directory itself; name what is inside it")
    # A symlink inside the base is removed itself, never the file it points at.
    target = _lexical(call, raw) if isinstance(raw, str) else None
    if target is not None and target.is_symlink():
        target.unlink()
        return ToolOutput(f"deleted the symlink {call.rel(target)}", {"path": str(target)})
    if not path.exists():
        raise ToolFailure(f"{call.rel(path)} does not exist", error_type="NotFound")
    if path.is_dir():
        count = sum(len(files) + len(dirs) for _, dirs, files in os.walk(path))
        shutil.rmtree(path)
        return ToolOutput(
            f"deleted the directory {call.rel(path)} and the {count:,} entries in it",
            {"path": str(path), "directory": True, "entries": count},
        )
    path.unlink()
    _fsync_dir(path.parent)
    return ToolOutput(f"deleted {call.rel(path)}", {"path": str(path), "directory": False})


def _transfer(call: Call, *, move: bool) -> ToolOutput:
    src: Path = call.args["source"]
    dst: Path = call.args["destination"]
    verb = "move" if move else "copy"
    if src == call.base:
        raise SecurityError(f"refusing to {verb} the base directory itself")
    if not src.exists():
        raise ToolFailure(f"{call.rel(src)} does not exist", error_type="NotFound")
    if dst == src:
        raise ToolFailure(f"source and destination are the same path ({call.rel(src)})")
    if src.is_dir() and (dst == src or src in dst.parents):
        raise ToolFailure(f"cannot {verb} the directory {call.rel(src)} into itself")
    if dst.is_dir():
        raise ToolFailure(
            f"the destination {call.rel(dst)} is an existing directory; name the new path "
            f"in full (for example {call.rel(dst)}/{src.name}) or delete it first"
        )
    if src.is_dir() and dst.exists():
        raise ToolFailure(
            f"cannot replace the file {call.rel(dst)} with the directory {call.rel(src)}; "
            f"delete it first or choose another destination"
        )
    _make_parents(dst, call)
    if move:
        os.replace(src, dst)
        _fsync_dir(dst.parent)
        if src.parent != dst.parent:
            _fsync_dir(src.parent)
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        atomic_write(dst, src.read_bytes())
        shutil.copymode(src, dst)
    done = "moved" if move else "copied"
    return ToolOutput(
        f"{done} {call.rel(src)} to {call.rel(dst)}",
        {"source": str(src), "destination": str(dst)},
    )


def move_file(call: Call) -> ToolOutput:
    return _transfer(call, move=True)


def copy_file(call: Call) -> ToolOutput:
    return _transfer(call, move=False)


def create_dir(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    if path.exists() and not path.is_dir():
        raise ToolFailure(f"{call.rel(path)} exists and is a file, not a directory")
    existed = path.is_dir()
    _make_parents(path / "_", call)
    return ToolOutput(
        f"{call.rel(path)} already exists" if existed else f"created {call.rel(path)}/",
        {"path": str(path), "created": not existed},
    )


# -- line edits --------------------------------------------------------------------------------

_LINE_SPLIT = re.compile(r"(?<=\n)")


class _Lines:
    """A text file as lines that keep their own endings, plus the style for new ones."""

    def __init__(self, lines: list[str], newline: str) -> None:
        self.lines = lines
        self.newline = newline

    @classmethod
    def parse(cls, text: str) -> _Lines:
        lines = _LINE_SPLIT.split(text)
        if lines and lines[-1] == "":
            lines.pop()
        first = text.find("\n")
        newline = "\r\n" if first > 0 and text[first - 1] == "\r" else "\n"
        return cls(lines, newline)

    @property
    def final_newline(self) -> bool:
        return not self.lines or self.lines[-1].endswith("\n")

    def bodies(self) -> list[str]:
        return [line.rstrip("\n").removesuffix("\r") for line in self.lines]

    def new_lines(self, content: str) -> list[str]:
        """``content`` as lines in this file's newline style (an empty text is no lines)."""
        if content == "":
            return []
        normal = content.replace("\r\n", "\n")
        parts = normal.split("\n")
        if normal.endswith("\n"):
            parts.pop()
        return [p + self.newline for p in parts]

    def splice(self, start: int, stop: int, new: list[str]) -> str:
        """Replace ``lines[start:stop]`` with ``new``; keep the final-newline state."""
        had_final = self.final_newline
        out = self.lines[:start] + new + self.lines[stop:]
        for i, line in enumerate(out[:-1]):
            if not line.endswith("\n"):  # the old last line, now followed by more
                out[i] = line + self.newline
        if out and not had_final and out[-1].endswith("\n"):
            out[-1] = out[-1][: -2 if out[-1].endswith("\r\n") else -1]
        elif out and had_final and not out[-1].endswith("\n"):
            out[-1] += self.newline
        return "".join(out)


def _edit(call: Call, change: str, start: int, stop: int, new_content: str | None) -> ToolOutput:
    path: Path = call.args["path"]
    text = _read_text(path, call)
    lines = _Lines.parse(text)
    new = lines.new_lines(new_content) if new_content is not None else []
    updated = lines.splice(start, stop, new)
    atomic_write(path, updated.encode("utf-8", "surrogatepass"))
    total = len(_Lines.parse(updated).lines)
    return ToolOutput(
        f"{change} in {call.rel(path)}; it now has {total} line(s)",
        {"path": str(path), "lines": total, "removed": stop - start, "inserted": len(new)},
    )


def write_in_between(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    after: int = call.args["linebefore"]
    total = len(_Lines.parse(_read_text(path, call)).lines)
    if not 0 <= after <= total:
        raise ToolFailure(
            f"linebefore must be between 0 (insert at the top) and {total} (append after the "
            f"last line) for {call.rel(path)}, got {after}"
        )
    where = "at the top" if after == 0 else f"after line {after}"
    return _edit(call, f"inserted {where}", after, after, call.args["content"])


def modify_line_between(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    start: int = call.args["startline"]
    end: int = call.args["endline"]
    _check_range(call, path, start, end)
    return _edit(call, f"replaced lines {start}-{end}", start - 1, end, call.args["content"])


def delete_line(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    spec = str(call.args["line"]).strip()
    match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", spec)
    if match is None:
        raise ToolFailure(
            f"line must be a line number such as '7' or a range such as '3-5', got {spec!r}",
            error_type="InvalidArguments",
        )
    start = int(match.group(1))
    end = int(match.group(2) or start)
    _check_range(call, path, start, end)
    what = f"deleted line {start}" if start == end else f"deleted lines {start}-{end}"
    return _edit(call, what, start - 1, end, None)


def _check_range(call: Call, path: Path, start: int, end: int) -> None:
    total = len(_Lines.parse(_read_text(path, call)).lines)
    if start < 1 or end < start or end > total:
        raise ToolFailure(
            f"lines {start}-{end} are not in {call.rel(path)}, which has {total} line(s); "
            f"lines are numbered from 1 and a range is inclusive (start <= end <= {total})"
        )


# -- helpers -----------------------------------------------------------------------------------


def _make_parents(path: Path, call: Call) -> None:
    parent = path.parent
    if parent.is_dir():
        return
    for ancestor in [parent, *parent.parents]:
        if ancestor.exists() and not ancestor.is_dir():
            raise ToolFailure(f"cannot create {call.rel(path)}: {call.rel(ancestor)} is a file")
        if ancestor == call.base:
            break
    parent.mkdir(parents=True, exist_ok=True)


def _lexical(call: Call, raw: str) -> Path | None:
    """Where ``raw`` points without following its last component (for symlinks)."""
    candidate = raw if os.path.isabs(raw) else os.path.join(call.base, raw)
    head, name = os.path.split(os.path.normpath(candidate))
    if not name or name in (".", ".."):
        return None
    parent = Path(os.path.realpath(head))
    if parent != call.base and call.base not in parent.parents:
        return None
    return parent / name


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _p(name: str, type_: str = "path", required: bool = True) -> Param:
    return Param(name, type_, required)  # type: ignore[arg-type]


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "read_file",
        (_p("path"),),
        read_file,
        "Read a whole text file.",
        read_only=True,
        idempotent=False,
    ),
    ToolSpec(
        "write_file",
        (_p("path"), _p("content", "string")),
        write_file,
        "Create or overwrite a file (parent directories are created).",
        writes=True,
        # The whole content, written atomically: a second run leaves what one run does.
        read_only=False,
        idempotent=True,
    ),
    ToolSpec(
        "delete_file",
        (_p("path"),),
        delete_file,
        "Delete a file, or a directory recursively.",
        writes=True,
        # A second run fails (NotFound), and would delete whatever was put there since.
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "move_file",
        (_p("source"), _p("destination")),
        move_file,
        "Move or rename a file or directory.",
        writes=True,
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "copy_file",
        (_p("source"), _p("destination")),
        copy_file,
        "Copy a file or directory.",
        writes=True,
        # Copying a directory a second time fails: its destination exists by then.
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "list_dir",
        (_p("path", required=False),),
        list_dir,
        "List a directory, sorted; directories end with '/'.",
        read_only=True,
        idempotent=False,
    ),
    ToolSpec(
        "create_dir",
        (_p("path"),),
        create_dir,
        "Create a directory (like mkdir -p).",
        writes=True,
        # mkdir -p: an existing directory is success, so again is the same as once.
        read_only=False,
        idempotent=True,
    ),
    ToolSpec(
        "write_in_between",
        (_p("path"), _p("content", "string"), _p("linebefore", "integer")),
        write_in_between,
        "Insert content after line `linebefore` (0 inserts at the top).",
        writes=True,
        # Line edits are relative: a second run edits again.
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "modify_line_between",
        (
            _p("path"),
            _p("content", "string"),
            _p("startline", "integer"),
            _p("endline", "integer"),
        ),
        modify_line_between,
        "Replace lines startline..endline (inclusive) with content.",
        writes=True,
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "delete_line",
        (_p("path"), _p("line", "string")),
        delete_line,
        "Delete one line ('7') or an inclusive range ('3-5').",
        writes=True,
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "read_lines",
        (_p("path"), _p("start", "integer", False), _p("end", "integer", False)),
        read_lines,
        "Read numbered lines start..end (inclusive; end is clamped to the last line).",
        read_only=True,
        idempotent=False,
    ),
)
