"""The one path sandbox: every path a tool (or an executer) touches is resolved here first.

:func:`resolve_in_workspace` turns a path a model wrote into the real, absolute path it names and
refuses it unless that real path lies inside the real workspace root. Paths are resolved, never
string-matched: ``..`` is collapsed and every symlink (file or directory, dangling or not) is
followed before the containment check, so ``link -> /etc`` is refused exactly like ``/etc``.

The check is made when the path is resolved; the *use* goes through directory file descriptors
(:func:`open_beneath`, :func:`open_dir_beneath`, :func:`open_parent`): the checked path is opened
component by component beneath an fd of the workspace root, following no symlink (openat2 with
``RESOLVE_BENEATH`` where the kernel has it), so a directory swapped for a symlink between the
check and the use is refused (:class:`PathChanged`), never followed out of the workspace.
:func:`open_regular` checks the kind of file on the opened fd (FIFOs, devices and sockets are
:class:`SpecialFile`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
import unicodedata
from pathlib import Path
from typing import Any

from kiso.kernel.errors import RefusedError

__all__ = [
    "PathChanged",
    "PathOutsideWorkspace",
    "SpecialFile",
    "display_path",
    "file_kind",
    "open_beneath",
    "open_dir_beneath",
    "open_parent",
    "open_regular",
    "openat2_available",
    "read_fd",
    "refuse_symlink_at",
    "relative_parts",
    "resolve_in_workspace",
]


class PathOutsideWorkspace(RefusedError, ValueError):
    """A path was refused: empty, malformed, or its real location is outside the workspace."""

    def __init__(self, path: str, workspace: Path | str, reason: str) -> None:
        self.path = path
        self.workspace = str(workspace)
        self.reason = reason
        super().__init__(
            f"path {path!r} was refused: {reason}. Only paths inside the workspace "
            f"{self.workspace} can be used; give a path relative to the workspace root (such as "
            f"'src/main.py') or an absolute path under {self.workspace}"
        )


def resolve_in_workspace(
    workspace: Path, path: str, *, must_exist: bool = False, root_is_real: bool = False
) -> Path:
    """Return the real absolute path ``path`` names, guaranteed to lie inside ``workspace``.

    ``path`` is relative to the workspace root, or absolute. Symlinks are resolved all the way;
    for a path that does not exist yet, the deepest existing ancestor is resolved and the rest is
    appended, so a file about to be created is checked where it will really land. The workspace
    root itself is accepted.

    Raises :class:`PathOutsideWorkspace` for an empty path, a NUL byte, or a real path outside
    the real workspace root; with ``must_exist``, raises :class:`FileNotFoundError` when nothing
    exists at the resolved path (a dangling symlink inside the workspace counts as missing).
    ``root_is_real`` says the caller already resolved ``workspace`` with ``realpath`` (a hot path
    that checks many paths against one root skips doing it again).
    """
    if not isinstance(path, str):
        raise PathOutsideWorkspace(repr(path), workspace, "a path must be a string")
    if not path.strip():
        raise PathOutsideWorkspace(path, workspace, "the path is empty")
    if "\x00" in path:
        raise PathOutsideWorkspace(path, workspace, "the path contains a NUL byte")
    if path.startswith("~"):
        raise PathOutsideWorkspace(
            path, workspace, "'~' is not expanded to a home directory (it would be a literal name)"
        )
    if _looks_like_traversal(path):
        raise PathOutsideWorkspace(
            path,
            workspace,
            "it uses characters that look like '/' or '..' (unicode look-alikes or a backslash)",
        )

    root_s = os.fspath(workspace) if root_is_real else os.path.realpath(workspace)
    candidate = path if os.path.isabs(path) else os.path.join(root_s, path)
    # realpath(strict=False) resolves every existing component (following symlinks, including a
    # dangling one's target) and appends the components that do not exist yet.
    resolved_s = os.path.realpath(candidate)
    # Containment by whole components (commonpath), never by string prefix: /base-evil is out.
    if resolved_s != root_s and os.path.commonpath((root_s, resolved_s)) != root_s:
        root, resolved = Path(root_s), Path(resolved_s)
        if resolved == Path(os.path.abspath(candidate)):
            reason = f"it is {resolved}, which is outside the workspace"
        else:
            reason = f"it resolves (through '..' or a symlink) to {resolved}, outside the workspace"
        raise PathOutsideWorkspace(path, root, reason)
    resolved = Path(resolved_s)
    if must_exist and not resolved.exists():
        raise FileNotFoundError(
            errno.ENOENT,
            f"nothing exists at {path!r} in the workspace {root_s}; check the name with list_dir",
            str(resolved),
        )
    return resolved


# Characters that render like '/' but are not: a path built from them is a trick or a mistake.
_SLASH_LIKE = str.maketrans({c: "/" for c in "\u2215\u2044\u29f8\u29f9\uff0f\u2571\u2572\\"})


def _looks_like_traversal(path: str) -> bool:
    """True when a component would read as ``..`` or ``.`` or hold a separator, once unicode
    look-alikes (fullwidth dots, one-dot leaders, division slashes, backslashes) are folded."""
    if path.isascii() and "\\" not in path:
        return False
    for part in path.split("/"):
        folded = unicodedata.normalize("NFKC", part).translate(_SLASH_LIKE)
        folded = folded.replace("\u2024", ".").replace("\u2025", "..").replace("\u2026", "...")
        if folded == part:
            continue
        pieces = folded.split("/")
        if len(pieces) > 1 and any(p in ("..", ".") for p in pieces):
            return True
        if any(p and set(p) == {"."} for p in pieces):
            return True
    return False


def display_path(workspace: Path, resolved: Path) -> str:
    """The workspace-relative POSIX form of a resolved path (``.`` for the root itself)."""
    root = Path(os.path.realpath(workspace))
    try:
        rel = resolved.relative_to(root)
    except ValueError:
        return str(resolved)
    return rel.as_posix() if rel.parts else "."


# ---------------------------------------------------------------------------------------------
# Using what was resolved: through directory file descriptors, never through the path again.
#
# resolve_in_workspace checks a path; the functions below *use* one. They open the checked path
# component by component beneath an fd of the workspace root and refuse every symlink on the way
# (the checked path has none: realpath resolved them all), so a directory swapped for a symlink
# between the check and the use (or during the use) is met as a symlink and refused, never
# followed. Where the kernel has openat2 (Linux 5.6+) one syscall does the walk with
# RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS; elsewhere each component is
# opened with O_NOFOLLOW relative to the previous one. The two are equivalent by construction.

O_PATH: int = getattr(os, "O_PATH", 0)
_O_SEARCH = O_PATH or os.O_RDONLY
"""How intermediate directories are opened (O_PATH: only search permission is needed)."""

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())


class PathChanged(PathOutsideWorkspace):
    """The checked path changed while it was in use: a component became a symlink (or moved),
    so it was not followed and nothing was done through it."""


class SpecialFile(OSError):
    """Not a regular file: a FIFO, a device or a socket (``kind`` says which). Such a file is
    never read or copied: a FIFO blocks, a device can stream without end."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(errno.EINVAL, f"{path} is {kind}, not a regular file", path)
        self.kind = kind


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


