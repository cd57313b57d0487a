"""The tool contract: what a tool declares, what it receives, what it returns.

A tool is a name, a description, a JSON Schema for its input, an ``execute`` function and a
declaration of its effects. The runtime validates the model's input against the schema before
anything runs (a bad input is an error result the model sees, never an exception), records
``execution_started`` durably, calls ``execute``, and records the receipt.

``effects`` drives policy:

* ``read``  - no side effects. Allowed in every mode but ``plan`` too; may run in parallel with the
  turn's other reads; re-run automatically if a crash leaves it uncertain.
* ``edit``  - changes files in the workspace. Allowed by ``accept-edits``; asks in ``default``.
* ``shell`` - runs commands. Asks in ``default`` and ``accept-edits``; checked by the floor.
* ``other`` - any other side effect. Asks unless a mode or rule allows it.

``idempotent=True`` says repeating the call is harmless, so an uncertain execution is re-run
without asking (recorded as ``decided_by: "policy:idempotent"``).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from kiso.kernel.errors import UsageError
from kiso.kernel.execution import is_rerunnable

if TYPE_CHECKING:
    from kiso.tools.sandbox import Sandbox

__all__ = [
    "Effects",
    "Tool",
    "ToolContext",
    "ToolResult",
    "define_tool",
]


class Effects(StrEnum):
    READ = "read"
    EDIT = "edit"
    SHELL = "shell"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returns. ``content`` is what the model reads."""

    content: str
    is_error: bool = False
    error_kind: str | None = None
    """One of invalid_input, precondition, transient, fatal, timeout, aborted (errors only)."""
    truncated: bool | None = None


class AbortSignal:
    """Set once, when the run is asked to stop. Safe to read and set from any thread.

    A long-running tool polls :meth:`is_set` (or blocks in :meth:`wait`) and stops, saying so in
    its result; the runtime also cancels an async tool's task.
    """

    __slots__ = ("_event", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None
        """Who asked (``user``, ``timeout``...), once set."""

    def set(self, reason: str = "user") -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set (or ``timeout`` seconds); whether it is set."""
        return self._event.wait(timeout)


def _ignore(text: str) -> None:
    return None


@dataclass(slots=True)
class ToolContext:
    """What the runtime hands a tool for one execution."""

    workspace: Path
    """The workspace root; every path a tool touches is resolved inside it (kiso.tools.paths)."""
    execution_id: str
    """This attempt's id (``<session id>:<seq>``): the key of its receipt."""
    session_id: str = ""
    call_id: str = ""
    """The model's call this execution runs: the same for every attempt of it (a rerun after a
    crash is a new execution of the same call), so a key made from it survives reruns."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The environment for child processes, with credentials already stripped."""
    abort: AbortSignal = field(default_factory=AbortSignal)
    """Set once the run is being aborted; long-running tools should stop and say so."""
    progress: Callable[[str], None] = _ignore
    """Report output as the tool produces it (display only, never logged; callable from any
    thread). What the model reads is still the returned result."""
    sandbox: Sandbox | None = None
    """The OS sandbox commands run in (:mod:`kiso.tools.sandbox`), or None: none."""
    fds: tuple[int, ...] | Callable[[], tuple[int, ...]] = field(default=(), repr=False)
    """What :attr:`inherit_fds` gives: the descriptors, or a function making them on first use
    (the runtime passes its liveness guard, held before the execution's start is written)."""

    @property
    def inherit_fds(self) -> tuple[int, ...]:
        """File descriptors every process the tool starts must inherit (``pass_fds``): the
        runtime's liveness guard, which tells a later resume whether those processes may still
        be running. Read it just before starting a process (it is made on first use)."""
        fds = self.fds
        if callable(fds):
            fds = self.fds = fds()
        return fds

    @inherit_fds.setter
    def inherit_fds(self, value: tuple[int, ...]) -> None:
        self.fds = tuple(value)

    def cancelled(self) -> bool:
        """Whether the run is being aborted (``abort.is_set()``)."""
        return self.abort.is_set()


_AsyncExecute: TypeAlias = Callable[..., Awaitable[Any]]
Execute: TypeAlias = Callable[
    [dict[str, Any], ToolContext], "ToolResult | str | Awaitable[ToolResult | str]"
]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    """A JSON Schema (draft 2020-12) for the input object."""
    execute: Execute
    effects: Effects = Effects.OTHER
    idempotent: bool = False
    _with_context: bool = field(default=False, init=False, repr=False, compare=False)
    _is_async: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_with_context", _wants_context(self.execute))
        object.__setattr__(self, "_is_async", inspect.iscoroutinefunction(self.execute))

    @property
    def read_only(self) -> bool:
        """It changes nothing (``effects="read"``)."""
        return self.effects is Effects.READ

    @property
    def rerunnable(self) -> bool:
        """Safe to run again after a crash left an execution uncertain."""
        return is_rerunnable(self)

    @property
    def parallel_safe(self) -> bool:
        return self.effects is Effects.READ

    async def run(self, input: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Call ``execute`` (sync functions run in a worker thread) and normalise its result.

        ``execute`` takes ``(input, ctx)`` or just ``(input)``, and returns a ``str``, a
        :class:`ToolResult`, or a ``{"content": ..., "is_error": ...}`` mapping (``isError`` is
        accepted too).
        """
        import asyncio

        args: tuple[Any, ...] = (input, ctx) if self._with_context else (input,)
        out: Any
        if self._is_async:
            out = await cast(_AsyncExecute, self.execute)(*args)
        else:
            out = await asyncio.to_thread(self.execute, *args)
            if inspect.isawaitable(out):
                out = await out
        return _normalise(self.name, out)


def _wants_context(execute: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(execute).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


def _normalise(name: str, out: Any) -> ToolResult:
    if isinstance(out, ToolResult):
        return out
    if isinstance(out, str):
        return ToolResult(out)
    if isinstance(out, Mapping) and isinstance(out.get("content"), str):
        is_error = out.get("is_error", out.get("isError", False))
        return ToolResult(
            out["content"],
            is_error=bool(is_error),
            error_kind=out.get("error_kind"),
            truncated=out.get("truncated"),
        )
    raise UsageError(
        f"tool {name!r} returned {type(out).__name__}; return a str, a ToolResult or "
        f'{{"content": str, "is_error": bool}}'
    )


def define_tool(
    name: str,
    description: str,
    parameters: dict[str, Any],
    execute: Execute,
    *,
    effects: Effects | str = Effects.OTHER,
    idempotent: bool = False,
) -> Tool:
    """Declare a tool. ``parameters`` is the JSON Schema of its input object."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise UsageError(f"tool name {name!r}: use letters, digits, '_' or '-'")
    if parameters.get("type") != "object":
        raise UsageError(f"tool {name!r}: parameters must be a JSON Schema with type 'object'")
    return Tool(name, description, parameters, execute, Effects(effects), idempotent)
