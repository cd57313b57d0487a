"""Where sessions live on disk: ``$KISO_HOME/projects/<workspace-slug>/<session-id>.jsonl``."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

__all__ = ["kiso_home", "make_private_dirs", "projects_dir", "workspace_slug"]


def kiso_home(environ: dict[str, str] | None = None) -> Path:
    """``$KISO_HOME``, or ``~/.kiso`` when it is unset or empty."""
    env = os.environ if environ is None else environ
    value = env.get("KISO_HOME", "")
    return Path(value).expanduser() if value else Path.home() / ".kiso"


def projects_dir(home: Path | None = None) -> Path:
    return (home if home is not None else kiso_home()) / "projects"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def workspace_slug(workspace: str | os.PathLike[str]) -> str:
    """A folder name for a workspace: its readable path, then 8 hex digits of its hash.

    ``/home/ana/src/app`` becomes ``home-ana-src-app-1c9f0e2b``. The hash keeps two paths that
    read the same once sanitised (``/a-b`` and ``/a/b``) apart; the path keeps it recognisable.
    """
    resolved = os.path.realpath(os.fspath(workspace))
    readable = _UNSAFE.sub("-", resolved).strip("-.") or "root"
    if len(readable) > 80:
        readable = readable[-80:].lstrip("-.")
    digest = hashlib.sha256(resolved.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{readable}-{digest}"


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700 (fsyncing each parent so the new
    entry is durable); folders that already exist keep the mode their owner gave them."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # mkdir's mode is filtered by the umask
        fd = os.open(d.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
