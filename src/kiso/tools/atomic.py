"""Durable atomic file replacement, shared by kiso's file tools and Kyronix's executer.

:func:`atomic_write_at` writes a temporary file *inside an already opened directory* (a directory
file descriptor), fsyncs it, renames it over the target with directory fds and fsyncs the
directory: a reader sees the old bytes or the new, never a mix, a crash (or a power cut) leaves
one or the other, and the temporary file can never land anywhere but in that directory, whatever
happens to the path meanwhile. :func:`atomic_write_beneath` opens that directory through the path
sandbox (:func:`kiso.tools.paths.open_parent`); :func:`atomic_write` is for paths kiso owns
(its own state files).

Replacing is always a rename: a hard link to a file elsewhere is replaced by a new file, never
written through (the other name keeps its old content), and a symlink at the target is replaced,
not followed. The new file keeps the old one's permission bits, without setuid and setgid.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "KEEP_MODE",
    "atomic_replace_at",
    "atomic_write",
    "atomic_write_at",
    "atomic_write_beneath",
]

KEEP_MODE = -1
"""``mode=KEEP_MODE``: the replaced file's permission bits (setuid/setgid cleared), else 0o666
minus the umask for a new file."""

_DROPPED_BITS = stat.S_ISUID | stat.S_ISGID


def temp_name(name: str) -> str:
    """A hidden temporary name beside ``name`` (at most ~90 bytes, whatever ``name`` is)."""
    stem = name.encode("utf-8", "surrogateescape")[:64].decode("utf-8", "ignore")
    return f".{stem}.{secrets.token_hex(6)}.kiso-tmp"


def atomic_replace_at(
    dir_fd: int, name: str, write: Callable[[int], None], *, mode: int = KEEP_MODE
) -> None:
    """Replace ``name`` in the directory ``dir_fd`` with a file whose content ``write(fd)``
    writes, atomically and durably. ``mode`` is the new file's permission bits, or
    :data:`KEEP_MODE`. An existing directory at ``name`` raises :class:`IsADirectoryError`.
    On any failure the temporary file is removed and ``name`` is unchanged."""
    if mode == KEEP_MODE:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            keep: int | None = None
        else:
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(21, "Is a directory", name)
            keep = stat.S_IMODE(st.st_mode) & ~_DROPPED_BITS if stat.S_ISREG(st.st_mode) else None
    else:
        keep = mode & ~_DROPPED_BITS
    tmp = temp_name(name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666, dir_fd=dir_fd)
    try:
        try:
            if keep is not None:
                os.fchmod(fd, keep)
            write(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write_at(dir_fd: int, name: str, data: bytes, *, mode: int = KEEP_MODE) -> None:
    """Replace ``name`` in ``dir_fd`` with ``data`` (see :func:`atomic_replace_at`)."""
    atomic_replace_at(dir_fd, name, lambda fd: write_all(fd, data), mode=mode)


def atomic_write_beneath(
    root: str | os.PathLike[str],
    target: str | os.PathLike[str],
    data: bytes,
    *,
    create_parents: bool = False,
) -> None:
    """Replace ``target`` (a path the sandbox resolved inside ``root``) with ``data``, through a
    directory fd opened beneath ``root`` (:func:`kiso.tools.paths.open_parent`): a directory
    swapped for a symlink meanwhile is refused, never written through."""
    from kiso.tools.paths import open_parent

    dir_fd, name = open_parent(root, target, create=create_parents)
    try:
        atomic_write_at(dir_fd, name, data)
    finally:
        os.close(dir_fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace the content of ``path`` with ``data`` atomically and durably.

    Writes a temporary file in ``path``'s directory (opened once, by fd), fsyncs it, renames it
    over ``path`` and fsyncs the directory. An existing file keeps its permission bits (without
    setuid/setgid); a new one gets 0o666 minus the umask. On any failure the temporary file is
    removed and ``path`` is unchanged. The parent directory must exist. For a path a model
    named, use :func:`atomic_write_beneath`, which also keeps the directory inside a workspace.
    """
    dir_fd = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        atomic_write_at(dir_fd, Path(path).name, data)
    finally:
        os.close(dir_fd)
