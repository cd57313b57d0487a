"""The one path sandbox: every path a tool (or an executer) touches is resolved here first.

:func:`resolve_in_workspace` turns a path a model wrote into the real, absolute path it names and
refuses it unless that real path lies inside the real workspace root. Paths are resolved, never
string-matched: ``..`` is collapsed and every symlink (file or directory, dangling or not) is
followed before the containment check, so ``link -> /etc`` is refused exactly like ``/etc``.

The check is made once, when the path is resolved. A process that can change the workspace between
the check and the use (swap a directory for a symlink) can still race it; the sandbox protects a
tool from the paths it is given, not from a concurrent adversary on the same machine.
"""

from __future__ import annotations

import errno
import os
import unicodedata
from pathlib import Path

from kiso.kernel.errors import RefusedError

__all__ = ["PathOutsideWorkspace", "display_path", "resolve_in_workspace"]


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
