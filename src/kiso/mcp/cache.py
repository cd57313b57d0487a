"""``$KISO_HOME/mcp-cache.json``: each server's tool list from its last connection, so its tools
register at start without waiting for it.

Version 1::

    {"version": 1, "servers": {"time": {"digest": "sha256:…", "tools": [
        {"name": "get_current_time", "description": "…", "inputSchema": {…},
         "readOnly": true, "idempotent": false}]}}}

An entry applies only while its ``digest`` matches the server's config
(:attr:`ServerConfig.digest`); a file that cannot be read is ignored (and rewritten on the next
connection), never an error.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiso.kernel.layout import make_private_dirs
from kiso.tools.atomic import atomic_write

__all__ = ["CACHE_FILE", "CACHE_VERSION", "McpToolInfo", "ToolCache"]

CACHE_FILE = "mcp-cache.json"
CACHE_VERSION = 1


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """One tool as a server lists it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool = False
    """``readOnlyHint``: it changes nothing (kiso effects ``read``)."""
    idempotent: bool = False
    """``idempotentHint`` (and not read-only): a repeat is harmless."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "readOnly": self.read_only,
            "idempotent": self.idempotent,
        }

    @classmethod
    def from_json(cls, raw: Any) -> McpToolInfo | None:
        if not isinstance(raw, dict):
            return None
        name, schema = raw.get("name"), raw.get("inputSchema")
        if not isinstance(name, str) or not isinstance(schema, dict):
            return None
        description = raw.get("description")
        return cls(
            name,
            description if isinstance(description, str) else "",
            schema,
            read_only=raw.get("readOnly") is True,
            idempotent=raw.get("idempotent") is True,
        )


class ToolCache:
    def __init__(self, home: Path) -> None:
        self.path = Path(home) / CACHE_FILE
        self._lock = threading.Lock()

    def _read(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict) or raw.get("version") != CACHE_VERSION:
            return {}
        servers = raw.get("servers")
        return servers if isinstance(servers, dict) else {}

    def get(self, server: str, digest: str) -> list[McpToolInfo] | None:
        """The cached tools of ``server`` when its config still has ``digest``, else None."""
        with self._lock:
            entry = self._read().get(server)
        if not isinstance(entry, dict) or entry.get("digest") != digest:
            return None
        tools = entry.get("tools")
        if not isinstance(tools, list):
            return None
        infos = [McpToolInfo.from_json(t) for t in tools]
        return [t for t in infos if t is not None]

    def put(self, server: str, digest: str, tools: list[McpToolInfo]) -> None:
        with self._lock:
            servers = self._read()
            entry = {"digest": digest, "tools": [t.to_json() for t in tools]}
            if servers.get(server) == entry:
                return
            servers[server] = entry
            data = json.dumps({"version": CACHE_VERSION, "servers": servers}, indent=1)
            try:
                make_private_dirs(self.path.parent)
                atomic_write(self.path, data.encode() + b"\n")
            except OSError:
                pass  # a cache that cannot be written costs a wait next start, nothing more