class _Openat2:
    """openat2(2) through ctypes, or ``None`` where the kernel (or a seccomp filter) lacks it."""

    def __init__(self) -> None:
        self.enabled: bool | None = None if _SYS_OPENAT2 is not None else False
        self._syscall: Any = None

    def __call__(self, dir_fd: int, rel: str, flags: int, mode: int) -> int | None:
        if self.enabled is False:
            return None
        if self._syscall is None:
            libc = ctypes.CDLL(None, use_errno=True)
            self._syscall = libc.syscall
            self._syscall.restype = ctypes.c_long
        how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE)
        encoded = os.fsencode(rel)
        for _ in range(4):
            fd = int(
                self._syscall(
                    ctypes.c_long(_SYS_OPENAT2 or -1),
                    ctypes.c_int(dir_fd),
                    ctypes.c_char_p(encoded),
                    ctypes.byref(how),
                    ctypes.c_size_t(ctypes.sizeof(how)),
                )
            )
            if fd >= 0:
                self.enabled = True
                return fd
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EPERM) and self.enabled is None:
                self.enabled = False  # no openat2 here (old kernel, or filtered): walk instead
                return None
            if err != errno.EAGAIN:  # EAGAIN: a concurrent rename; the kernel asks to retry
                raise OSError(err, os.strerror(err), rel)
        raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), rel)


