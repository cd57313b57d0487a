"""What the five file tools share: limits, revisions, atomic writes, argument readers, errors.

Every tool resolves its paths with :func:`kiso.tools.paths.resolve_in_workspace`, so nothing outside
the workspace is read, listed, searched or written, whether it is named directly, through ``..``
or through a symlink. Every refusal is an error result the model can act on (never an exception):
bad input and refused paths are ``invalid_input``, a stale ``expectedRevision`` is
``precondition``.

A file's revision is the first 16 hex digits of the SHA-256 of its bytes. read_file, write_file and
edit_file end their result with ``[rev:<revision>]``; edit_file refuses to write when it is given
an ``expectedRevision`` that no longer matches, so an edit is never made against stale text.
Paths are *used* through directory file descriptors opened beneath the workspace root
(:func:`kiso.tools.paths.open_beneath` and friends): a directory swapped for a symlink between
the check and the use is refused, never followed, and the kind of a file is checked on the fd it
was opened as (``O_NONBLOCK``: a FIFO never blocks a read; FIFOs, devices and sockets are refused).
Writes are atomic (:func:`kiso.tools.atomic.atomic_write_at`): a temporary file inside the opened
directory, fsync, a rename by directory fds, fsync of the directory. A reader sees the old bytes
or the new, never a mix, and a crash leaves one or the other. A write replaces the file (a hard
link to a file elsewhere is not written through) and drops setuid/setgid bits.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from kiso.tools.atomic import atomic_write
from kiso.tools.base import ToolContext, ToolResult
from kiso.tools.paths import (
    PathOutsideWorkspace,
    SpecialFile,
    display_path,
    file_kind,
    open_parent,
    open_regular,
    resolve_in_workspace,
)

__all__ = [
    "SKIPPED_DIRS",
    "Refused",
    "atomic_write",
    "bool_arg",
    "existing",
    "guarded",
    "int_arg",
    "line_text",
    "looks_binary",
    "open_text",
    "parent_dir",
    "plural",
    "read_at",
    "real_root",
    "regular_file",
    "revision",
    "str_arg",
]

SKIPPED_DIRS: frozenset[str] = frozenset({".git", "node_modules", ".venv", "__pycache__"})
"""Listed by list_dir but never descended into by list_dir or search_text."""


BINARY_SNIFF = 8192
"""A file with a NUL byte in its first 8 KiB is binary."""

READ_DEFAULT_LINES = 200
READ_MAX_LINES = 2000
READ_LINE_CHARS = 2000
LIST_DEFAULT_DEPTH = 2
LIST_MAX_DEPTH = 5
LIST_MAX_ENTRIES = 500
SEARCH_DEFAULT_RESULTS = 200
SEARCH_MAX_RESULTS = 1000
SEARCH_LINE_CHARS = 300
SEARCH_MAX_FILE_BYTES = 20 * 1024 * 1024
EDIT_MAX_EDITS = 50
_DIFF_BUDGET = 4_000_000


def revision(data: bytes) -> str:
    """The revision of a file's bytes: the first 16 hex digits of their SHA-256."""
    return hashlib.sha256(data).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Refusals: every problem a file tool meets becomes an error result, never an exception.

Body = Callable[[dict[str, Any], ToolContext], str]


class Refused(Exception):
    """A tool declines the call; the message tells the model what to do instead."""

    def __init__(self, message: str, *, kind: str = "invalid_input") -> None:
        super().__init__(message)
        self.kind = kind


def guarded(body: Body) -> Callable[[dict[str, Any], ToolContext], ToolResult]:
    """Run a tool body; turn refusals, sandbox escapes and OS errors into error results."""

    @functools.wraps(body)
    def execute(input: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            return ToolResult(body(input, ctx))
        except Refused as exc:
            return ToolResult(str(exc), is_error=True, error_kind=exc.kind)
        except PathOutsideWorkspace as exc:
            return ToolResult(str(exc), is_error=True, error_kind="invalid_input")
        except SpecialFile as exc:
            return ToolResult(_special_message(ctx, exc), is_error=True, error_kind="invalid_input")
        except OSError as exc:
            return ToolResult(_os_error_message(exc), is_error=True, error_kind=_os_error_kind(exc))

    return execute


_INPUT_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG}
_PRECONDITION_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.EEXIST}
_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETXTBSY}


def _os_error_kind(exc: OSError) -> str:
    if exc.errno in _INPUT_ERRNOS:
        return "invalid_input"
    if exc.errno in _PRECONDITION_ERRNOS:
        return "precondition"
    if exc.errno in _TRANSIENT_ERRNOS:
        return "transient"
    return "fatal"


def _special_message(ctx: ToolContext, exc: SpecialFile) -> str:
    shown = exc.filename if isinstance(exc.filename, str) else "the path"
    return (
        f"{shown} is {exc.kind}, not a regular file; it was not read or written (a FIFO would "
        f"block, a device can stream without end)"
    )


