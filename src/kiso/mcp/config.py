"""``mcp.json``: which MCP servers to start, parsed and validated (pure: bytes in, values out).

The shape, in ``$KISO_HOME/mcp.json`` and (once the project is trusted)
``<project>/.kiso/mcp.json``::

    {"mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "docs": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ..."},
                 "timeout": 120},
        "old":  {"command": "old-server", "disabled": true}}}

A server has either ``command`` (stdio; ``args`` and ``env`` optional) or ``url`` (streamable
HTTP; ``headers`` optional), never both; ``disabled`` (bool) and ``timeout`` (seconds a call may
take, default 60) are optional. Anything else is an error that names the file and the key.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kiso.kernel import UsageError

__all__ = [
    "DEFAULT_TIMEOUT",
    "MCP_FILE",
    "McpConfigError",
    "ServerConfig",
    "merge_layers",
    "parse_config",
]

MCP_FILE = "mcp.json"
DEFAULT_TIMEOUT = 60.0
"""Seconds one tool call may take unless the server's ``timeout`` says otherwise."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*(?:_[A-Za-z0-9-]+)*$")
_STDIO_KEYS = frozenset({"command", "args", "env", "disabled", "timeout", "sandbox"})
_HTTP_KEYS = frozenset({"url", "headers", "disabled", "timeout"})

Transport = Literal["stdio", "http"]


