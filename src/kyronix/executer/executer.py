"""``KyronixExecuter``: KML in, real tool executions out, each one exactly once.

The pipeline for every ``<tool>`` of an envelope, in document order:

1. **receipt** - an ``executionId`` already finished returns its stored entry and runs nothing;
   one that started and never finished is *uncertain* and is not run;
2. **dispatch** - the tool is looked up (built-in or registered);
3. **arguments** - the KML strings become the tool's types; every path goes through the one path
   sandbox (:func:`kiso.tools.paths.resolve_in_workspace`);
4. **permission** - ``tool:<name>`` is checked for every path (both ends of a move or copy), or
   once for a tool without paths; a refusal is a ``SecurityError`` result;
5. **run** - the handler runs and the result entry is recorded as its ``finished`` receipt.
   What the tool declares (``read_only``, ``idempotent``: :class:`kiso.kernel.execution.Rerunnable`)
   decides the receipts around it, never a list of names: a tool that is not
   :func:`~kiso.kernel.execution.is_rerunnable` gets a ``started`` receipt committed (fsynced)
   before it runs, so a crash leaves it *uncertain*; a rerunnable one gets none, and a crash just
   means it runs again. A read-only tool's ``finished`` receipt is batched without fsync.

   While a tool with effects runs, the executer holds its liveness guard
   (:mod:`kyronix.executer.running`) and the edit lock of every file it names
   (:mod:`kyronix.executer.locks`), so the same execution is never run twice at once and two
   edits of one file never interleave.

A ``SecurityError``, an uncertain or a running execution stops the envelope: the later tools are
reported as skipped and do not run (``continue_on_denial=True`` runs them anyway). Any other
failure is that tool's result and the envelope goes on.

Every entry has one shape, built as a :class:`~kyronix.executer.results.ResultEntry`:
``{tool, args, result: {success, output, executionId, ms, error?, errorType?, data?,
truncated?, uncertain?, running?, pid?, skipped?, resolved?, stored?}}``, with ``args`` as
resolved (absolute paths, the defaulted ``cwd``, typed numbers and flags).

``execute(on_progress=...)`` reports each tool that runs as it runs (:class:`Progress`:
``tool_started``, ``output`` chunks of the ``terminal`` tool, ``tool_finished``), always on the
event loop ``execute`` runs on. ``KyronixExecuter(ws_url=...)`` serves the same pipeline over the
WebSocket tunnel (:mod:`kyronix.executer.daemon`): :meth:`KyronixExecuter.start` on a background
thread, or ``await connect()`` / ``serve_forever()`` / ``aclose()`` (``async with``) on yours.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from kiso.kernel.execution import ExecutionId, ReceiptState, Rerunnable, Ruling, is_rerunnable
from kiso.tools.sandbox import MODES as SANDBOX_MODES
from kiso.tools.sandbox import Sandbox, SandboxPolicy
from kyronix.errors import (
    ExecutionRunningError,
    KyronixRunError,
    KyronixTypeError,
    KyronixUsageError,
    ReceiptConflict,
    ReceiptStoreError,
    RunningLoopError,
)
from kyronix.executer.arguments import prepare
from kyronix.executer.locks import DEFAULT_TIMEOUT_S, FileLocks, HeldLocks
from kyronix.executer.permissions import (
    SAFE_POLICIES,
    PermissionManager,
    Policy,
)
from kyronix.executer.receipts import Receipt, ReceiptStore, default_receipts_path, request_hash
from kyronix.executer.results import EntryDict, ResultEntry, ToolResult
from kyronix.executer.running import AlreadyRunning, Guards, LivenessGuard
from kyronix.executer.tools import builtin_tools
from kyronix.executer.tools.base import (
    Call,
    Param,
    Resources,
    SecurityError,
    ToolFailure,
    ToolOutput,
    ToolSpec,
)
from kyronix.executer.tools.terminal import OUTPUT_SINK
from kyronix.kml import Plan, ToolCall, parse

if TYPE_CHECKING:
    from kyronix.executer.daemon import Tunnel, TunnelEvent

__all__ = [
    "PROGRESS_OUTPUT_LIMIT",
    "CustomHandler",
    "KyronixExecuter",
    "Progress",
    "ProgressCallback",
    "RulingName",
]

log = logging.getLogger("kyronix.executer")

CustomHandler = Callable[[dict[str, Any]], Any]
"""A registered tool: ``handler(args) -> result`` (sync or async)."""

RulingName = Literal["rerun", "skipped", "applied"]
"""The values of :class:`kiso.kernel.execution.Ruling`, spelled out so ``resolve(id, "rerun")``
type-checks (``resolve`` takes a ``Ruling`` too; a test keeps the two the same)."""

_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_KEY_TEXT = re.compile(r"[\x21-\x7e]+")

PROGRESS_OUTPUT_LIMIT = 1_000_000
"""Characters of one tool's output streamed as ``output`` progress; beyond it one last chunk
says streaming stopped (the result still holds the output, capped as always)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """One step of a tool as it runs, for ``execute(on_progress=...)``.

    ``tool_started`` comes right before the tool runs (after its receipt, permission and locks),
    ``output`` with each ``chunk`` the ``terminal`` tool's command prints, ``tool_finished``
    with ``success`` once its result is recorded. A tool that does not run (a replayed receipt,
    a refusal, a bad argument, a skipped tool) sends none: its entry in the results says why.
    """

    event: Literal["tool_started", "tool_finished", "output"]
    tool: str
    execution_id: str
    """The tool's ``executionId`` (its receipt key)."""
    success: bool | None = None
    chunk: str | None = None