_openat2 = _Openat2()


def openat2_available() -> bool:
    """Whether the fast path (openat2 with RESOLVE_BENEATH) is in use on this machine."""
    if _openat2.enabled is None:
        fd = os.open("/", _O_SEARCH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            probe = _openat2(fd, ".", _O_SEARCH | os.O_DIRECTORY, 0)
            if probe is not None:
                os.close(probe)
        except OSError:
            pass
        finally:
            os.close(fd)
    return bool(_openat2.enabled)


def relative_parts(root: str | os.PathLike[str], target: str | os.PathLike[str]) -> list[str]:
    """The components of ``target`` below ``root`` (both real, absolute); ``[]`` for the root.
    Raises :class:`PathOutsideWorkspace` when ``target`` is not lexically under ``root``."""
    r, t = os.fspath(root), os.fspath(target)
    if t == r:
        return []
    prefix = r if r.endswith("/") else r + "/"
    if not t.startswith(prefix):
        raise PathOutsideWorkspace(t, r, "it is not inside the workspace")
    parts = t[len(prefix) :].split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise PathOutsideWorkspace(t, r, "it is not a resolved path (empty, '.' or '..' parts)")
    if len(os.fsencode(t)) >= 4096 or any(len(os.fsencode(p)) > 255 for p in parts):
        raise OSError(
            errno.ENAMETOOLONG,
            "a name in the path is too long (at most 255 bytes per name, 4,095 per path)",
            t,
        )
    return parts


def _open_root(root: str) -> int:
    return os.open(root, _O_SEARCH | os.O_DIRECTORY | os.O_CLOEXEC)


def open_beneath(
    root: str | os.PathLike[str],
    target: str | os.PathLike[str],
    flags: int = os.O_RDONLY,
    mode: int = 0o666,
) -> int:
    """Open ``target`` (a path :func:`resolve_in_workspace` returned) beneath ``root`` with
    ``flags``, following no symlink on the way or at the end. Returns a new fd (close it).

    Raises :class:`PathChanged` when a component is (now) a symlink, a plain :class:`OSError`
    with ``ELOOP`` when that symlink loops (a loop is left unresolved by the check), and the
    usual :class:`OSError` otherwise (``ENOENT``, ``ENOTDIR``, ...).
    """
    root_s = os.fspath(root)
    parts = relative_parts(root_s, target)
    if not parts:
        return os.open(root_s, flags | os.O_CLOEXEC, mode)
    root_fd = _open_root(root_s)
    try:
        try:
            fd = _openat2(root_fd, "/".join(parts), flags, mode)
            if fd is None:
                fd = _walk_open(root_fd, parts, flags, mode)
        except OSError as exc:
            raise _explain(root_s, parts, exc) from None
        return fd
    finally:
        os.close(root_fd)


def open_dir_beneath(
    root: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    create: bool = False,
    search_only: bool = False,
) -> int:
    """An fd of the directory ``target`` beneath ``root`` (``mkdir -p`` first with ``create``).
    ``search_only`` opens it with ``O_PATH`` (enough for ``dir_fd=`` use; not for listing or
    fsync). A file in the way raises :class:`NotADirectoryError` naming it."""
    flags = (_O_SEARCH if search_only else os.O_RDONLY) | os.O_DIRECTORY
    try:
        return open_beneath(root, target, flags)
    except FileNotFoundError:
        if not create:
            raise
    root_s = os.fspath(root)
    parts = relative_parts(root_s, target)
    fd = _open_root(root_s)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            want = flags if last else _O_SEARCH | os.O_DIRECTORY
            try:
                nxt = _open_component(fd, name, want)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                try:
                    nxt = _open_component(fd, name, want)
                except OSError as exc:
                    raise _explain(root_s, parts[: i + 1], exc) from None
            except OSError as exc:
                raise _explain(root_s, parts[: i + 1], exc) from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_parent(
    root: str | os.PathLike[str], target: str | os.PathLike[str], *, create: bool = False
) -> tuple[int, str]:
    """``(fd of the directory holding target, target's name)``, beneath ``root``; the fd is
    readable (for fsync). ``create`` makes the missing parent directories. The root itself has
    no parent inside the workspace: refused."""
    root_s = os.fspath(root)
    parts = relative_parts(root_s, target)
    if not parts:
        raise PathOutsideWorkspace(root_s, root_s, "it is the workspace root itself")
    parent = os.path.join(root_s, *parts[:-1]) if len(parts) > 1 else root_s
    return open_dir_beneath(root_s, parent, create=create), parts[-1]


def _open_component(dir_fd: int, name: str, flags: int) -> int:
    """One component, relative to ``dir_fd``, never following a symlink."""
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _walk_open(root_fd: int, parts: list[str], flags: int, mode: int) -> int:
    """The portable walk: each directory opened with O_NOFOLLOW | O_DIRECTORY relative to the
    one before, the last component with O_NOFOLLOW and ``flags``."""
    fd = root_fd
    try:
        for name in parts[:-1]:
            nxt = _open_component(fd, name, _O_SEARCH | os.O_DIRECTORY)
            if fd != root_fd:
                os.close(fd)
            fd = nxt
        last = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        if flags & O_PATH and stat.S_ISLNK(os.fstat(last).st_mode):
            os.close(last)  # O_PATH | O_NOFOLLOW opens a symlink itself: refuse it the same way
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), parts[-1])
        return last
    finally:
        if fd != root_fd:
            os.close(fd)


