"""Durable atomic file replacement, shared by kiso's file tools and Kyronix's executer.

:func:`atomic_write` writes a temporary file beside the target, fsyncs it, renames it over the
target and fsyncs the directory: a reader sees the old bytes or the new, never a mix, and a crash
(or a power cut) leaves one or the other.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: Path, data: bytes) -> None:
    """Replace the content of ``path`` with ``data`` atomically and durably.

    Writes a temporary file beside ``path``, fsyncs it, renames it over ``path`` and fsyncs the
    directory. An existing file keeps its permission bits; a new one gets 0o666 minus the umask.
    On any failure the temporary file is removed and ``path`` is unchanged. The parent directory
    must exist.
    """
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    directory = path.parent
    tmp = directory / f".{path.name[:64]}.{secrets.token_hex(6)}.kiso-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
