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

A ``SecurityError`` or an uncertain execution stops the envelope: the later tools are reported as
skipped and do not run (``continue_on_denial=True`` runs them anyway). Any other failure is that
tool's result and the envelope goes on.

Every entry has one shape: ``{tool, args, result: {success, output, executionId, ms, error?,
errorType?, data?, truncated?, uncertain?, skipped?}}``, with ``args`` as resolved (absolute
paths, the defaulted ``cwd``, typed numbers and flags).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from kiso.kernel.execution import ExecutionId, ReceiptState, Rerunnable, Ruling, is_rerunnable
from kyronix.errors import (
    KyronixTypeError,
    KyronixUsageError,
    ReceiptConflict,
    RunningLoopError,
    UnsupportedError,
)
from kyronix.executer.permissions import (
    SAFE_POLICIES,
    PermissionManager,
    Policy,
)
from kyronix.executer.receipts import Receipt, ReceiptStore, request_hash
from kyronix.executer.tools import builtin_tools
from kyronix.executer.tools.base import (
    Call,
    Param,
    Resources,
    SecurityError,
    ToolFailure,
    ToolOutput,
    ToolSpec,
    sandbox_resolve,
)
from kyronix.kml import Plan, ToolCall, parse

__all__ = ["CustomHandler", "KyronixExecuter", "RulingName"]

CustomHandler = Callable[[dict[str, Any]], Any]
"""A registered tool: ``handler(args) -> result`` (sync or async)."""

RulingName = Literal["rerun", "skipped", "applied"]
"""The values of :class:`kiso.kernel.execution.Ruling`, spelled out so ``resolve(id, "rerun")``
type-checks (``resolve`` takes a ``Ruling`` too; a test keeps the two the same)."""

