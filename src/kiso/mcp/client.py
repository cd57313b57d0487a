"""``McpManager``: one connection per configured MCP server, on the official ``mcp`` SDK.

The connections live on a private event loop in a daemon thread (an MCP session is an anyio task
group that must be entered and left by the same task, and a kiso run's loop comes and goes), so
a call from any loop or thread is handed over with :func:`asyncio.run_coroutine_threadsafe`.

Every server connects in the background as soon as :meth:`McpManager.start` runs. A server that
cannot be started or reached is a soft failure: its state is ``failed`` with the error, the
others carry on. :meth:`McpManager.status` gives each server's state (``connecting``,
``ready``, ``failed``, ``disabled``), its tools and its last error.

A call waits (bounded) for its server to be ready, then runs under the server's ``timeout`` and
the run's abort signal. stdio children get ``env`` (the caller's credential-stripped
environment, :func:`kiso.tools.env.child_env`) with the server's own ``env`` on top.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from kiso.kernel.layout import make_private_dirs
from kiso.mcp.cache import McpToolInfo, ToolCache
from kiso.mcp.config import ServerConfig
from kiso.tools.base import AbortSignal, ToolResult
from kiso.tools.sandbox import Sandbox, SandboxPolicy

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "McpManager", "ServerState", "ServerStatus"]

DEFAULT_CONNECT_TIMEOUT = 30.0
"""Seconds a server has to start, initialise and list its tools before it counts as failed."""
_ABORT_POLL = 0.05


class ServerState(StrEnum):
    CONNECTING = "connecting"
    READY = "ready"
    FAILED = "failed"
    DISABLED = "disabled"


@dataclass(frozen=True, slots=True)
class ServerStatus:
    name: str
    state: ServerState
    transport: str
    source: str
    tools: tuple[str, ...]
    """The server's own tool names: live once ready, else the cached ones."""
    error: str | None = None
    """The last error (why it failed, or why it dropped)."""


class _Server:
    def __init__(self, config: ServerConfig, cached: list[McpToolInfo] | None) -> None:
        self.config = config
        self.cached = cached
        self.live: dict[str, McpToolInfo] | None = None
        self.state = ServerState.DISABLED if config.disabled else ServerState.CONNECTING
        self.error: str | None = None
        self.session: Any = None
        self.ready = threading.Event()
        """Set once the state is no longer ``connecting``."""
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None
        if config.disabled:
            self.ready.set()

    def tools(self) -> list[McpToolInfo]:
        if self.live is not None:
            return list(self.live.values())
        return list(self.cached or [])