def _os_error_message(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        link = Path(exc.filename).name if isinstance(exc.filename, str) else "a path component"
        return (
            f"{link}: a symbolic link on the way loops (it leads back to itself); remove it or "
            f"point it at a real file. Nothing was changed"
        )
    if exc.errno == errno.ENAMETOOLONG:
        return (
            "a name in the path is too long (at most 255 bytes per name and 4,096 per path); "
            "choose a shorter name. Nothing was changed"
        )
    reason = exc.strerror or str(exc)
    name = Path(exc.filename).name if isinstance(exc.filename, str) else None
    where = f" ({name})" if name else ""
    return f"the operation failed: {reason}{where}; nothing was changed by the failed step"


# ---------------------------------------------------------------------------------------------
# Arguments, already schema-checked by the runtime, read defensively all the same.


def str_arg(input: dict[str, Any], name: str, default: str | None = None) -> str:
    value = input.get(name, default)
    if value is None:
        raise Refused(f"{name} is required")
    if not isinstance(value, str):
        raise Refused(f"{name} must be a string, got {value!r}")
    return value


def int_arg(input: dict[str, Any], name: str, default: int, low: int, high: int | None) -> int:
    value = input.get(name, default)
    if value is None:
        value = default
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise Refused(f"{name} must be an integer {bounds}, got {value!r}")
    return value


def bool_arg(input: dict[str, Any], name: str, default: bool) -> bool:
    value = input.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise Refused(f"{name} must be true or false, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------
# Paths and bytes.


def existing(ctx: ToolContext, raw: str) -> Path:
    """``raw`` resolved inside the workspace; it must exist."""
    try:
        return resolve_in_workspace(ctx.workspace, raw, must_exist=True)
    except FileNotFoundError:
        if os.path.islink(resolve_in_workspace(ctx.workspace, raw)):  # left unresolved: a loop
            raise Refused(
                f"{raw!r} is a symbolic link that loops (it leads back to itself); remove it or "
                f"point it at a real file"
            ) from None
        raise Refused(
            f"{raw!r} does not exist in the workspace; use list_dir or search_text to find the "
            f"right path"
        ) from None


def regular_file(ctx: ToolContext, raw: str) -> tuple[Path, str]:
    """An existing regular file inside the workspace, and its path as the model should see it."""
    target = existing(ctx, raw)
    shown = display_path(ctx.workspace, target)
    if target.is_dir():
        raise Refused(f"{shown} is a directory; use list_dir to list it")
    if not target.is_file():
        raise Refused(f"{shown} is not a regular file (a device, pipe or socket); it was not read")
    return target, shown


def real_root(ctx: ToolContext) -> str:
    """The real (symlink-free) workspace root every fd walk starts from."""
    return os.path.realpath(ctx.workspace)


@contextlib.contextmanager
def open_text(ctx: ToolContext, target: Path, shown: str) -> Iterator[BinaryIO]:
    """``target`` (resolved, a regular file) opened beneath the workspace for reading in binary
    mode, its kind checked on the fd (a FIFO, device or socket is refused, never read)."""
    try:
        fd, _st = open_regular(real_root(ctx), target, shown)
    except IsADirectoryError:
        raise Refused(f"{shown} is a directory; use list_dir to list it") from None
    except SpecialFile as exc:
        raise Refused(f"{shown} is not a regular file ({exc.kind}); it was not read") from None
    with os.fdopen(fd, "rb") as fh:
        yield fh


@contextlib.contextmanager
def parent_dir(
    ctx: ToolContext, target: Path, *, create: bool = False
) -> Iterator[tuple[int, str]]:
    """The directory holding ``target``, opened beneath the workspace (missing directories made
    first with ``create``), and ``target``'s name in it."""
    dir_fd, name = open_parent(real_root(ctx), target, create=create)
    try:
        yield dir_fd, name
    finally:
        os.close(dir_fd)


def read_at(dir_fd: int, name: str, shown: str) -> bytes:
    """The bytes of the regular file ``name`` in the opened directory ``dir_fd`` (never through
    a symlink; a FIFO, device or socket is refused)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise Refused(f"{shown} is not a regular file (a socket); it was not read") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if stat.S_ISDIR(mode):
            raise Refused(f"{shown} is a directory; use list_dir to list it")
        if not stat.S_ISREG(mode):
            raise Refused(f"{shown} is not a regular file ({file_kind(mode)}); it was not read")
        return fh.read()


def plural(count: int, one: str, many: str) -> str:
    return f"{count:,} {one if count == 1 else many}"


def looks_binary(head: bytes) -> bool:
    return b"\x00" in head


def line_text(raw: bytes) -> str:
    """One line read in binary mode, without its line ending, as text (bad bytes replaced)."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return raw.decode("utf-8", errors="replace")
