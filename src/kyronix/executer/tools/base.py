"""What a built-in (or registered) executer tool is: its parameters, its handler, its outcome.

A tool is a :class:`ToolSpec`: a name, typed :class:`Param` s, a handler, and what it declares
about repeating it (``read_only``, ``idempotent``: a :class:`kiso.kernel.execution.Rerunnable`).
The executer turns the KML argument strings into the declared types, resolves every path
parameter through the one path sandbox (and checks the permission for it) *before* the handler
runs, and hands the handler a :class:`Call` holding the converted, resolved arguments. A handler
returns a :class:`ToolOutput` or raises :class:`~kyronix.errors.ToolFailure` (never anything
else on purpose: an unexpected exception becomes a ``ToolError`` result naming it, but is a
bug). ``ToolFailure`` and ``SecurityError`` live in :mod:`kyronix.errors` and are re-exported
here.

Handlers may be plain functions (run in a worker thread, so a slow tool never blocks the event
loop) or coroutine functions (awaited on the executer's loop).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kiso.tools.paths import PathOutsideWorkspace, resolve_in_workspace
from kyronix.errors import SecurityError, ToolFailure

if TYPE_CHECKING:
    from kiso.tools.sandbox import Sandbox
    from kyronix.executer.permissions import PermissionManager
    from kyronix.executer.tools.browser import BrowserSession

__all__ = [
    "Call",
    "Handler",
    "Param",
    "ParamType",
    "Resources",
    "SecurityError",
    "ToolFailure",
    "ToolOutput",
    "ToolSpec",
]

ParamType = Literal["string", "integer", "boolean", "object", "path", "dir"]
"""``path``: a path resolved inside the base (it may not exist yet). ``dir``: a path that must be
an existing directory (a ``cwd``). ``object``: a JSON object (``headers``)."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A successful tool's result: ``output`` for the model, ``data`` for programs."""

    output: str
    data: dict[str, Any] | None = None
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Param:
    """One argument. ``relative_to`` names another path/dir parameter that a relative value is
    resolved against (``git_clone``'s ``directory`` is relative to its ``cwd``); the default is
    the base path. A ``dir`` parameter that is absent defaults to the base (or its anchor)."""

    name: str
    type: ParamType = "string"
    required: bool = True
    relative_to: str | None = None
    description: str = ""
    follow: bool = True
    """False: a path whose last component is a symlink names the link itself (``delete_file``,
    ``move_file``'s source act on the link, wherever it points)."""


class Resources:
    """What the tools of one executer share: one headless browser, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._browser: BrowserSession | None = None

    @property
    def browser(self) -> BrowserSession:
        with self._lock:
            if self._browser is None:
                from kyronix.executer.tools.browser import BrowserSession

                self._browser = BrowserSession()
            return self._browser

    def close(self) -> None:
        with self._lock:
            browser, self._browser = self._browser, None
        if browser is not None:
            browser.close()


@dataclass
class Call:
    """One tool call as its handler sees it."""

    tool: str
    execution_id: str
    args: dict[str, Any]
    """Converted arguments; paths are absolute resolved :class:`~pathlib.Path` s."""
    base: Path
    """The real (symlink-free) base path every path must stay inside."""
    permissions: PermissionManager
    raw: dict[str, str] = field(default_factory=dict)
    """The arguments exactly as the KML gave them."""
    resources: Resources = field(default_factory=Resources)
    """Shared per-executer resources (the browser)."""
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    """The environment child processes are made from (credentials are removed from it with
    :func:`kiso.tools.env.child_env` when a process is started)."""
    pass_env: tuple[str, ...] = ()
    """Names the caller explicitly passes through to child processes, credentials or not."""
    inherit_fds: tuple[int, ...] = field(default=(), repr=False)
    """Descriptors every process the tool starts must inherit (``pass_fds``): the execution's
    liveness guard, which keeps it *running* (not uncertain) while those processes live."""
    sandbox: Sandbox | None = None
    """The OS sandbox a command runs in (``terminal``), None when it is off."""

    def resolve(self, raw: str, *, relative_to: Path | None = None) -> Path:
        """Resolve a path that is not a declared parameter through the same sandbox, or raise
        :class:`SecurityError`. The handler must still check permissions for what it does."""
        return sandbox_resolve(self.base, raw, relative_to=relative_to)

    def rel(self, path: Path) -> str:
        """``path`` relative to the base, POSIX form (``.`` for the base itself)."""
        full, root = str(path), str(self.base)
        if full == root:
            return "."
        return full[len(root) + 1 :] if root != "/" else full[1:]


Handler = Callable[[Call], "ToolOutput | Awaitable[ToolOutput]"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool: its name, parameters and handler, and what it declares about its effects.

    ``read_only`` and ``idempotent`` make it a :class:`kiso.kernel.execution.Rerunnable`, the
    same declaration kiso's tools make. The executer reads them, never a list of names: a tool
    that :func:`~kiso.kernel.execution.is_rerunnable` gets no fsynced ``started`` receipt
    before it runs and is simply run again when a crash interrupted it; any other tool is
    *uncertain* after such a crash until a person rules on it. A ``read_only`` built-in also
    runs on the executer's event loop instead of a worker thread (it is quick and touches
    nothing), and the read-only file tools are the ones ``SAFE_POLICIES`` let read protected
    files.
    """

    name: str
    params: tuple[Param, ...]
    handler: Handler
    description: str = ""
    builtin: bool = True
    writes: bool = False
    """Whether the tool changes files (for docs; the permission check is by action name,
    ``tool:<name>``)."""
    read_only: bool = field(kw_only=True)
    """It changes nothing, anywhere: running it twice is harmless. Every tool says (no default),
    so a new built-in cannot be rerunnable by omission."""
    idempotent: bool = field(kw_only=True)
    """It has effects, but running it twice has the effect of running it once."""

    def param(self, name: str) -> Param | None:
        for p in self.params:
            if p.name == name:
                return p
        return None


def sandbox_resolve_entry(base: Path, raw: str, *, relative_to: Path | None = None) -> Path:
    """:func:`sandbox_resolve`, except that a last component that is a symlink is not followed:
    the result is the link itself, in its real (checked) parent directory."""
    joined = raw
    if isinstance(raw, str) and relative_to is not None and raw and not os.path.isabs(raw):
        joined = os.path.join(relative_to, raw)
    head, tail = os.path.split(joined.rstrip("/")) if isinstance(joined, str) else ("", "")
    if tail in ("", ".", "..") or joined.endswith("/"):
        return sandbox_resolve(base, raw, relative_to=relative_to)
    parent = sandbox_resolve(base, head) if head else base
    link = parent / tail
    if os.path.islink(link):
        return link
    return sandbox_resolve(base, raw, relative_to=relative_to)


def sandbox_resolve(base: Path, raw: str, *, relative_to: Path | None = None) -> Path:
    """The one path sandbox (:func:`kiso.tools.paths.resolve_in_workspace`), raising
    :class:`SecurityError`. A relative ``raw`` is taken from ``relative_to`` (default: base)."""
    if isinstance(raw, str) and relative_to is not None and raw and not os.path.isabs(raw):
        raw = os.path.join(relative_to, raw)
    try:
        return resolve_in_workspace(base, raw, root_is_real=True)
    except PathOutsideWorkspace as exc:
        raise SecurityError(str(exc)) from None
    except OSError as exc:  # ENAMETOOLONG from realpath, ELOOP on symlink cycles
        raise SecurityError(f"path {raw[:200]!r} was refused: {exc.strerror or exc}") from None