class McpManager:
    def __init__(
        self,
        servers: Mapping[str, ServerConfig],
        *,
        env: Mapping[str, str],
        home: Path,
        cwd: Path | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        sandbox: SandboxPolicy | None = None,
    ) -> None:
        self.env = dict(env)
        self.sandbox = sandbox
        """The session's sandbox: every stdio server runs in it, as its config allows."""
        self.home = Path(home)
        self.cwd = cwd
        self.connect_timeout = connect_timeout
        self.cache = ToolCache(self.home)
        self._servers = {
            name: _Server(cfg, None if cfg.disabled else self.cache.get(name, cfg.digest))
            for name, cfg in servers.items()
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start connecting every enabled server in the background (returns at once)."""
        with self._lock:
            if self._loop is not None or self._closed:
                return
            loop = self._loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            self._thread = threading.Thread(target=run, name="kiso-mcp", daemon=True)
            self._thread.start()
            started.wait()
        for server in self._servers.values():
            if server.state is ServerState.CONNECTING:
                asyncio.run_coroutine_threadsafe(self._launch(server), loop).result()

    async def _launch(self, server: _Server) -> None:
        server.stop = asyncio.Event()
        server.task = asyncio.create_task(self._serve(server))

    def close(self, timeout: float = 5.0) -> None:
        """Stop every server (each stdio child is closed, then killed) and the thread."""
        with self._lock:
            loop, self._loop, self._closed = self._loop, None, True
        if loop is None:
            return

        async def stop_all() -> None:
            tasks = []
            for server in self._servers.values():
                if server.stop is not None:
                    server.stop.set()
                if server.task is not None:
                    tasks.append(server.task)
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=timeout)
                for task in pending:
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop_all(), loop).result(timeout + 1)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                loop.close()

    def __enter__(self) -> McpManager:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------ what it knows

    @property
    def servers(self) -> dict[str, ServerConfig]:
        return {name: s.config for name, s in self._servers.items()}

    def status(self) -> list[ServerStatus]:
        return [
            ServerStatus(
                name,
                s.state,
                s.config.transport,
                s.config.source,
                tuple(t.name for t in s.tools()),
                s.error,
            )
            for name, s in self._servers.items()
        ]

    def tools_of(self, server: str) -> list[McpToolInfo]:
        """``server``'s tools: the live list once it is ready, else its cached one."""
        s = self._servers.get(server)
        return s.tools() if s is not None else []

    def has_cache(self, server: str) -> bool:
        s = self._servers.get(server)
        return s is not None and s.cached is not None

    def wait_ready(self, timeout: float, servers: list[str] | None = None) -> bool:
        """Wait until every server (or those named) has left ``connecting``; whether they have."""
        import time

        deadline = time.monotonic() + timeout
        names = servers if servers is not None else list(self._servers)
        for name in names:
            if not self._servers[name].ready.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    # ------------------------------------------------------------------------ connections

    def _argv(self, cfg: ServerConfig) -> list[str]:
        """The server's command line: in the sandbox (``bwrap ... -- command args``) unless it
        is off, the server's own config says ``"sandbox": false``, or bubblewrap is missing."""
        argv = [cfg.command or "", *cfg.args]
        policy = self.sandbox
        if policy is None or not policy.on or not cfg.sandbox:
            return argv
        policy = replace(
            policy,
            network=policy.network or cfg.network,
            writable_roots=policy.writable_roots + cfg.writable_roots,
        )
        cwd = self.cwd or Path.cwd()
        sandbox = Sandbox.for_workspace(policy, cwd, temp_parent=self.home)
        if sandbox is None or not sandbox.available:
            return argv
        return sandbox.wrap(argv, cwd)

    async def _serve(self, server: _Server) -> None:
        import anyio

        from mcp import ClientSession

        cfg = server.config
        errlog: TextIO | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                if cfg.transport == "stdio":
                    from mcp.client.stdio import StdioServerParameters, stdio_client

                    errlog = self._errlog(cfg.name)
                    argv = self._argv(cfg)
                    params = StdioServerParameters(
                        command=argv[0],
                        args=argv[1:],
                        env={**self.env, **cfg.env},
                        cwd=self.cwd,
                    )
                    read, write = await stack.enter_async_context(stdio_client(params, errlog))
                else:
                    import httpx2
                    from mcp.client.streamable_http import streamable_http_client

                    client = await stack.enter_async_context(
                        httpx2.AsyncClient(
                            headers=dict(cfg.headers),
                            timeout=httpx2.Timeout(30.0, read=300.0),
                        )
                    )
                    read, write = await stack.enter_async_context(
                        streamable_http_client(cfg.url or "", http_client=client)
                    )
                session = await stack.enter_async_context(ClientSession(read, write))
                with anyio.fail_after(self.connect_timeout):
                    await session.initialize()
                    tools = await _list_tools(session)
                server.session = session
                server.live = {t.name: t for t in tools}
                server.state = ServerState.READY
                server.error = None
                server.ready.set()
                self.cache.put(cfg.name, cfg.digest, tools)
                assert server.stop is not None
                await server.stop.wait()
        except asyncio.CancelledError:
            server.error = server.error or "stopped"
            raise
        except BaseException as exc:
            server.error = _describe(exc, cfg, self.connect_timeout)
        finally:
            server.session = None
            server.state = ServerState.FAILED if server.error else server.state
            if server.state is ServerState.READY:  # closed on purpose
                server.state = ServerState.FAILED
                server.error = "closed"
            server.ready.set()
            if errlog is not None:
                errlog.close()

    def _errlog(self, name: str) -> TextIO:
        """Where a stdio child's stderr goes: ``$KISO_HOME/logs/mcp-<server>.log`` (never the
        terminal, which the interactive session owns)."""
        logs = self.home / "logs"
        try:
            make_private_dirs(logs)
            return open(logs / f"mcp-{name}.log", "a", encoding="utf-8")
        except OSError:
            return open(os.devnull, "w", encoding="utf-8")

    # ------------------------------------------------------------------------ calls

    async def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        abort: AbortSignal | None = None,
    ) -> ToolResult:
        """Call ``tool`` on ``server``: wait (bounded) for it to be ready, then run the call under
        the server's timeout and ``abort``. Every failure is an error result, never an exception
        (but a cancelled caller is cancelled)."""
        s = self._servers.get(server)
        if s is None:
            return _error(f"no MCP server named {server!r} is configured", "precondition")
        if s.state is ServerState.DISABLED:
            return _error(
                f'MCP server "{server}" is disabled in {s.config.source}; remove "disabled" there '
                f"to use it",
                "precondition",
            )
        if not s.ready.is_set():
            if self._loop is None:
                self.start()
            waited = await self._wait(s.ready, self.connect_timeout, abort)
            if waited == "aborted":
                return _error(f"aborted while waiting for MCP server {server!r}", "aborted")
            if waited == "timeout":
                return _error(
                    f'MCP server "{server}" did not become ready within '
                    f"{self.connect_timeout:g}s; see /mcp",
                    "transient",
                )
        if s.state is not ServerState.READY or s.session is None:
            return _error(
                f'MCP server "{server}" is not connected ({s.error or s.state.value}); fix its '
                f"entry in {s.config.source} (see /mcp) and start kiso again",
                "precondition",
            )
        if s.live is not None and tool not in s.live:
            return _error(
                f'MCP server "{server}" no longer offers the tool "{tool}" (it was in the cached '
                f"list from an earlier connection); its tools now: "
                f"{', '.join(sorted(s.live)) or 'none'}",
                "precondition",
            )
        loop = self._loop
        assert loop is not None
        timeout = s.config.timeout
        future = asyncio.run_coroutine_threadsafe(_call(s.session, tool, arguments, timeout), loop)
        try:
            outcome = await self._wait_future(future, abort)
        except asyncio.CancelledError:
            future.cancel()
            raise
        if outcome is None:
            future.cancel()
            return _error(f"aborted: the call to {server}/{tool} was cancelled", "aborted")
        return outcome

    async def _wait(self, event: threading.Event, timeout: float, abort: AbortSignal | None) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not event.is_set():
            if abort is not None and abort.is_set():
                return "aborted"
            if loop.time() >= deadline:
                return "timeout"
            await asyncio.sleep(_ABORT_POLL)
        return "ready"

    async def _wait_future(
        self, future: concurrent.futures.Future[ToolResult], abort: AbortSignal | None
    ) -> ToolResult | None:
        wrapped = asyncio.wrap_future(future)
        while True:
            done, _ = await asyncio.wait({wrapped}, timeout=_ABORT_POLL)
            if done:
                return wrapped.result()
            if abort is not None and abort.is_set():
                return None


