"""The eleven filesystem tools.

Every path argument arrives resolved by the one path sandbox (inside the base, symlinks followed)
and is then *used* through directory file descriptors opened beneath the base
(:mod:`kiso.tools.paths`): a directory swapped for a symlink while a tool runs is refused, never
followed. Files are opened with ``O_NONBLOCK`` and their kind checked on the fd: FIFOs, devices
and sockets are refused (a FIFO would block, a device stream forever), and sizes are capped.
Line numbers are 1-based and ranges inclusive. An edited file keeps its newline style (``\\n`` or
``\\r\\n``, decided by its first line ending) and whether it ends with a newline; every write is
atomic (temporary file in the opened directory, fsync, rename by directory fds, fsync of the
directory), so a crash leaves the old content or the new, never half of it. A write replaces the
file: a hard link to a file elsewhere keeps that file's bytes, and setuid/setgid bits are dropped.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from kiso.tools.atomic import atomic_replace_at, atomic_write_at, temp_name
from kiso.tools.paths import (
    PathChanged,
    PathOutsideWorkspace,
    SpecialFile,
    file_kind,
    open_dir_beneath,
    open_parent,
    open_regular,
    read_fd,
    refuse_symlink_at,
)
from kyronix.executer.tools.base import (
    Call,
    Param,
    SecurityError,
    ToolFailure,
    ToolOutput,
    ToolSpec,
)

__all__ = ["MAX_COPY_BYTES", "MAX_LIST_ENTRIES", "MAX_READ_BYTES", "TOOLS"]

MAX_READ_BYTES = 10 * 1024 * 1024
"""read_file and the line edits refuse larger files (read_lines streams any size)."""
MAX_LINES_OUTPUT = 10 * 1024 * 1024
"""read_lines returns at most this many bytes of lines (``truncated`` beyond)."""
MAX_COPY_BYTES = 1024 * 1024 * 1024
"""copy_file copies at most this many bytes (one file, or a whole directory)."""
MAX_COPY_ENTRIES = 100_000
MAX_LIST_ENTRIES = 1000
_SNIFF = 8192
_DIR_RO = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_RO = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | os.O_CLOEXEC


# -- errors ------------------------------------------------------------------------------------


def _guard(handler: Callable[[Call], ToolOutput]) -> Callable[[Call], ToolOutput]:
    """Turn what the filesystem says into failures a model can act on (never "failed
    unexpectedly"): a race with the sandbox is a SecurityError, a loop or an over-long name a
    clear error."""

    @functools.wraps(handler)
    def run(call: Call) -> ToolOutput:
        try:
            return handler(call)
        except PathChanged as exc:
            raise SecurityError(str(exc)) from None
        except PathOutsideWorkspace as exc:
            raise SecurityError(str(exc)) from None
        except SpecialFile as exc:
            raise ToolFailure(
                f"{_shown(call, exc.filename)} is {exc.kind}, not a regular file; {call.tool} "
                f"only works on regular files and directories (a FIFO would block, a device "
                f"can stream without end)"
            ) from None
        except OSError as exc:
            raise _os_failure(call, exc) from None

    return run


def _shown(call: Call, filename: object) -> str:
    if isinstance(filename, str) and filename:
        path = Path(filename)
        if path == call.base or call.base in path.parents:
            return call.rel(path)
        return filename
    return "the path"


def _os_failure(call: Call, exc: OSError) -> ToolFailure:
    where = _shown(call, exc.filename)
    code = exc.errno
    if code == errno.ELOOP:
        return ToolFailure(
            f"{where}: a symbolic link on the way loops (it leads back to itself); remove it or "
            f"point it at a real file",
            error_type="InvalidArguments",
        )
    if code == errno.ENAMETOOLONG:
        return ToolFailure(
            f"a name in {where[:200]!r} is too long (at most 255 bytes per name and 4,096 per "
            f"path); choose a shorter name",
            error_type="InvalidArguments",
        )
    if code == errno.ENOENT:
        return ToolFailure(
            f"{where} does not exist; check the name with list_dir", error_type="NotFound"
        )
    if code == errno.ENOTDIR:
        return ToolFailure(f"{where} is a file, not a directory; choose another path")
    if code == errno.EISDIR:
        return ToolFailure(f"{where} is a directory; give the path of a file")
    if code in (errno.EACCES, errno.EPERM):
        return ToolFailure(f"permission denied on {where}; the executer's user cannot do that")
    if code == errno.ENOSPC:
        return ToolFailure(f"no space left on the device for {where}; nothing was changed")
    if code == errno.EROFS:
        return ToolFailure(f"{where} is on a read-only filesystem")
    if code == errno.ENOTEMPTY:
        return ToolFailure(f"{where} is a directory that is not empty")
    reason = exc.strerror or str(exc)
    return ToolFailure(f"{call.tool} failed on {where}: {reason}")


# -- reading -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _opened(call: Call, path: Path) -> Iterator[tuple[int, os.stat_result]]:
    """A regular file of the base, opened beneath it (O_NONBLOCK, kind checked on the fd)."""
    try:
        fd, st = open_regular(call.base, path, call.rel(path))
    except FileNotFoundError:
        raise ToolFailure(
            f"{call.rel(path)} does not exist; check the name with list_dir",
            error_type="NotFound",
        ) from None
    except IsADirectoryError:
        raise ToolFailure(
            f"{call.rel(path)} is a directory; use list_dir to see what is in it"
        ) from None
    try:
        yield fd, st
    finally:
        os.close(fd)


def _read_text(path: Path, call: Call, *, too_big: str) -> str:
    """The whole text of a file of at most :data:`MAX_READ_BYTES`; ``too_big`` says what to do
    instead of the current tool."""
    with _opened(call, path) as (fd, st):
        return _decode(call, path, fd, st, too_big)


def _read_text_at(call: Call, path: Path, dir_fd: int, name: str, *, too_big: str) -> str:
    """Like :func:`_read_text`, for ``name`` in an opened directory."""
    try:
        fd = os.open(name, _FILE_RO, dir_fd=dir_fd)
    except FileNotFoundError:
        raise ToolFailure(
            f"{call.rel(path)} does not exist; check the name with list_dir",
            error_type="NotFound",
        ) from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise SpecialFile(str(path), "a socket") from None
        raise
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolFailure(f"{call.rel(path)} is a directory; use list_dir to see what is in it")
        if not stat.S_ISREG(st.st_mode):
            raise SpecialFile(str(path), file_kind(st.st_mode))
        return _decode(call, path, fd, st, too_big)
    finally:
        os.close(fd)


def _decode(call: Call, path: Path, fd: int, st: os.stat_result, too_big: str) -> str:
    if st.st_size > MAX_READ_BYTES:
        raise ToolFailure(
            f"{call.rel(path)} is {st.st_size:,} bytes, over the {MAX_READ_BYTES:,}-byte "
            f"limit of {call.tool}; {too_big}"
        )
    data = read_fd(fd, MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        raise ToolFailure(f"{call.rel(path)} grew past {MAX_READ_BYTES:,} bytes while read")
    if b"\x00" in data[:_SNIFF]:
        raise ToolFailure(f"{call.rel(path)} is a binary file; {call.tool} only works on text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolFailure(
            f"{call.rel(path)} is not UTF-8 text (bad byte at offset {exc.start}); "
            f"{call.tool} only works on text"
        ) from None


_READ_INSTEAD = "read a range of lines with read_lines (start, end), which streams any size"
_EDIT_INSTEAD = "line edits load the whole file; split it, or rewrite it with write_file"


def read_file(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    text = _read_text(path, call, too_big=_READ_INSTEAD)
    return ToolOutput(text, {"path": str(path), "bytes": len(text.encode("utf-8"))})


def read_lines(call: Call) -> ToolOutput:
    """Stream the file: only the lines asked for are kept, whatever its size."""
    path: Path = call.args["path"]
    start = _line_arg(call, "start", 1)
    end = _line_arg(call, "end", 0) if call.args.get("end") is not None else None
    if start < 1:
        raise ToolFailure(f"start must be 1 or more (lines are numbered from 1), got {start}")
    if end is not None and end < start:
        raise ToolFailure(f"end ({end}) is before start ({start}); give start <= end")
    shown: list[str] = []
    kept = 0
    truncated = False
    total = 0
    with _opened(call, path) as (fd, _st), os.fdopen(os.dup(fd), "rb") as fh:
        if b"\x00" in fh.read(_SNIFF):
            raise ToolFailure(f"{call.rel(path)} is a binary file; read_lines only reads text")
        fh.seek(0)
        for raw in fh:
            total += 1
            if total < start:
                continue
            body = raw.rstrip(b"\n").removesuffix(b"\r")
            kept += len(body) + 1
            if kept > MAX_LINES_OUTPUT:
                truncated = True
                total += _count_rest(fh)
                break
            try:
                shown.append(body.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ToolFailure(
                    f"line {total} of {call.rel(path)} is not UTF-8 text (bad byte at "
                    f"column {exc.start + 1}); read_lines only reads text"
                ) from None
            if end is not None and total >= end:
                total += _count_rest(fh)
                break
    if start > total:
        raise ToolFailure(
            f"start line {start} is past the end: {call.rel(path)} has {total} line(s)"
        )
    last = start + len(shown) - 1
    width = len(str(max(last, 1)))
    out = "\n".join(f"{n:>{width}}\t{line}" for n, line in enumerate(shown, start))
    if truncated:
        out += f"\n[... cut at {MAX_LINES_OUTPUT:,} bytes of lines; continue with start={last + 1}]"
    return ToolOutput(
        out,
        {"path": str(path), "start": start, "end": last, "total": total, "lines": shown},
        truncated=truncated,
    )


def _count_rest(fh: BinaryIO) -> int:
    """The lines after the current one, counted in blocks (nothing kept)."""
    count = 0
    tail = b""
    while block := fh.read(1 << 20):
        count += block.count(b"\n")
        tail = block
    return count + (1 if tail and not tail.endswith(b"\n") else 0)


def list_dir(call: Call) -> ToolOutput:
    path: Path = call.args.get("path") or call.base
    try:
        fd = open_dir_beneath(call.base, path)
    except FileNotFoundError:
        raise ToolFailure(f"{call.rel(path)} does not exist", error_type="NotFound") from None
    except NotADirectoryError:
        raise ToolFailure(f"{call.rel(path)} is a file, not a directory; use read_file") from None
    entries: list[str] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                name = entry.name
                entries.append(name + "/" if entry.is_dir(follow_symlinks=False) else name)
    finally:
        os.close(fd)
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


@contextlib.contextmanager
def _parent(call: Call, path: Path, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """The directory holding ``path``, opened beneath the base (made first with ``create``)."""
    try:
        dir_fd, name = open_parent(call.base, path, create=create)
    except NotADirectoryError as exc:
        blocker = _shown(call, exc.filename)
        raise ToolFailure(f"cannot create {call.rel(path)}: {blocker} is a file") from None
    try:
        yield dir_fd, name
    finally:
        os.close(dir_fd)


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def write_file(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    content: str = call.args["content"]
    if path == call.base:
        raise ToolFailure(f"{call.rel(path)} is a directory; give a file path to write")
    data = content.encode("utf-8", "surrogatepass")
    with _parent(call, path, create=True) as (dir_fd, name):
        st = _lstat_at(dir_fd, name)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise ToolFailure(f"{call.rel(path)} is a directory; give a file path to write")
        refuse_symlink_at(dir_fd, name, call.rel(path))
        atomic_write_at(dir_fd, name, data)
    created = st is None
    verb = "created" if created else "overwrote"
    return ToolOutput(
        f"{verb} {call.rel(path)} ({len(data):,} bytes)",
        {"path": str(path), "bytes": len(data), "created": created},
    )


def delete_file(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    if path == call.base:
        raise SecurityError("refusing to delete the base directory itself; name what is inside it")
    # A symlink inside the base is removed itself, never the file it points at.
    link = _lexical_link(call, call.raw.get("path"))
    if link is not None:
        with _parent(call, link) as (dir_fd, name):
            st = _lstat_at(dir_fd, name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                os.unlink(name, dir_fd=dir_fd)
                os.fsync(dir_fd)
                return ToolOutput(f"deleted the symlink {call.rel(link)}", {"path": str(link)})
    try:
        with _parent(call, path) as (dir_fd, name):
            return _delete_at(call, path, dir_fd, name)
    except FileNotFoundError:
        raise ToolFailure(f"{call.rel(path)} does not exist", error_type="NotFound") from None


def _delete_at(call: Call, path: Path, dir_fd: int, name: str) -> ToolOutput:
    st = _lstat_at(dir_fd, name)
    if st is None:
        raise ToolFailure(f"{call.rel(path)} does not exist", error_type="NotFound")
    if stat.S_ISDIR(st.st_mode):
        count = sum(len(d) + len(f) for _, d, f, _ in os.fwalk(name, dir_fd=dir_fd))
        shutil.rmtree(name, dir_fd=dir_fd)  # fd-based: never follows a symlink inside
        os.fsync(dir_fd)
        return ToolOutput(
            f"deleted the directory {call.rel(path)} and the {count:,} entries in it",
            {"path": str(path), "directory": True, "entries": count},
        )
    os.unlink(name, dir_fd=dir_fd)
    os.fsync(dir_fd)
    return ToolOutput(f"deleted {call.rel(path)}", {"path": str(path), "directory": False})


def _transfer(call: Call, *, move: bool) -> ToolOutput:
    src: Path = call.args["source"]
    dst: Path = call.args["destination"]
    verb = "move" if move else "copy"
    if src == call.base:
        raise SecurityError(f"refusing to {verb} the base directory itself")
    if dst == call.base:
        raise ToolFailure(
            f"the destination {call.rel(dst)} is an existing directory; name the new path "
            f"in full (for example {src.name}) or delete it first"
        )
    # move_file of a symlink moves the link itself, not what it points at.
    link = _lexical_link(call, call.raw.get("source")) if move else None
    entry = src
    if link is not None:
        with _parent(call, link) as (dir_fd, name):
            st = _lstat_at(dir_fd, name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                entry = link
    with _parent(call, entry) as (src_fd, src_name):
        src_st = _lstat_at(src_fd, src_name)
        if src_st is None:
            raise ToolFailure(f"{call.rel(src)} does not exist", error_type="NotFound")
        is_dir = stat.S_ISDIR(src_st.st_mode)
        if dst == entry:
            raise ToolFailure(f"source and destination are the same path ({call.rel(entry)})")
        if is_dir and entry in dst.parents:
            raise ToolFailure(f"cannot {verb} the directory {call.rel(entry)} into itself")
        with _parent(call, dst, create=True) as (dst_fd, dst_name):
            dst_st = _lstat_at(dst_fd, dst_name)
            if dst_st is not None and stat.S_ISDIR(dst_st.st_mode):
                raise ToolFailure(
                    f"the destination {call.rel(dst)} is an existing directory; name the new "
                    f"path in full (for example {call.rel(dst)}/{entry.name}) or delete it first"
                )
            if not move:
                refuse_symlink_at(dst_fd, dst_name, call.rel(dst))
            if is_dir and dst_st is not None:
                raise ToolFailure(
                    f"cannot replace the file {call.rel(dst)} with the directory "
                    f"{call.rel(entry)}; delete it first or choose another destination"
                )
            data: dict[str, object] = {"source": str(entry), "destination": str(dst)}
            note = ""
            if move:
                _rename(src_fd, src_name, dst_fd, dst_name, replace=dst_st is not None)
                os.fsync(dst_fd)
                if not os.path.samestat(os.fstat(src_fd), os.fstat(dst_fd)):
                    os.fsync(src_fd)
            elif is_dir:
                skipped = _copy_tree(
                    call,
                    entry,
                    src_dir=src_fd,
                    src_name=src_name,
                    dst_dir=dst_fd,
                    dst_name=dst_name,
                )
                if skipped:
                    data["skipped"] = [f"{p} ({kind})" for p, kind in skipped]
                    listed = ", ".join(f"{p} ({kind})" for p, kind in skipped[:10])
                    more = f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
                    note = (
                        f"; skipped {len(skipped)} special file(s) that cannot be copied: "
                        f"{listed}{more}"
                    )
            else:
                _copy_file(
                    call, src, src_dir=src_fd, src_name=src_name, dst_dir=dst_fd, dst_name=dst_name
                )
    done = "moved" if move else "copied"
    return ToolOutput(f"{done} {call.rel(entry)} to {call.rel(dst)}{note}", data)


def move_file(call: Call) -> ToolOutput:
    return _transfer(call, move=True)


def copy_file(call: Call) -> ToolOutput:
    return _transfer(call, move=False)


def create_dir(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    try:
        os.close(open_dir_beneath(call.base, path, search_only=True))
        existed = True
    except FileNotFoundError:
        existed = False
    except NotADirectoryError as exc:
        blocker = _shown(call, exc.filename)
        if blocker == call.rel(path):
            raise ToolFailure(f"{call.rel(path)} exists and is a file, not a directory") from None
        raise ToolFailure(f"cannot create {call.rel(path)}: {blocker} is a file") from None
    if not existed:
        try:
            os.close(open_dir_beneath(call.base, path, create=True, search_only=True))
        except NotADirectoryError as exc:
            blocker = _shown(call, exc.filename)
            raise ToolFailure(f"cannot create {call.rel(path)}: {blocker} is a file") from None
    return ToolOutput(
        f"{call.rel(path)} already exists" if existed else f"created {call.rel(path)}/",
        {"path": str(path), "created": not existed},
    )


# -- copying and moving by directory fds -------------------------------------------------------

_RENAME_NOREPLACE = 1
_renameat2: Callable[..., int] | None
try:
    _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
except (AttributeError, OSError):
    _renameat2 = None


def _rename(src_fd: int, src: str, dst_fd: int, dst: str, *, replace: bool) -> None:
    """Rename by directory fds. Onto a name that did not exist, refuse to replace whatever
    appeared there meanwhile (RENAME_NOREPLACE where the C library has renameat2)."""
    if replace or _renameat2 is None:
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        return
    result = _renameat2(
        src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), ctypes.c_uint(_RENAME_NOREPLACE)
    )
    if result != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL):  # a filesystem without RENAME_NOREPLACE
            os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            return
        raise OSError(err, os.strerror(err), dst)


def _copy_bytes(src_fd: int, dst_fd: int, size: int) -> None:
    """Copy ``size`` bytes (what fstat said when the file was opened: a file that grows while
    it is copied does not make the copy run on)."""
    left = size
    while left > 0:
        try:
            sent = os.copy_file_range(src_fd, dst_fd, min(left, 1 << 30))
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            sent = os.sendfile(dst_fd, src_fd, None, min(left, 1 << 30))
        if sent == 0:
            break
        left -= sent


def _copy_file(
    call: Call, src: Path, *, src_dir: int, src_name: str, dst_dir: int, dst_name: str
) -> None:
    try:
        fd = os.open(src_name, _FILE_RO, dir_fd=src_dir)  # O_NOFOLLOW: the checked, resolved name
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise SpecialFile(str(src), "a socket") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpecialFile(str(src), file_kind(st.st_mode))
        if st.st_size > MAX_COPY_BYTES:
            raise ToolFailure(
                f"{call.rel(src)} is {st.st_size:,} bytes, over the {MAX_COPY_BYTES:,}-byte "
                f"limit of copy_file"
            )
        atomic_replace_at(
            dst_dir, dst_name, lambda out: _copy_bytes(fd, out, st.st_size), mode=st.st_mode
        )
    finally:
        os.close(fd)


def _copy_tree(
    call: Call, src: Path, *, src_dir: int, src_name: str, dst_dir: int, dst_name: str
) -> list[tuple[str, str]]:
    """Copy a directory: built under a temporary name in the destination's directory and
    renamed into place, so it appears whole or not at all. Symlinks are copied as symlinks;
    FIFOs, devices and sockets are skipped and returned."""
    skipped: list[tuple[str, str]] = []
    budget = [MAX_COPY_BYTES, MAX_COPY_ENTRIES]
    tmp = temp_name(dst_name)
    from_fd = os.open(src_name, _DIR_RO, dir_fd=src_dir)
    try:
        os.mkdir(tmp, 0o700, dir_fd=dst_dir)
        try:
            to_fd = os.open(tmp, _DIR_RO, dir_fd=dst_dir)
            try:
                _copy_into(
                    call,
                    from_fd=from_fd,
                    to_fd=to_fd,
                    shown=call.rel(src),
                    skipped=skipped,
                    budget=budget,
                )
                os.fchmod(to_fd, stat.S_IMODE(os.fstat(from_fd).st_mode) & 0o1777)
                os.fsync(to_fd)
            finally:
                os.close(to_fd)
            _rename(dst_dir, tmp, dst_dir, dst_name, replace=False)
        except BaseException:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp, dir_fd=dst_dir)
            raise
        os.fsync(dst_dir)
    finally:
        os.close(from_fd)
    return skipped


def _copy_into(
    call: Call,
    *,
    from_fd: int,
    to_fd: int,
    shown: str,
    skipped: list[tuple[str, str]],
    budget: list[int],
) -> None:
    with os.scandir(from_fd) as it:
        names = sorted(entry.name for entry in it)
    for name in names:
        budget[1] -= 1
        if budget[1] < 0:
            raise ToolFailure(
                f"the directory has more than {MAX_COPY_ENTRIES:,} entries, the limit of "
                f"copy_file; nothing was copied"
            )
        where = f"{shown}/{name}"
        st = os.stat(name, dir_fd=from_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o700, dir_fd=to_fd)
            sub_from = os.open(name, _DIR_RO, dir_fd=from_fd)
            try:
                sub_to = os.open(name, _DIR_RO, dir_fd=to_fd)
                try:
                    _copy_into(
                        call,
                        from_fd=sub_from,
                        to_fd=sub_to,
                        shown=where,
                        skipped=skipped,
                        budget=budget,
                    )
                    os.fchmod(sub_to, stat.S_IMODE(st.st_mode) & 0o1777)
                finally:
                    os.close(sub_to)
            finally:
                os.close(sub_from)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=from_fd), name, dir_fd=to_fd)
        elif stat.S_ISREG(st.st_mode):
            src = os.open(name, _FILE_RO, dir_fd=from_fd)
            try:
                fst = os.fstat(src)
                if not stat.S_ISREG(fst.st_mode):  # swapped since the lstat
                    skipped.append((where, file_kind(fst.st_mode)))
                    continue
                budget[0] -= fst.st_size
                if budget[0] < 0:
                    raise ToolFailure(
                        f"the directory holds more than {MAX_COPY_BYTES:,} bytes, the limit of "
                        f"copy_file; nothing was copied"
                    )
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                out = os.open(name, flags, 0o600, dir_fd=to_fd)
                try:
                    _copy_bytes(src, out, fst.st_size)
                    os.fchmod(out, stat.S_IMODE(fst.st_mode) & 0o1777)
                finally:
                    os.close(out)
            finally:
                os.close(src)
        else:
            skipped.append((where, file_kind(st.st_mode)))


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


def _edit(call: Call, plan: Callable[[_Lines], tuple[str, int, int, list[str]]]) -> ToolOutput:
    """Read the file, let ``plan`` choose ``(what, start, stop, new lines)``, write it back:
    both through the one directory fd opened beneath the base."""
    path: Path = call.args["path"]
    with _parent(call, path) as (dir_fd, name):
        text = _read_text_at(call, path, dir_fd, name, too_big=_EDIT_INSTEAD)
        lines = _Lines.parse(text)
        change, start, stop, new = plan(lines)
        updated = lines.splice(start, stop, new)
        atomic_write_at(dir_fd, name, updated.encode("utf-8", "surrogatepass"))
    total = len(_Lines.parse(updated).lines)
    return ToolOutput(
        f"{change} in {call.rel(path)}; it now has {total} line(s)",
        {"path": str(path), "lines": total, "removed": stop - start, "inserted": len(new)},
    )


def write_in_between(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    after = _line_arg(call, "linebefore", 0)
    content: str = call.args["content"]

    def plan(lines: _Lines) -> tuple[str, int, int, list[str]]:
        total = len(lines.lines)
        if not 0 <= after <= total:
            raise ToolFailure(
                f"linebefore must be between 0 (insert at the top) and {total} (append after "
                f"the last line) for {call.rel(path)}, got {after}"
            )
        where = "at the top" if after == 0 else f"after line {after}"
        return f"inserted {where}", after, after, lines.new_lines(content)

    return _edit(call, plan)


def modify_line_between(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    start = _line_arg(call, "startline", 1)
    end = _line_arg(call, "endline", 1)
    content: str = call.args["content"]

    def plan(lines: _Lines) -> tuple[str, int, int, list[str]]:
        _check_range(call, path, lines, start, end)
        return f"replaced lines {start}-{end}", start - 1, end, lines.new_lines(content)

    return _edit(call, plan)


_LINE_SPEC = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?", re.ASCII)


def delete_line(call: Call) -> ToolOutput:
    path: Path = call.args["path"]
    spec = str(call.args["line"]).strip()
    match = _LINE_SPEC.fullmatch(spec)
    if match is None:
        raise ToolFailure(
            f"line must be a line number such as '7' or a range such as '3-5' (ASCII digits), "
            f"got {spec!r}",
            error_type="InvalidArguments",
        )
    start = int(match.group(1))
    end = int(match.group(2) or start)

    def plan(lines: _Lines) -> tuple[str, int, int, list[str]]:
        _check_range(call, path, lines, start, end)
        what = f"deleted line {start}" if start == end else f"deleted lines {start}-{end}"
        return what, start - 1, end, []

    return _edit(call, plan)


def _line_arg(call: Call, name: str, default: int) -> int:
    """A line-number argument (the pipeline converted it, ASCII digits only: ``٣`` is not 3)."""
    value = call.args.get(name, default)
    if not isinstance(value, int):
        raise ToolFailure(f"<{name}> must be a line number", error_type="InvalidArguments")
    return value


def _check_range(call: Call, path: Path, lines: _Lines, start: int, end: int) -> None:
    total = len(lines.lines)
    if start < 1 or end < start or end > total:
        raise ToolFailure(
            f"lines {start}-{end} are not in {call.rel(path)}, which has {total} line(s); "
            f"lines are numbered from 1 and a range is inclusive (start <= end <= {total})"
        )


# -- helpers -----------------------------------------------------------------------------------


def _lexical_link(call: Call, raw: object) -> Path | None:
    """Where ``raw`` points without following its last component (to act on a symlink itself),
    when that place is inside the base; None otherwise."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    raw = raw.strip()
    candidate = raw if os.path.isabs(raw) else os.path.join(call.base, raw)
    head, name = os.path.split(os.path.normpath(candidate))
    if not name or name in (".", ".."):
        return None
    parent = Path(os.path.realpath(head))
    if parent != call.base and call.base not in parent.parents:
        return None
    return parent / name


def _p(name: str, type_: str = "path", required: bool = True, *, follow: bool = True) -> Param:
    return Param(name, type_, required, follow=follow)  # type: ignore[arg-type]


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "read_file",
        (_p("path"),),
        _guard(read_file),
        "Read a whole text file.",
        read_only=True,
        idempotent=False,
    ),
    ToolSpec(
        "write_file",
        (_p("path"), _p("content", "string")),
        _guard(write_file),
        "Create or overwrite a file (parent directories are created).",
        writes=True,
        # The whole content, written atomically: a second run leaves what one run does.
        read_only=False,
        idempotent=True,
    ),
    ToolSpec(
        "delete_file",
        (_p("path", follow=False),),
        _guard(delete_file),
        "Delete a file, or a directory recursively.",
        writes=True,
        # A second run fails (NotFound), and would delete whatever was put there since.
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "move_file",
        (_p("source", follow=False), _p("destination")),
        _guard(move_file),
        "Move or rename a file or directory.",
        writes=True,
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "copy_file",
        (_p("source"), _p("destination")),
        _guard(copy_file),
        "Copy a file or directory.",
        writes=True,
        # Copying a directory a second time fails: its destination exists by then.
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "list_dir",
        (_p("path", required=False),),
        _guard(list_dir),
        "List a directory, sorted; directories end with '/'.",
        read_only=True,
        idempotent=False,
    ),
    ToolSpec(
        "create_dir",
        (_p("path"),),
        _guard(create_dir),
        "Create a directory (like mkdir -p).",
        writes=True,
        # mkdir -p: an existing directory is success, so again is the same as once.
        read_only=False,
        idempotent=True,
    ),
    ToolSpec(
        "write_in_between",
        (_p("path"), _p("content", "string"), _p("linebefore", "integer")),
        _guard(write_in_between),
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
        _guard(modify_line_between),
        "Replace lines startline..endline (inclusive) with content.",
        writes=True,
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "delete_line",
        (_p("path"), _p("line", "string")),
        _guard(delete_line),
        "Delete one line ('7') or an inclusive range ('3-5').",
        writes=True,
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "read_lines",
        (_p("path"), _p("start", "integer", False), _p("end", "integer", False)),
        _guard(read_lines),
        "Read numbered lines start..end (inclusive; end is clamped to the last line).",
        read_only=True,
        idempotent=False,
    ),
)
