"""The per-project sidecar index: a cache of listing rows, never a source of truth.

``.index.json`` in a project folder maps each session id to the row :func:`summarize` gave and the
``(size, mtime_ns, inode)`` of the log it was computed from. A listing reuses a row only while the
log still has exactly that size, mtime and inode (an append-only file that changed has grown or
been replaced); otherwise it loads the log and recomputes. A missing, unreadable or malformed
index is simply rebuilt, and rows of deleted logs are dropped. The cache is replaced atomically
(temporary file, fsync, rename), so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiso.kernel.errors import CorruptLogError, StoreError
from kiso.kernel.events import SessionHeader, header_from_json
from kiso.kernel.listing import SessionInfo, summarize
from kiso.kernel.recovery import SessionState
from kiso.kernel.store import SessionLog

__all__ = ["INDEX_NAME", "SidecarIndex"]

INDEX_NAME = ".index.json"
INDEX_VERSION = 1

Loader = Callable[[Path], SessionLog]


class SidecarIndex:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / INDEX_NAME
        self.rebuilt: list[str] = []
        """Ids whose rows the last :meth:`refresh` recomputed from their logs."""

    def _read(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict) or raw.get("v") != INDEX_VERSION:
            return {}
        sessions = raw.get("sessions")
        return sessions if isinstance(sessions, dict) else {}

    def _write(self, sessions: dict[str, Any]) -> None:
        data = json.dumps({"v": INDEX_VERSION, "sessions": sessions}, ensure_ascii=False)
        tmp = self.folder / f".index.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            # A cache that cannot be written costs only speed: the next listing recomputes.
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def refresh(self, load: Loader) -> list[SessionInfo]:
        """The rows of every log in the folder, recomputing those whose log changed."""
        cached = self._read()
        fresh: dict[str, Any] = {}
        rows: list[SessionInfo] = []
        self.rebuilt = []
        changed = False
        try:
            with os.scandir(self.folder) as it:
                entries = list(it)
        except OSError as exc:
            raise StoreError(f"cannot list {self.folder}: {exc.strerror}") from exc
        for entry in entries:
            name = entry.name
            if not name.endswith(".jsonl") or name.startswith("."):
                continue
            sid = name[: -len(".jsonl")]
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
            hit = cached.get(sid)
            row: SessionInfo | None = None
            if isinstance(hit, dict) and hit.get("stamp") == stamp:
                try:
                    row = SessionInfo.from_json(hit["row"])
                except (KeyError, TypeError, ValueError):
                    row = None
            if row is None:
                row = self._compute(Path(entry.path), sid, st.st_mtime_ns // 1_000_000, load)
                self.rebuilt.append(sid)
                changed = True
            fresh[sid] = {"stamp": stamp, "row": row.to_json()}
            rows.append(row)
        if changed or fresh.keys() != cached.keys():
            self._write(fresh)
        return rows

    @staticmethod
    def _compute(path: Path, sid: str, mtime_ms: int, load: Loader) -> SessionInfo:
        try:
            return summarize(load(path))
        except (CorruptLogError, StoreError) as exc:
            header = _header_of(path)
            return SessionInfo(
                id=sid,
                workspace=header.workspace if header else "",
                state=SessionState.CORRUPT,
                title="",
                created=header.created if header else mtime_ms,
                updated=mtime_ms,
                runs=0,
                inputs=0,
                events=0,
                path=str(path),
                error=str(exc),
            )


def _header_of(path: Path) -> SessionHeader | None:
    """The header of a log whose later lines are damaged, when the header itself is sound."""
    try:
        with open(path, "rb") as f:
            return header_from_json(json.loads(f.readline()))
    except (OSError, ValueError):
        return None
