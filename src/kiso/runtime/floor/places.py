"""Places: what is unrecoverable.

``/`` and the system directories (temporary directories excepted), the home directory and the
keys and configuration in it, the workspace and its ``.git``, and every ancestor of those.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ANY_NAME",
    "PROTECTED_IN_HOME",
    "RANK",
    "Places",
    "inside",
    "join",
    "strictly_inside",
]

_SYSTEM_ROOTS = (
    *("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root"),
    *("/run", "/sbin", "/srv", "/sys", "/usr", "/var", "/home"),
    *("/Users", "/System", "/Library", "/Applications", "/private"),  # macOS
)
_TEMP_DIRS = ("/tmp", "/var/tmp", "/private/tmp", "/private/var/tmp")
PROTECTED_IN_HOME = {
    ".ssh": "your SSH keys",
    ".gnupg": "your GnuPG keys",
    ".aws": "your AWS credentials",
    ".config": "your configuration",
    ".kiso": "kiso's own state",
}
RANK = {
    name: rank
    for rank, name in enumerate([*(r[1:] for r in _SYSTEM_ROOTS), ".git", *PROTECTED_IN_HOME])
}
"""The order in which a wildcard's matches are reported: the most telling first."""
ANY_NAME = "\0"
"""A path component standing for "any other name" when a wildcard is followed."""


def _norm(path: str) -> str:
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/") if path.startswith("//") else path


def join(base: str, path: str) -> str:
    return _norm(posixpath.join(base, path))


def inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def strictly_inside(path: str, root: str) -> bool:
    return path != root and inside(path, root)


def _is_temp(path: str) -> bool:
    if any(inside(path, temp) for temp in _TEMP_DIRS):
        return True
    parts = path.split("/")[1:]
    if parts[:1] == ["private"]:
        parts = parts[1:]
    # macOS per-user temporary directories: /var/folders/xx/yyyy/T
    return len(parts) >= 5 and parts[:2] == ["var", "folders"] and parts[4] == "T"


@dataclass(frozen=True, slots=True)
class Places:
    workspace: str
    home: str
    sensitive: frozenset[str]
    """Every path a wildcard must not reach, closed under ancestors (so one level suffices)."""

    @classmethod
    def of(cls, workspace: Path, home: Path) -> Places:
        ws, hm = join("/", str(workspace)), join("/", str(home))
        sensitive = {"/", *_SYSTEM_ROOTS, join(ws, ".git")}
        sensitive.update(join(hm, name) for name in PROTECTED_IN_HOME)
        for start in (ws, hm):
            path = start
            while path != "/":
                sensitive.add(path)
                path = posixpath.dirname(path)
        return cls(ws, hm, frozenset(sensitive))

    def classify(self, path: str) -> str | None:
        """Describe ``path`` if deleting it cannot be undone; ``None`` if it can."""
        found = self._classify(path)
        return None if found is None else found.replace(ANY_NAME, "*")

    def _classify(self, path: str) -> str | None:
        ws, home = self.workspace, self.home
        git = join(ws, ".git")
        if path == "/":
            return "the whole file system (/)"
        if path == ws:
            return f"the workspace root ({ws})"
        if path == home:
            return f"your home directory ({home})"
        if inside(path, git):
            return f"the workspace's git history ({path})"
        if strictly_inside(ws, path):
            return f"{path} (it holds the workspace)"
        if strictly_inside(home, path):
            return f"{path} (it holds your home directory)"
        for name, label in PROTECTED_IN_HOME.items():
            if inside(path, join(home, name)):
                return f"{label} ({path})"
        if any(inside(path, place) for place in (ws, home) if place != "/") or _is_temp(path):
            return None
        for root in _SYSTEM_ROOTS:
            if path == root:
                return f"the system directory {root}"
            if inside(path, root):
                return f"{path} (in the system directory {root})"
        return None