ProgressCallback = Callable[[Progress], object]
"""``on_progress(progress)``: called on ``execute``'s event loop; what it raises is logged."""


@dataclass(frozen=True, slots=True)
class _Custom:
    """A registered tool; like a :class:`ToolSpec`, a :class:`~kiso.kernel.execution.Rerunnable`."""

    handler: CustomHandler
    params: tuple[Param, ...] | None
    read_only: bool = False
    idempotent: bool = False


class KyronixExecuter:
    """Parse KML and run its tools under a permission policy, inside a base path, exactly once.

    ``permissions`` takes a :class:`PermissionManager` or a list of policies; the default is
    ``SAFE_POLICIES`` (files inside the base; no shell, git, browser or network until allowed).
    ``receipts`` is a :class:`ReceiptStore` or the path of its SQLite file (default
    ``$KYRONIX_HOME/receipts.sqlite3``). ``env`` is the environment child processes are made
    from (default: this process's), always with credentials removed
    (:func:`kiso.tools.env.child_env`) except the names in ``pass_env``, which the caller passes
    through explicitly. ``lock_timeout_s`` is how long a call waits for a file another call is
    changing before it fails (``errorType: "Busy"``). ``base_path`` is the default base of
    :meth:`execute` (else the current directory, at each call) and the base the tunnel runs
    every request in (else the current directory when the executer is made).

    ``ws_url`` (``ws://host:8080/ws``) is the server's tunnel. Constructing the executer never
    connects (it needs no event loop): :meth:`start` (or ``with executer:``) runs the tunnel on
    a background thread of its own, ``await connect()`` (or ``async with executer:``) on the
    running loop; see docs/executer.md, *The WebSocket tunnel*. It authenticates with
    ``api_key`` (default: ``$KYRONIX_API_KEY``) as executer ``executer_id`` (default
    ``default``). ``on_tunnel_event`` gets each :class:`~kyronix.executer.daemon.TunnelEvent`
    (connected, disconnected, a request answered...) on the tunnel's loop; ``heartbeat_s`` is
    the interval of its ``ping`` frames. ``sandbox`` is the OS sandbox ``terminal`` runs
    commands in (``workspace-write``, ``read-only`` or ``off``, or a
    :class:`~kiso.tools.sandbox.SandboxPolicy`; docs/sandbox.md): a plan from a server is the
    least trusted input there is, so it is on unless you turn it off.
    """

    def __init__(
        self,
        ws_url: str | None = None,
        permissions: PermissionManager | Iterable[Policy] | None = None,
        *,
        api_key: str | None = None,
        executer_id: str | None = None,
        base_path: str | os.PathLike[str] | None = None,
        receipts: ReceiptStore | str | os.PathLike[str] | None = None,
        continue_on_denial: bool = False,
        env: Mapping[str, str] | None = None,
        pass_env: Iterable[str] = (),
        lock_timeout_s: float = DEFAULT_TIMEOUT_S,
        on_tunnel_event: Callable[[TunnelEvent], object] | None = None,
        heartbeat_s: float = 15.0,
        sandbox: SandboxPolicy | str = "workspace-write",
    ) -> None:
        if not (isinstance(heartbeat_s, int | float) and heartbeat_s > 0):
            raise KyronixUsageError(
                f"heartbeat_s is a number of seconds above 0, got {heartbeat_s!r}"
            )
        self.ws_url = ws_url
        self.base_path: Path | None = _base(base_path) if base_path is not None else None
        self.executer_id = executer_id if executer_id is not None else "default"
        self._api_key: str | None = None
        self._on_tunnel_event = on_tunnel_event
        self._heartbeat_s = heartbeat_s
        self._tunnel: Tunnel | None = None
        self._tunnel_task: asyncio.Task[None] | None = None
        self._tunnel_thread: threading.Thread | None = None
        if ws_url is not None:
            from kyronix.executer.frames import executer_url

            executer_url(ws_url, self.executer_id)  # a bad URL or id is an error now, not later
            key = api_key if api_key is not None else os.environ.get("KYRONIX_API_KEY")
            if not key:
                raise KyronixUsageError(
                    "the WebSocket tunnel needs the project's API key: pass api_key=... or set "
                    "KYRONIX_API_KEY (create one with `kyronix keys create --project NAME`)"
                )
            if not isinstance(key, str) or not _KEY_TEXT.fullmatch(key):
                raise KyronixUsageError(
                    "the API key is one word of printable ASCII (kyr_...); check for spaces or "
                    "a line break pasted with it"
                )
            self._api_key = key
            if self.base_path is None:
                self.base_path = _base(None)
        elif api_key is not None or executer_id is not None:
            raise KyronixUsageError("api_key= and executer_id= are for the tunnel: pass ws_url=")
        if permissions is None:
            self.permissions = PermissionManager(SAFE_POLICIES)
        elif isinstance(permissions, PermissionManager):
            self.permissions = permissions
        else:
            self.permissions = PermissionManager(permissions)
        self.receipts = receipts if isinstance(receipts, ReceiptStore) else ReceiptStore(receipts)
        self.continue_on_denial = continue_on_denial
        self._env = env
        self._pass_env = (pass_env,) if isinstance(pass_env, str) else tuple(pass_env)
        if isinstance(sandbox, str):
            if sandbox not in SANDBOX_MODES:
                raise KyronixUsageError(
                    f"sandbox is one of {', '.join(SANDBOX_MODES)}, got {sandbox!r}"
                )
            sandbox = SandboxPolicy(sandbox, source="executer")
        if not isinstance(sandbox, SandboxPolicy):
            raise KyronixUsageError(
                f"sandbox is a mode ({', '.join(SANDBOX_MODES)}) or a SandboxPolicy, "
                f"got {type(sandbox).__name__}"
            )
        self.sandbox = sandbox
        """The OS sandbox ``terminal`` runs commands in (docs/sandbox.md): workspace-write by
        default, the base being the workspace."""
        self._sandboxes: dict[Path, Sandbox | None] = {}
        self._sandboxes_lock = threading.Lock()
        self._builtins = builtin_tools()
        self._custom: dict[str, _Custom] = {}
        self._resources = Resources()
        self._inflight: dict[tuple[str, ExecutionId], threading.Event] = {}
        self._inflight_lock = threading.Lock()
        store = self.receipts.path
        memory = str(store) == ":memory:"
        self.state_dir = default_receipts_path().parent if memory else store.parent
        """The executer's state directory: the receipt store's (``$KYRONIX_HOME`` by default).
        Edit locks live in its ``locks/``; liveness guards beside the store."""
        self._locks = FileLocks(self.state_dir / "locks", timeout_s=lock_timeout_s)
        self._guards = Guards.beside(store)

    def _sandbox_for(self, base: Path) -> Sandbox | None:
        """The sandbox for commands run in ``base`` (made once per base)."""
        with self._sandboxes_lock:
            if base not in self._sandboxes:
                self._sandboxes[base] = Sandbox.for_workspace(
                    self.sandbox, base, temp_parent=self.state_dir, reachable=self._pass_env
                )
            return self._sandboxes[base]

    # -- tools ---------------------------------------------------------------------------------

    @property
    def tools(self) -> list[str]:
        """The names this executer runs: the 20 built-ins, then the registered ones."""
        return [*self._builtins, *self._custom]

    def register(
        self,
        name: str,
        handler: CustomHandler,
        *,
        params: Sequence[Param | str] | None = None,
        replace: bool = False,
        read_only: bool = False,
        idempotent: bool = False,
    ) -> None:
        """Add a custom tool. ``handler(args)`` gets a dict of the KML arguments (strings, or the
        declared :class:`Param` types) and returns a dict (``success``, ``output``, ``error``,
        anything else as ``data``) or any value (its text becomes ``output``); it may be async.
        A built-in cannot be replaced; another custom tool only with ``replace=True``.

        ``read_only=True`` declares that it changes nothing; ``idempotent=True`` that running it
        twice has the effect of running it once. Either makes it rerunnable: no fsynced
        ``started`` receipt before it runs, and after a crash it simply runs again. Without them
        (the default) it is taken to have effects: a crash mid-call leaves it *uncertain* until a
        person resolves it. Raises :class:`~kyronix.errors.KyronixUsageError` for a bad or
        taken name and :class:`~kyronix.errors.KyronixTypeError` for a bad handler or flag."""
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise KyronixUsageError(
                f"a tool name is letters, digits, '_', '.' and '-', starting with a letter or "
                f"'_'; got {name!r}"
            )
        if name in self._builtins:
            raise KyronixUsageError(
                f"{name!r} is a built-in tool and cannot be replaced; register yours under "
                f"another name"
            )
        if name in self._custom and not replace:
            raise KyronixUsageError(
                f"a tool named {name!r} is already registered; pass replace=True"
            )
        if not callable(handler):
            raise KyronixTypeError(
                f"the handler for {name!r} must be callable (a function of the args dict), got "
                f"{type(handler).__name__}"
            )
        for flag, value in (("read_only", read_only), ("idempotent", idempotent)):
            if not isinstance(value, bool):
                raise KyronixTypeError(
                    f"{flag}= of {name!r} is True or False, got {type(value).__name__}"
                )
        declared = None
        if params is not None:
            declared = tuple(p if isinstance(p, Param) else Param(p) for p in params)
        self._custom[name] = _Custom(handler, declared, read_only, idempotent)
        self.permissions.register_tool(name)

    # -- running -------------------------------------------------------------------------------

    async def execute(
        self,
        kml: str | Plan,
        base_path: str | os.PathLike[str] | None = None,
        *,
        continue_on_denial: bool | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> list[EntryDict]:
        """Run every tool of ``kml`` inside ``base_path`` (default: the executer's
        ``base_path``, else the current directory).

        ``on_progress`` gets a :class:`Progress` as each tool starts, prints (``terminal``) and
        finishes, on this event loop. Raises :class:`~kyronix.errors.KmlError` (with the
        offset) when the KML is malformed or truncated: then nothing runs. Raises
        :class:`~kyronix.errors.KyronixUsageError` when ``base_path`` is not a directory and
        :class:`~kyronix.errors.ReceiptStoreError` when the receipt store cannot be used. A
        tool's own failure is never raised: it is its result.
        """
        plan = kml if isinstance(kml, Plan) else parse(kml)
        base = self._scope(base_path)
        report = _Reporter(on_progress) if on_progress is not None else None
        go_on = self.continue_on_denial if continue_on_denial is None else continue_on_denial
        results: list[EntryDict] = []
        stopped_by: str | None = None
        batch = _Batch(
            self.receipts,
            str(base),
            self.receipts.get_many(str(base), [ExecutionId(c.execution_id) for c in plan.tools]),
        )
        try:
            for call in plan.tools:
                if stopped_by is not None:
                    results.append(_skipped(call, stopped_by).to_dict())
                    continue
                entry = await self._run(call, base, batch, report)
                results.append(entry.to_dict())
                outcome = entry.result
                if not go_on and not outcome.success:
                    if outcome.error_type == "SecurityError":
                        stopped_by = f"{call.name} ({call.execution_id}) was denied"
                    elif outcome.uncertain:
                        stopped_by = f"{call.name} ({call.execution_id}) is uncertain"
                    elif outcome.running:
                        stopped_by = f"{call.name} ({call.execution_id}) is still running"
        finally:
            batch.flush()
        return results

    def execute_sync(
        self,
        kml: str | Plan,
        base_path: str | os.PathLike[str] | None = None,
        *,
        continue_on_denial: bool | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> list[EntryDict]:
        """:meth:`execute` for code without an event loop (``on_progress`` is called on this
        thread)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RunningLoopError(
                "execute_sync() was called inside a running event loop; await execute() there"
            )
        return asyncio.run(
            self.execute(
                kml, base_path, continue_on_denial=continue_on_denial, on_progress=on_progress
            )
        )

    def _scope(self, base_path: str | os.PathLike[str] | None) -> Path:
        return _base(base_path if base_path is not None else self.base_path)

    def uncertain_executions(
        self, base_path: str | os.PathLike[str] | None = None
    ) -> list[Receipt]:
        """Executions under ``base_path`` that started and never finished, and that no live
        process is still running: they wait for a person's ruling (:meth:`resolve`)."""
        scope = str(self._scope(base_path))
        return [r for r in self.receipts.uncertain(scope) if not self._running(r)]

    def running_executions(self, base_path: str | os.PathLike[str] | None = None) -> list[Receipt]:
        """Executions under ``base_path`` that started, have not finished, and that a live
        process (this executer, another one, or a command one started) still runs. Their
        ``pid`` is the executer that started them. They cannot be ruled on until they end."""
        scope = str(self._scope(base_path))
        return [r for r in self.receipts.uncertain(scope) if self._running(r)]

    def resolve(
        self,
        execution_id: str,
        how: Ruling | RulingName,
        base_path: str | os.PathLike[str] | None = None,
        *,
        wait: float = 0.0,
    ) -> None:
        """Settle an uncertain execution after checking what really happened: ``rerun`` lets the
        next request run it; ``skipped``/``applied`` record that outcome as its result.

        ``how`` is a :class:`kiso.kernel.execution.Ruling` or its value (``skip`` is only the
        command line's alias). Raises :class:`~kyronix.errors.UnknownExecutionError` (also a
        ``KeyError``) for an id with no receipt, :class:`~kyronix.errors.NotUncertainError` for
        one that is not uncertain, :class:`~kyronix.errors.ExecutionRunningError` for one that a
        live process still runs (after waiting up to ``wait`` seconds for it to end), and
        :class:`~kyronix.errors.KyronixUsageError` for another ``how``."""
        ruling = _ruling(how)
        scope = str(self._scope(base_path))
        eid = ExecutionId(execution_id)
        receipt = self.receipts.get(scope, eid)
        if receipt is not None and receipt.state is ReceiptState.STARTED:
            deadline = time.monotonic() + max(0.0, wait)
            while self._guards.running(scope, eid):
                if time.monotonic() >= deadline:
                    pid = self._guards.holder_pid(scope, eid) or receipt.pid
                    raise ExecutionRunningError(
                        f"execution {execution_id!r} ({receipt.tool}) is still running (pid "
                        f"{pid} on {receipt.host}): it cannot be ruled on until it ends, since "
                        f"nobody can tell yet whether it applied. Wait for it to finish (or stop "
                        f"that process), then resolve it if it is still uncertain",
                        details={"executionId": execution_id, "pid": pid},
                    )
                time.sleep(0.05)
        entry = None
        if receipt is not None and ruling is not Ruling.RERUN:
            applied = ruling is Ruling.APPLIED
            result = ToolResult(
                success=applied,
                output=(
                    "a person checked and confirmed that it had happened"
                    if applied
                    else "a person decided it will not run"
                ),
                execution_id=execution_id,
                error=None if applied else "skipped by a person after the executer was interrupted",
                error_type=None if applied else "Skipped",
                resolved="applied" if applied else "skipped",
            )
            entry = ResultEntry(receipt.tool, {}, result).to_dict()
        self.receipts.resolve(scope, eid, ruling, entry)

    def prune_receipts(
        self, older_than_s: float, base_path: str | os.PathLike[str] | None = None
    ) -> int:
        """Forget the settled receipts older than ``older_than_s`` seconds, under ``base_path``
        (default: every base of the store); return how many (see
        :meth:`ReceiptStore.prune`). A forgotten id, sent again, runs again."""
        scope = str(_base(base_path)) if base_path is not None else None
        return self.receipts.prune(older_than_s, scope)

    def _running(self, receipt: Receipt) -> bool:
        return self._guards.running(receipt.scope, receipt.execution_id)

    # -- the tunnel ----------------------------------------------------------------------------

    @property
    def tunnel(self) -> Tunnel | None:
        """The tunnel started last (``connected``, ``project_id``, ``running_requests``...), or
        None before :meth:`start` / :meth:`connect`."""
        return self._tunnel

    def start(self) -> None:
        """Serve the tunnel on a background thread with its own event loop, and return at once
        (it connects, and reconnects, by itself; :meth:`wait_connected` waits for the server's
        ``ready``). :meth:`close` stops it and joins the thread."""
        tunnel = self._new_tunnel()
        thread = threading.Thread(
            target=_serve_in_thread, args=(tunnel,), name="kyronix-tunnel", daemon=True
        )
        self._tunnel_thread = thread
        thread.start()

    def wait_connected(self, timeout: float | None = None) -> bool:
        """After :meth:`start`: wait until the tunnel is connected (True) or ``timeout`` seconds
        passed (False). Raises what ended the tunnel, such as
        :class:`~kyronix.executer.daemon.TunnelRefusedError` for a refused key."""
        if self._tunnel is None:
            raise KyronixUsageError("the tunnel is not started: call start() first")
        return self._tunnel.wait_connected_sync(timeout)

    async def connect(self, timeout: float | None = None) -> None:
        """Start the tunnel as a task of the running event loop and wait for the server's
        ``ready`` (retrying while the server cannot be reached, ``timeout`` seconds at most:
        then it stops and raises :class:`~kyronix.errors.KyronixRunError`). Raises
        :class:`~kyronix.executer.daemon.TunnelRefusedError` for a refused key. The tunnel
        keeps serving (and reconnecting) until :meth:`aclose`."""
        tunnel = self._new_tunnel()
        self._tunnel_task = asyncio.get_running_loop().create_task(
            tunnel.run(), name="kyronix-tunnel"
        )
        try:
            await tunnel.wait_until_connected(timeout)
        except TimeoutError:
            await self._stop_task()
            raise KyronixRunError(
                f"not connected to {tunnel.shown_url} within {timeout:g} s; is `kyronix serve` "
                f"running there? (the tunnel was stopped)"
            ) from None
        except BaseException:
            await self._stop_task()
            raise

    async def serve_forever(self) -> None:
        """Serve the tunnel until it is stopped (:meth:`aclose` from another task, or a
        signal handler calling ``executer.tunnel.stop()``); start it first if :meth:`connect`
        did not. Raises what ended it: a refused key, a replacement by another executer."""
        task = self._tunnel_task
        if task is not None and task.done():
            self._tunnel_task = None
            ended = task.exception()
            if ended is not None:
                raise ended
            task = None
        if task is None:
            tunnel = self._new_tunnel()
            task = asyncio.get_running_loop().create_task(tunnel.run(), name="kyronix-tunnel")
            self._tunnel_task = task
        await asyncio.shield(task)

    async def aclose(self) -> None:
        """Stop the tunnel (no new request; the running ones finish and are answered; the
        connection is closed), then :meth:`close`."""
        await self._stop_task()
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop the tunnel if it runs (waiting for the requests it is running to finish, and
        joining its thread), stop the browser (if one was started), close the receipt store.
        A tunnel running on this very event loop needs ``await aclose()`` instead."""
        task = self._tunnel_task
        if task is not None and not task.done():
            loop = task.get_loop()
            try:
                here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is loop:
                raise RunningLoopError(
                    "the tunnel runs on this event loop: await executer.aclose() to close it"
                )
            asyncio.run_coroutine_threadsafe(self._stop_task(), loop).result()
        thread, self._tunnel_thread = self._tunnel_thread, None
        if thread is not None:
            assert self._tunnel is not None
            self._tunnel.stop_threadsafe()
            thread.join()
        self._resources.close()
        self.receipts.close()

    def _new_tunnel(self) -> Tunnel:
        if self.ws_url is None:
            raise KyronixUsageError(
                "this executer has no tunnel: make it with "
                "KyronixExecuter(ws_url='ws://HOST:8080/ws')"
            )
        if self._tunnel is not None and not self._tunnel.ended:
            raise KyronixUsageError("the tunnel is already started; close it first")
        from kyronix.executer.daemon import Tunnel

        assert self._api_key is not None and self.base_path is not None
        self._tunnel = Tunnel(
            self,
            self.ws_url,
            api_key=self._api_key,
            executer_id=self.executer_id,
            base_path=self.base_path,
            heartbeat_s=self._heartbeat_s,
            silence_s=3 * self._heartbeat_s,
            on_event=self._on_tunnel_event,
        )
        return self._tunnel

    async def _stop_task(self) -> None:
        task, self._tunnel_task = self._tunnel_task, None
        if task is None:
            return
        if self._tunnel is not None:
            self._tunnel.stop()
        # What ended it (a refusal) was raised to whoever awaited connect/serve_forever.
        await asyncio.gather(task, return_exceptions=True)

    def __enter__(self) -> KyronixExecuter:
        if self.ws_url is not None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> KyronixExecuter:
        if self.ws_url is not None:
            await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- one call ------------------------------------------------------------------------------

    async def _run(
        self, call: ToolCall, base: Path, batch: _Batch, report: _Reporter | None = None
    ) -> ResultEntry:
        scope = str(base)
        eid = ExecutionId(call.execution_id)
        digest = request_hash(call.name, call.args)
        # One execution per id at a time in this process: a duplicate that arrives while the
        # first is running waits for it and gets its result.
        key = (scope, eid)
        event = threading.Event()
        with self._inflight_lock:
            running = self._inflight.get(key)
            if running is None:
                self._inflight[key] = event
        if running is not None:
            await asyncio.to_thread(running.wait)
            batch.known.pop(eid, None)
            known = self.receipts.get(scope, eid)
            if known is None:  # it failed before running (denied, bad arguments): evaluate anew
                return await self._run(call, base, batch, report)
            return self._replay(call, known, digest)
        try:
            return await self._run_claimed(call, base, eid, digest, batch, report=report)
        finally:
            with self._inflight_lock:
                self._inflight.pop(key, None)
            event.set()

    async def _run_claimed(
        self,
        call: ToolCall,
        base: Path,
        eid: ExecutionId,
        digest: str,
        batch: _Batch,
        *,
        report: _Reporter | None,
    ) -> ResultEntry:
        started = time.monotonic()
        scope = str(base)
        spec = self._builtins.get(call.name)
        custom = self._custom.get(call.name) if spec is None else None
        tool: Rerunnable | None = spec if spec is not None else custom
        known = batch.known.get(eid)
        if known is not None and not (
            # A started row of a tool that is rerunnable now (an older declaration left it)
            # is not uncertain: the tool is simply run again.
            known.state is ReceiptState.STARTED
            and tool is not None
            and is_rerunnable(tool)
            and _same_call(call, known, digest)
        ):
            return self._replay(call, known, digest)

        if spec is None and custom is None:
            return _entry(
                call,
                dict(call.args),
                ToolFailure(
                    f"there is no tool named {call.name!r}; the tools are: {', '.join(self.tools)}",
                    error_type="UnknownTool",
                ),
                started,
            )
        assert tool is not None
        params = spec.params if spec is not None else (custom.params if custom else None)
        try:
            args, shown, targets, files = prepare(call, params, base)
            self._authorize(call.name, targets)
        except ToolFailure as failure:
            return _entry(call, dict(call.args), failure, started)

        # A tool with effects holds the edit lock of every file it names for the whole call.
        locks: HeldLocks | None = None
        if files and not tool.read_only:
            try:
                locks = await self._locks.acquire_async(files)
            except ToolFailure as failure:
                return _entry(call, shown, failure, started)
        guard: LivenessGuard | None = None
        try:
            if not is_rerunnable(tool):
                batch.flush()
                try:
                    guard = await asyncio.to_thread(self._guards.hold, scope, eid)
                except AlreadyRunning as other:  # another process is running this very id
                    return self._running_entry(call, self.receipts.get(scope, eid), other.pid)
                raced = await asyncio.to_thread(self.receipts.start, scope, eid, call.name, digest)
                if raced is not None:  # another process got there first
                    if guard is not None:
                        guard.release()
                        guard = None
                    return self._replay(call, raced, digest)
            if report is not None:
                report.emit(Progress("tool_started", call.name, call.execution_id))
            if spec is not None:
                ctx = Call(
                    tool=call.name,
                    execution_id=call.execution_id,
                    args=args,
                    base=base,
                    permissions=self.permissions,
                    raw=dict(call.args),
                    resources=self._resources,
                    env=self._env if self._env is not None else os.environ,
                    pass_env=self._pass_env,
                    inherit_fds=(guard.fd,) if guard is not None else (),
                    sandbox=self._sandbox_for(base) if spec.name == "terminal" else None,
                )
                sink = OUTPUT_SINK.set(
                    report.output_sink(call.name, call.execution_id) if report else None
                )
                try:
                    outcome = await _invoke(spec, ctx, inline=spec.read_only)
                finally:
                    OUTPUT_SINK.reset(sink)
            else:
                assert custom is not None
                outcome = await _invoke_custom(custom.handler, args)
            entry = _entry(call, shown, outcome, started)
            if tool.read_only:
                batch.add(eid, call.name, digest, entry.to_dict())
            else:
                batch.flush()
                await asyncio.to_thread(
                    self.receipts.finish, scope, eid, call.name, digest, entry.to_dict()
                )
            if report is not None:
                report.emit(
                    Progress(
                        "tool_finished", call.name, call.execution_id, success=entry.result.success
                    )
                )
            return entry
        finally:
            # The receipt first, then the guard: whoever looks sees running, then finished.
            if guard is not None:
                guard.release()
            if locks is not None:
                locks.release()

    def _replay(self, call: ToolCall, known: Receipt, digest: str) -> ResultEntry:
        if not _same_call(call, known, digest):
            return _entry(
                call,
                dict(call.args),
                ReceiptConflict(
                    f"executionId {call.execution_id!r} was already used for a different call "
                    f"({known.tool}); an id names one execution. Send a new id for a new call"
                ),
                time.monotonic(),
            )
        if known.settled:
            assert known.entry is not None
            try:
                return ResultEntry.from_dict(known.entry)
            except KyronixUsageError as exc:
                raise ReceiptStoreError(
                    f"the receipt of {call.execution_id!r} in {self.receipts.path} is damaged "
                    f"({exc}); whether {call.name} ran cannot be told from it. Check, then "
                    f"move the store aside or pass receipts= another path"
                ) from None
        if self._guards.running(known.scope, known.execution_id):
            pid = self._guards.holder_pid(known.scope, known.execution_id) or known.pid
            return self._running_entry(call, known, pid)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(known.started_at))
        rulings = " | ".join(repr(r.value) for r in Ruling)
        message = (
            f"{call.name} ({call.execution_id}) started at {when} (pid {known.pid} on "
            f"{known.host}) and never finished, so it may or may not have taken effect. It will "
            f"not be run again automatically: check, then resolve it with "
            f"executer.resolve({call.execution_id!r}, {rulings}, base_path) or "
            f"kyronix exec --resolve {call.execution_id}=<ruling>"
        )
        result = ToolResult(
            success=False,
            output="",
            execution_id=call.execution_id,
            error=message,
            error_type="Uncertain",
            uncertain=True,
        )
        return ResultEntry(call.name, dict(call.args), result)

    def _running_entry(self, call: ToolCall, known: Receipt | None, pid: int | None) -> ResultEntry:
        pid = pid if pid is not None else (known.pid if known is not None else None)
        where = f"pid {pid}" if pid is not None else "another process"
        if known is not None:
            where += f" on {known.host}"
        message = (
            f"{call.name} ({call.execution_id}) is still running ({where}); it is not run a "
            f"second time. Send the request again once it has finished to get its result"
        )
        result = ToolResult(
            success=False,
            output="",
            execution_id=call.execution_id,
            error=message,
            error_type="Running",
            running=True,
            pid=pid,
        )
        return ResultEntry(call.name, dict(call.args), result)

    def _authorize(self, tool: str, targets: list[str]) -> None:
        action = f"tool:{tool}"
        checks: list[str | None] = [*targets] if targets else [None]
        for target in checks:
            decision = self.permissions.decide_relative(action, target)
            if not decision.allowed:
                raise SecurityError(decision.reason)


# -- helpers ---------------------------------------------------------------------------------


def _serve_in_thread(tunnel: Tunnel) -> None:
    """The background thread of :meth:`KyronixExecuter.start`: one event loop, one tunnel."""
    try:
        asyncio.run(tunnel.run())
    except Exception:  # kept in tunnel.error: wait_connected() raises it
        log.debug("the tunnel ended", exc_info=True)


class _Reporter:
    """``on_progress`` for one ``execute()``: every call made on its event loop (output read by
    the terminal's reader thread is handed over with ``call_soon_threadsafe``)."""

    def __init__(self, callback: ProgressCallback) -> None:
        self.callback = callback
        self.loop = asyncio.get_running_loop()

    def emit(self, progress: Progress) -> None:
        try:
            self.callback(progress)
        except Exception:
            log.exception("the on_progress callback failed on %s", progress)

    def output_sink(self, tool: str, execution_id: str) -> Callable[[str], None]:
        sent = 0

        def sink(chunk: str) -> None:
            nonlocal sent
            if sent >= PROGRESS_OUTPUT_LIMIT:
                return
            if sent + len(chunk) >= PROGRESS_OUTPUT_LIMIT:
                chunk = chunk[: PROGRESS_OUTPUT_LIMIT - sent] + (
                    f"\n[... output streaming stopped after {PROGRESS_OUTPUT_LIMIT} characters; "
                    f"the result holds the output ...]\n"
                )
            sent += len(chunk)
            progress = Progress("output", tool, execution_id, chunk=chunk)
            self.loop.call_soon_threadsafe(self.emit, progress)

        return sink


class _Batch:
    """One envelope's view of the receipts: the rows known when it began (one query), and the
    receipts of read-only calls, written together (without fsync) at the end of the envelope or
    before the next receipt that is fsynced (which makes them durable too)."""

    def __init__(self, store: ReceiptStore, scope: str, known: dict[ExecutionId, Receipt]) -> None:
        self.store = store
        self.scope = scope
        self.known = known
        self._pending: list[tuple[ExecutionId, str, str, Mapping[str, Any]]] = []

    def add(
        self, execution_id: ExecutionId, tool: str, digest: str, entry: Mapping[str, Any]
    ) -> None:
        self._pending.append((execution_id, tool, digest, entry))

    def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self.store.finish_many(self.scope, pending)


def _base(base_path: str | os.PathLike[str] | None) -> Path:
    raw = os.fspath(base_path) if base_path is not None else os.getcwd()
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise KyronixUsageError(f"base_path must be a directory path, got {base_path!r}")
    real = Path(os.path.realpath(raw))
    if not real.is_dir():
        raise KyronixUsageError(
            f"base_path {raw!r} is not an existing directory; create it or pass the project root"
        )
    return real


def _ruling(how: object) -> Ruling:
    """``how`` as a :class:`Ruling`: the enum or one of its values (the API has no aliases)."""
    if isinstance(how, Ruling):
        return how
    if isinstance(how, str):
        try:
            return Ruling(how)
        except ValueError:
            pass
    choices = ", ".join(repr(r.value) for r in Ruling)
    raise KyronixUsageError(f"resolve an uncertain execution with one of {choices}, not {how!r}")


def _same_call(call: ToolCall, known: Receipt, digest: str) -> bool:
    """Whether a receipt records this call (the same tool and raw arguments)."""
    return known.tool == call.name and known.request_hash == digest


async def _invoke(spec: ToolSpec, call: Call, *, inline: bool) -> ToolOutput | ToolFailure:
    try:
        if inspect.iscoroutinefunction(spec.handler):
            out = await spec.handler(call)
        elif inline:
            out = spec.handler(call)
        else:
            out = await asyncio.to_thread(spec.handler, call)
        if inspect.isawaitable(out):
            out = await out
    except ToolFailure as failure:
        return failure
    except Exception as exc:
        return ToolFailure(
            f"{spec.name} failed unexpectedly: {type(exc).__name__}: {exc}", error_type="ToolError"
        )
    if not isinstance(out, ToolOutput):
        return ToolFailure(f"{spec.name} returned {type(out).__name__}, not a ToolOutput")
    return out


async def _invoke_custom(handler: CustomHandler, args: dict[str, Any]) -> ToolOutput | ToolFailure:
    try:
        if inspect.iscoroutinefunction(handler):
            out = await handler(args)
        else:
            out = await asyncio.to_thread(handler, args)
            if inspect.isawaitable(out):
                out = await out
    except ToolFailure as failure:
        return failure
    except Exception as exc:
        return ToolFailure(f"{type(exc).__name__}: {exc}", error_type="ToolError")
    return _normalise_custom(out)


def _normalise_custom(out: Any) -> ToolOutput | ToolFailure:
    if isinstance(out, ToolOutput):
        return out
    if isinstance(out, Mapping):
        rest = {k: v for k, v in out.items() if k not in ("success", "output", "error")}
        output = out.get("output")
        text = output if isinstance(output, str) else _text(output if output is not None else rest)
        data = _jsonable(rest) if rest else None
        if out.get("success", True) is False or out.get("error"):
            return ToolFailure(
                str(out.get("error") or "the tool reported failure"), data=data, output=text
            )
        return ToolOutput(text, data)
    return ToolOutput(out if isinstance(out, str) else _text(out))


def _text(value: Any) -> str:
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _jsonable(value: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(value, default=str))
    return result


def _entry(
    call: ToolCall, shown: dict[str, Any], outcome: ToolOutput | ToolFailure, started: float
) -> ResultEntry:
    ms = int((time.monotonic() - started) * 1000)
    if isinstance(outcome, ToolOutput):
        result = ToolResult(
            success=True,
            output=outcome.output,
            execution_id=call.execution_id,
            ms=ms,
            data=outcome.data,
            truncated=outcome.truncated,
        )
    else:
        security = outcome.error_type == "SecurityError"
        result = ToolResult(
            success=False,
            output=outcome.output,
            execution_id=call.execution_id,
            ms=ms,
            error=f"SecurityError: {outcome.message}" if security else outcome.message,
            error_type=outcome.error_type,
            data=outcome.data,
            truncated=outcome.truncated,
        )
    return ResultEntry(call.name, shown, result)


def _skipped(call: ToolCall, why: str) -> ResultEntry:
    result = ToolResult(
        success=False,
        output="",
        execution_id=call.execution_id,
        error=f"not run: {why}, which stops the rest of the envelope",
        error_type="Skipped",
        skipped=True,
    )
    return ResultEntry(call.name, dict(call.args), result)