def _explain(root: str, parts: list[str], exc: OSError) -> OSError | PathChanged:
    """Turn ELOOP / EXDEV (a symlink met on the way) into a clear refusal or a loop error."""
    if exc.errno not in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
        exc.filename = os.path.join(root, *parts)
        return exc
    where = root
    for name in parts:
        where = os.path.join(where, name)
        try:
            st = os.lstat(where)
        except OSError:
            break
        if stat.S_ISLNK(st.st_mode):
            shown = where[len(root) + 1 :]
            try:
                os.stat(where)
            except OSError as inner:
                if inner.errno == errno.ELOOP:
                    return OSError(
                        errno.ELOOP,
                        f"{shown} is a symbolic link that loops (it leads back to itself); "
                        f"remove it or point it at a real file",
                        where,
                    )
            return PathChanged(
                shown,
                root,
                f"{shown} became a symbolic link while it was in use, so it was not followed "
                f"(nothing was read or written through it)",
            )
        if not stat.S_ISDIR(st.st_mode) and where != os.path.join(root, *parts):
            return NotADirectoryError(
                errno.ENOTDIR, f"{where[len(root) + 1 :]} is a file, not a directory", where
            )
    if exc.errno == errno.ENOTDIR:
        exc.filename = os.path.join(root, *parts)
        return exc
    return PathChanged(
        "/".join(parts),
        root,
        "it changed while it was in use (a symlink appeared on the way), so nothing was done",
    )


def refuse_symlink_at(dir_fd: int, name: str, shown: str) -> None:
    """Raise when ``name`` in ``dir_fd`` is a symlink. A checked path never ends in one (the
    check resolved it), unless it loops (left unresolved) or changed since: either way a write
    must not replace it blindly."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISLNK(st.st_mode):
        return
    try:
        os.stat(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                errno.ELOOP,
                f"{shown} is a symbolic link that loops (it leads back to itself); remove it or "
                f"point it at a real file",
                shown,
            ) from None
    raise PathChanged(shown, "the workspace", f"{shown} became a symbolic link while it was in use")


# ---------------------------------------------------------------------------------------------
# What kind of file an fd is.


def file_kind(mode: int) -> str:
    """``a regular file``, ``a directory``, ``a FIFO (named pipe)``, ... for an ``st_mode``."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def open_regular(
    root: str | os.PathLike[str], target: str | os.PathLike[str], shown: str | None = None
) -> tuple[int, os.stat_result]:
    """Open a regular file beneath ``root`` for reading, and its ``fstat``. It is opened with
    ``O_NONBLOCK`` (a FIFO does not block the open) and its kind checked on the fd: a directory
    raises :class:`IsADirectoryError`, a FIFO, device or socket :class:`SpecialFile`."""
    name = shown if shown is not None else os.fspath(target)
    try:
        fd = open_beneath(root, target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # opening a socket file
            raise SpecialFile(name, "a socket") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, f"{name} is a directory", name)
        raise SpecialFile(name, file_kind(st.st_mode))
    return fd, st


def read_fd(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd`` (from its current offset)."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