async def _list_tools(session: Any) -> list[McpToolInfo]:
    tools: list[McpToolInfo] = []
    cursor: str | None = None
    while True:
        if cursor is None:
            result = await session.list_tools()
        else:
            from mcp.types import PaginatedRequestParams

            result = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        for t in result.tools:
            ann = t.annotations
            read_only = bool(ann is not None and ann.read_only_hint)
            idempotent = bool(ann is not None and ann.idempotent_hint)
            tools.append(
                McpToolInfo(
                    t.name,
                    t.description or "",
                    dict(t.input_schema),
                    read_only=read_only,
                    idempotent=idempotent and not read_only,
                )
            )
        cursor = result.next_cursor
        if not cursor:
            return tools


async def _call(session: Any, tool: str, arguments: dict[str, Any], timeout: float) -> ToolResult:
    import anyio

    from mcp import MCPError

    try:
        with anyio.fail_after(timeout):
            result = await session.call_tool(tool, arguments)
    except TimeoutError:
        return _error(
            f'the MCP tool "{tool}" did not answer within {timeout:g}s (raise "timeout" for its '
            f"server in mcp.json if it needs longer)",
            "timeout",
        )
    except MCPError as exc:
        return _error(f'the MCP server refused the call to "{tool}": {exc.error.message}', "fatal")
    except Exception as exc:
        return _error(f'the call to the MCP tool "{tool}" failed: {_one_line(exc)}', "transient")
    return _result(result)


def _result(result: Any) -> ToolResult:
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        elif kind == "resource":
            text = getattr(block.resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource: {block.resource.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return ToolResult("\n".join(parts), is_error=bool(result.is_error))


def _error(message: str, kind: str) -> ToolResult:
    return ToolResult(message, is_error=True, error_kind=kind)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _describe(exc: BaseException, cfg: ServerConfig, connect_timeout: float) -> str:
    leaves = _leaves(exc)
    first = next((e for e in leaves if not isinstance(e, asyncio.CancelledError)), leaves[0])
    if isinstance(first, FileNotFoundError) and cfg.transport == "stdio":
        return f"cannot start {cfg.command!r}: no such program (check its command in {cfg.source})"
    if isinstance(first, TimeoutError):
        return f"did not answer initialize and tools/list within {connect_timeout:g}s"
    return _one_line(first)