_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})
_INT = re.compile(r"[+-]?\d{1,18}")


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
    ``$KYRONIX_HOME/receipts.sqlite3``). ``ws_url`` is for the WebSocket tunnel, which comes with
    the Kyronix server; passing it today is an error rather than a silent no-op.
    """

    def __init__(
        self,
        ws_url: str | None = None,
        permissions: PermissionManager | Iterable[Policy] | None = None,
        *,
        receipts: ReceiptStore | str | os.PathLike[str] | None = None,
        continue_on_denial: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if ws_url is not None:
            raise UnsupportedError(
                "the WebSocket tunnel (ws_url) arrives with the Kyronix server; run KML locally "
                "with execute() / execute_sync() or `kyronix exec plan.kml --base DIR` until then"
            )
        self.ws_url = ws_url
        if permissions is None:
            self.permissions = PermissionManager(SAFE_POLICIES)
        elif isinstance(permissions, PermissionManager):
            self.permissions = permissions
        else:
            self.permissions = PermissionManager(permissions)
        self.receipts = receipts if isinstance(receipts, ReceiptStore) else ReceiptStore(receipts)
        self.continue_on_denial = continue_on_denial
        self._env = env
        self._builtins = builtin_tools()
        self._custom: dict[str, _Custom] = {}
        self._resources = Resources()
        self._inflight: dict[tuple[str, ExecutionId], threading.Event] = {}
        self._inflight_lock = threading.Lock()

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
    ) -> list[dict[str, Any]]:
        """Run every tool of ``kml`` inside ``base_path`` (default: the current directory).

        Raises :class:`~kyronix.errors.KmlError` (with the offset) when the KML is malformed or
        truncated: then nothing runs. Raises :class:`~kyronix.errors.KyronixUsageError` when
        ``base_path`` is not a directory and :class:`~kyronix.errors.ReceiptStoreError` when the
        receipt store cannot be used. A tool's own failure is never raised: it is its result.
        """
        plan = kml if isinstance(kml, Plan) else parse(kml)
        base = _base(base_path)
        go_on = self.continue_on_denial if continue_on_denial is None else continue_on_denial
        results: list[dict[str, Any]] = []
        stopped_by: str | None = None
        batch = _Batch(
            self.receipts,
            str(base),
            self.receipts.get_many(str(base), [ExecutionId(c.execution_id) for c in plan.tools]),
        )
        try:
            for call in plan.tools:
                if stopped_by is not None:
                    results.append(_skipped(call, stopped_by))
                    continue
                entry = await self._run(call, base, batch)
                results.append(entry)
                outcome = entry["result"]
                if not go_on and not outcome["success"]:
                    if outcome.get("errorType") == "SecurityError":
                        stopped_by = f"{call.name} ({call.execution_id}) was denied"
                    elif outcome.get("uncertain"):
                        stopped_by = f"{call.name} ({call.execution_id}) is uncertain"
        finally:
            batch.flush()
        return results

    def execute_sync(
        self,
        kml: str | Plan,
        base_path: str | os.PathLike[str] | None = None,
        *,
        continue_on_denial: bool | None = None,
    ) -> list[dict[str, Any]]:
        """:meth:`execute` for code without an event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RunningLoopError(
                "execute_sync() was called inside a running event loop; await execute() there"
            )
        return asyncio.run(self.execute(kml, base_path, continue_on_denial=continue_on_denial))

    def uncertain_executions(
        self, base_path: str | os.PathLike[str] | None = None
    ) -> list[Receipt]:
        """Executions under ``base_path`` that started and never finished."""
        return self.receipts.uncertain(str(_base(base_path)))

    def resolve(
        self,
        execution_id: str,
        how: Ruling | RulingName,
        base_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """Settle an uncertain execution after checking what really happened: ``rerun`` lets the
        next request run it; ``skipped``/``applied`` record that outcome as its result.

        ``how`` is a :class:`kiso.kernel.execution.Ruling` or its value (``skip`` is only the
        command line's alias). Raises :class:`~kyronix.errors.UnknownExecutionError` (also a
        ``KeyError``) for an id with no receipt, :class:`~kyronix.errors.NotUncertainError` for
        one that is not uncertain, :class:`~kyronix.errors.KyronixUsageError` for another
        ``how``."""
        ruling = _ruling(how)
        scope = str(_base(base_path))
        eid = ExecutionId(execution_id)
        receipt = self.receipts.get(scope, eid)
        entry = None
        if receipt is not None and ruling is not Ruling.RERUN:
            applied = ruling is Ruling.APPLIED
            result: dict[str, Any] = {
                "success": applied,
                "output": (
                    "a person checked and confirmed that it had happened"
                    if applied
                    else "a person decided it will not run"
                ),
                "executionId": execution_id,
                "ms": 0,
                "resolved": ruling.value,
            }
            if not applied:
                result["error"] = "skipped by a person after the executer was interrupted"
                result["errorType"] = "Skipped"
            entry = {"tool": receipt.tool, "args": {}, "result": result}
        self.receipts.resolve(scope, eid, ruling, entry)

    def close(self) -> None:
        """Stop the browser (if one was started) and close the receipt store."""
        self._resources.close()
        self.receipts.close()

    def __enter__(self) -> KyronixExecuter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> KyronixExecuter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)

    # -- one call ------------------------------------------------------------------------------

    async def _run(self, call: ToolCall, base: Path, batch: _Batch) -> dict[str, Any]:
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
                return await self._run(call, base, batch)
            return await self._replay(call, known, digest)
        try:
            return await self._run_claimed(call, base, eid, digest, batch)
        finally:
            with self._inflight_lock:
                self._inflight.pop(key, None)
            event.set()

    async def _run_claimed(
        self, call: ToolCall, base: Path, eid: ExecutionId, digest: str, batch: _Batch
    ) -> dict[str, Any]:
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
            return await self._replay(call, known, digest)

        if spec is None and custom is None:
            return _failure(
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
            args, shown, targets = self._arguments(call, params, base)
            self._authorize(call.name, base, targets)
        except ToolFailure as failure:
            return _failure(call, dict(call.args), failure, started)

        if not is_rerunnable(tool):
            batch.flush()
            raced = await asyncio.to_thread(self.receipts.start, scope, eid, call.name, digest)
            if raced is not None:  # another process got there first
                return await self._replay(call, raced, digest)
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
            )
            outcome = await _invoke(spec, ctx, inline=spec.read_only)
        else:
            assert custom is not None
            outcome = await _invoke_custom(custom.handler, args)
        entry = _entry(call, shown, outcome, started)
        if tool.read_only:
            batch.add(eid, call.name, digest, entry)
        else:
            batch.flush()
            await asyncio.to_thread(self.receipts.finish, scope, eid, call.name, digest, entry)
        return entry

    async def _replay(self, call: ToolCall, known: Receipt, digest: str) -> dict[str, Any]:
        if not _same_call(call, known, digest):
            return _failure(
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
            return known.entry
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(known.started_at))
        rulings = " | ".join(repr(r.value) for r in Ruling)
        message = (
            f"{call.name} ({call.execution_id}) started at {when} (pid {known.pid} on "
            f"{known.host}) and never finished, so it may or may not have taken effect. It will "
            f"not be run again automatically: check, then resolve it with "
            f"executer.resolve({call.execution_id!r}, {rulings}, base_path) or "
            f"kyronix exec --resolve {call.execution_id}=<ruling>"
        )
        result: dict[str, Any] = {
            "success": False,
            "output": "",
            "executionId": call.execution_id,
            "ms": 0,
            "error": message,
            "errorType": "Uncertain",
            "uncertain": True,
        }
        return {"tool": call.name, "args": dict(call.args), "result": result}

    def _arguments(
        self, call: ToolCall, params: tuple[Param, ...] | None, base: Path
    ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """(typed args for the handler, args as shown in the result, base-relative targets)."""
        raw = call.args
        if params is None:  # a custom tool without declared params gets the strings
            return dict(raw), dict(raw), []
        names = {p.name for p in params}
        unknown = [k for k in raw if k not in names]
        if unknown:
            accepted = ", ".join(f"<{p.name}>" for p in params) or "no arguments"
            raise ToolFailure(
                f"{call.name} does not take {', '.join(f'<{k}>' for k in unknown)}; "
                f"it takes {accepted}",
                error_type="InvalidArguments",
            )
        args: dict[str, Any] = {}
        shown: dict[str, Any] = {}
        targets: list[str] = []
        # Anchors (cwd) first, so a path relative to one can be resolved against it.
        ordered = sorted(params, key=lambda p: p.relative_to is not None)
        for p in ordered:
            if p.name not in raw:
                if p.type == "dir":
                    anchor = args.get(p.relative_to) if p.relative_to else None
                    value: Any = anchor if isinstance(anchor, Path) else base
                    args[p.name] = value
                    shown[p.name] = str(value)
                    targets.append(_rel(value, base))
                    continue
                if p.required:
                    raise ToolFailure(
                        f"{call.name} needs <{p.name}>; it takes "
                        + ", ".join(f"<{q.name}>" + ("" if q.required else "?") for q in params),
                        error_type="InvalidArguments",
                    )
                continue
            value = _convert(call.name, p, raw[p.name], base, args)
            args[p.name] = value
            shown[p.name] = str(value) if isinstance(value, Path) else value
            if isinstance(value, Path):
                targets.append(_rel(value, base))
        order = [p.name for p in params]
        shown = {k: shown[k] for k in order if k in shown}
        return args, shown, targets

    def _authorize(self, tool: str, base: Path, targets: list[str]) -> None:
        action = f"tool:{tool}"
        checks: list[str | None] = [*targets] if targets else [None]
        for target in checks:
            decision = self.permissions.decide(action, target)
            if not decision.allowed:
                raise SecurityError(decision.reason)


# -- helpers ---------------------------------------------------------------------------------


class _Batch:
    """One envelope's view of the receipts: the rows known when it began (one query), and the
    receipts of read-only calls, written together (without fsync) at the end of the envelope or
    before the next receipt that is fsynced (which makes them durable too)."""

    def __init__(self, store: ReceiptStore, scope: str, known: dict[ExecutionId, Receipt]) -> None:
        self.store = store
        self.scope = scope
        self.known = known
        self._pending: list[tuple[ExecutionId, str, str, dict[str, Any]]] = []

    def add(self, execution_id: ExecutionId, tool: str, digest: str, entry: dict[str, Any]) -> None:
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


def _rel(path: Path, base: Path) -> str:
    """``path`` (resolved, inside ``base``) relative to ``base``; ``.`` for the base itself."""
    full, root = str(path), str(base)
    if full == root:
        return "."
    return full[len(root) + 1 :] if root != "/" else full[1:]


def _convert(tool: str, p: Param, text: str, base: Path, args: Mapping[str, Any]) -> Any:
    if p.type == "string":
        return text
    if p.type == "integer":
        value = text.strip()
        if not _INT.fullmatch(value):
            raise ToolFailure(
                f"<{p.name}> of {tool} must be a whole number, got {text[:60]!r}",
                error_type="InvalidArguments",
            )
        return int(value)
    if p.type == "boolean":
        flag = text.strip().lower()
        if flag in _TRUE:
            return True
        if flag in _FALSE:
            return False
        raise ToolFailure(
            f"<{p.name}> of {tool} must be true or false, got {text[:60]!r}",
            error_type="InvalidArguments",
        )
    if p.type == "object":
        try:
            value = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolFailure(
                f"<{p.name}> of {tool} must be a JSON object such as "
                f'{{"Accept": "application/json"}}: {exc.msg} at character {exc.pos}',
                error_type="InvalidArguments",
            ) from None
        if not isinstance(value, dict):
            raise ToolFailure(
                f"<{p.name}> of {tool} must be a JSON object, got {type(value).__name__}",
                error_type="InvalidArguments",
            )
        return value
    # Paths are scalars even inside CDATA: surrounding whitespace is never part of the name.
    anchor = args.get(p.relative_to) if p.relative_to else None
    where = anchor if isinstance(anchor, Path) else None
    path = sandbox_resolve(base, text.strip(), relative_to=where)
    if p.type == "dir" and not path.is_dir():
        raise ToolFailure(
            f"<{p.name}> of {tool} must be an existing directory; {_rel(path, base)} "
            + ("is a file" if path.exists() else "does not exist"),
            error_type="InvalidArguments",
        )
    return path


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
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "success": isinstance(outcome, ToolOutput),
        "output": outcome.output,
        "executionId": call.execution_id,
    }
    if isinstance(outcome, ToolFailure):
        security = outcome.error_type == "SecurityError"
        result["error"] = f"SecurityError: {outcome.message}" if security else outcome.message
        result["errorType"] = outcome.error_type
    if outcome.data is not None:
        result["data"] = outcome.data
    if outcome.truncated:
        result["truncated"] = True
    result["ms"] = int((time.monotonic() - started) * 1000)
    return {"tool": call.name, "args": shown, "result": result}


def _failure(
    call: ToolCall, args: dict[str, Any], failure: ToolFailure, started: float
) -> dict[str, Any]:
    return _entry(call, args, failure, started)


def _skipped(call: ToolCall, why: str) -> dict[str, Any]:
    result = {
        "success": False,
        "output": "",
        "executionId": call.execution_id,
        "ms": 0,
        "error": f"not run: {why}, which stops the rest of the envelope",
        "errorType": "Skipped",
        "skipped": True,
    }
    return {"tool": call.name, "args": dict(call.args), "result": result}