class McpConfigError(UsageError):
    """An ``mcp.json`` is not valid JSON or not the expected shape; the message names the file,
    the key and what to write instead."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One entry of ``mcpServers``."""

    name: str
    source: str
    """The file it came from (shown in errors and in ``/mcp``)."""
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    disabled: bool = False
    timeout: float = DEFAULT_TIMEOUT
    sandbox: bool = True
    """A stdio server runs in the session's OS sandbox unless your own ``mcp.json`` says
    ``"sandbox": false`` (docs/sandbox.md)."""
    network: bool = False
    """``"sandbox": {"network": true}``: this server may reach the network from its sandbox."""
    writable_roots: tuple[str, ...] = ()
    """``"sandbox": {"writableRoots": [...]}``: directories it may write besides the workspace."""

    @property
    def transport(self) -> Transport:
        return "stdio" if self.command is not None else "http"

    @property
    def digest(self) -> str:
        """A digest of everything that decides what the server is: a changed config invalidates
        its cached tool list."""
        shape = {
            "command": self.command,
            "args": list(self.args),
            "env": dict(sorted(self.env.items())),
            "url": self.url,
            "headers": dict(sorted(self.headers.items())),
        }
        data = json.dumps(shape, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(data).hexdigest()


def parse_config(
    data: bytes | str, source: str, *, project: bool = False
) -> dict[str, ServerConfig]:
    """The servers ``data`` (the bytes of the file ``source``) declares, in file order.
    ``project``: the file is a project's, which may not loosen a server's sandbox."""
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise McpConfigError(
            f"{source}: not valid JSON ({exc}); fix the file or remove it"
        ) from None
    if not isinstance(raw, dict):
        raise McpConfigError(
            f'{source}: the top level must be an object like {{"mcpServers": {{...}}}}, '
            f"not {_kind(raw)}"
        )
    unknown = sorted(set(raw) - {"mcpServers"})
    if unknown:
        raise McpConfigError(
            f"{source}: unknown key {unknown[0]!r} at the top level; the file holds only "
            f'"mcpServers"'
        )
    servers = raw.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise McpConfigError(
            f'{source}: "mcpServers" must be an object of server name to settings, not '
            f"{_kind(servers)}"
        )
    return {name: _server(name, spec, source, project) for name, spec in servers.items()}


def merge_layers(
    user: Mapping[str, ServerConfig], project: Mapping[str, ServerConfig]
) -> dict[str, ServerConfig]:
    """The user's servers, then the project's; a project may add servers but never replace one
    of yours (the same rule as project extensions)."""
    for name, server in project.items():
        if name in user:
            raise McpConfigError(
                f'{server.source}: server "{name}" is already defined in {user[name].source}; '
                f"a project may not replace your own servers: rename it in the project's file"
            )
    return {**user, **project}


def _server(name: str, spec: Any, source: str, project: bool = False) -> ServerConfig:
    where = f'{source}: mcpServers."{name}"'
    if not isinstance(name, str) or not _NAME.match(name):
        raise McpConfigError(
            f"{where}: a server name is letters, digits, '-' and single '_' (its tools are "
            f"named mcp__<server>__<tool>); rename it"
        )
    if not isinstance(spec, dict):
        raise McpConfigError(
            f'{where} must be an object with "command" (stdio) or "url" (HTTP), not {_kind(spec)}'
        )
    has_command, has_url = "command" in spec, "url" in spec
    if has_command == has_url:
        raise McpConfigError(
            f'{where}: give exactly one of "command" (a program to run over stdio) or "url" '
            f"(a streamable HTTP endpoint)"
        )
    allowed = _STDIO_KEYS if has_command else _HTTP_KEYS
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise McpConfigError(
            f"{where}.{unknown[0]}: unknown key for a "
            f"{'stdio' if has_command else 'HTTP'} server; allowed: {', '.join(sorted(allowed))}"
        )
    disabled = spec.get("disabled", False)
    if not isinstance(disabled, bool):
        raise McpConfigError(f"{where}.disabled must be true or false, not {_kind(disabled)}")
    timeout = spec.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise McpConfigError(f"{where}.timeout must be a positive number of seconds")
    if has_command:
        command = spec["command"]
        if not isinstance(command, str) or not command:
            raise McpConfigError(f"{where}.command must be a non-empty string (the program)")
        args = spec.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise McpConfigError(f"{where}.args must be a list of strings")
        on, network, roots = _sandbox(spec.get("sandbox", True), f"{where}.sandbox", project)
        return ServerConfig(
            name,
            source,
            command=command,
            args=tuple(args),
            env=_strings(spec.get("env", {}), f"{where}.env"),
            disabled=disabled,
            timeout=float(timeout),
            sandbox=on,
            network=network,
            writable_roots=roots,
        )
    url = spec["url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise McpConfigError(f"{where}.url must be an http:// or https:// URL")
    return ServerConfig(
        name,
        source,
        url=url,
        headers=_strings(spec.get("headers", {}), f"{where}.headers"),
        disabled=disabled,
        timeout=float(timeout),
    )


def _sandbox(value: Any, where: str, project: bool) -> tuple[bool, bool, tuple[str, ...]]:
    """``true`` (the default), ``false``, or ``{"network": bool, "writableRoots": [...]}``."""
    if value is True:
        return True, False, ()
    if project:
        raise McpConfigError(
            f"{where}: a project's mcp.json may not loosen a server's sandbox; remove the key "
            f"(your own $KISO_HOME/mcp.json may)"
        )
    if value is False:
        return False, False, ()
    if not isinstance(value, dict):
        raise McpConfigError(
            f'{where} must be true, false or an object such as {{"network": true, '
            f'"writableRoots": ["~/.cache"]}}, not {_kind(value)}'
        )
    unknown = sorted(set(value) - {"network", "writableRoots"})
    if unknown:
        raise McpConfigError(f"{where}.{unknown[0]}: unknown key; allowed: network, writableRoots")
    network = value.get("network", False)
    if not isinstance(network, bool):
        raise McpConfigError(f"{where}.network must be true or false, not {_kind(network)}")
    roots = value.get("writableRoots", [])
    if not isinstance(roots, list) or not all(
        isinstance(r, str) and r.startswith(("/", "~/")) for r in roots
    ):
        raise McpConfigError(
            f"{where}.writableRoots must be a list of absolute directory paths (or ~/...)"
        )
    return True, network, tuple(roots)


def _strings(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise McpConfigError(f"{where} must be an object of names to string values")
    return dict(value)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )
