"""Extensions: a plain Python file exposing one ``extension`` object, loaded in a cascade.

An extension file (no package, no build step) defines ``extension``: an :class:`Extension`, or a
factory ``def extension(ctx: ExtensionContext) -> Extension``::

    from kiso.runtime.extensions import Extension
    from kiso.runtime.hooks import CallContext, Hook, Verdict

    class NoFridays(Hook):
        def before_tool(self, ctx: CallContext) -> Verdict | None:
            return Verdict("deny", "", "no changes on Fridays") if is_friday() else None

    extension = Extension(name="no-fridays", hooks=[NoFridays()])

The cascade (:func:`load_cascade`) is built-in → user (``$KISO_EXTENSIONS_DIR``, else
``$KISO_HOME/extensions``, ``*.py`` in name order) → project (``<workspace>/.kiso/extensions/*.py``,
only when the trust gate applied the project, executed from the gate's snapshot bytes: the bytes
hashed are the bytes run). A user extension may shadow a built-in of the same name (a notice
says so); a project extension may shadow nothing. Loading is loud: a file that does not compile,
raises while it runs, has no ``extension`` or the wrong type, a duplicate name or a tool named
like a built-in tool raises :class:`ExtensionLoadError` naming the file, and nothing starts.

An extension's hooks are wrapped (:class:`ExtensionHook`): they speak as ``extension:<name>``
(``decided_by`` of their verdicts) and are ``constrain_only``, so an extension can ask about or
deny a call, never allow what the floor, the mode or a rule would ask about or deny
(:func:`kiso.runtime.approvals.compose`).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from kiso.kernel import Assistant, Compacted, Event, Outcome, ToolCall
from kiso.runtime.hooks import CallContext, Hook, RunInfo, Verdict, Veto
from kiso.tools.base import Tool

if TYPE_CHECKING:
    from kiso.providers.base import ModelRequest
    from kiso.tools.base import ToolResult

__all__ = [
    "EXTENSIONS_DIR_ENV",
    "Extension",
    "ExtensionContext",
    "ExtensionHook",
    "ExtensionLoadError",
    "ExtensionSet",
    "Layer",
    "Loaded",
    "Rent",
    "load_cascade",
    "load_file",
    "user_dir",
]

EXTENSIONS_DIR_ENV = "KISO_EXTENSIONS_DIR"
PROJECT_PREFIX = "extensions/"
"""Where a project's extensions are, relative to its ``.kiso/``."""
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")

Layer = Literal["built-in", "user", "project"]


class ExtensionLoadError(Exception):
    """An extension could not be loaded: the start fails with the file named (``kiso`` exits 2).

    Deliberately not a :class:`~kiso.kernel.KisoError`: it is a broken installation, not a run
    that failed, and no caller may treat it as one and carry on without the extension."""


@dataclass(frozen=True, slots=True)
class Extension:
    """What an extension adds. Every field but ``name`` is optional."""

    name: str
    """Lowercase letters, digits, ``-`` and ``_``; unique across the cascade (shadowing aside)."""
    hooks: Sequence[Hook] = ()
    """Hooks at any point (:mod:`kiso.runtime.hooks`); they run after the built-in ones."""
    tools: Sequence[Tool] = ()
    """More tools for the model (``kiso.tools.define_tool``); never named like a built-in."""
    system_prompt_append: str | None = None
    """Text added at the end of the system prompt (it is paid for on every request)."""
    description: str = ""


@dataclass(frozen=True, slots=True)
class ExtensionContext:
    """What a factory ``extension(ctx)`` is given."""

    layer: Layer
    path: Path | None
    """The file (None for a built-in)."""
    home: Path
    """``$KISO_HOME``."""
    workspace: Path


@dataclass(frozen=True, slots=True)
class Rent:
    """What an extension costs every model request: its prompt text and its tools' schemas."""

    prompt_chars: int
    schema_chars: int

    @property
    def chars(self) -> int:
        return self.prompt_chars + self.schema_chars

    @property
    def tokens(self) -> int:
        """An estimate: about four characters a token."""
        return (self.chars + 3) // 4


@dataclass(frozen=True, slots=True)
class Loaded:
    """One extension of the cascade, where it came from, and what it shadows."""

    extension: Extension
    layer: Layer
    source: str
    """The file it was loaded from, or ``built-in``."""
    shadows: str | None = None
    """The source of the built-in it replaced, if it did."""

    @property
    def name(self) -> str:
        return self.extension.name

    @property
    def rent(self) -> Rent:
        ext = self.extension
        schemas = sum(
            len(json.dumps({"name": t.name, "description": t.description, "input": t.parameters}))
            for t in ext.tools
        )
        return Rent(len(ext.system_prompt_append or ""), schemas)


@dataclass(frozen=True, slots=True)
class ExtensionSet:
    """The loaded cascade, in order: what it adds to an agent, and what the banner says."""

    loaded: tuple[Loaded, ...] = ()

    def hooks(self) -> list[Hook]:
        """Every extension's hooks, wrapped (``extension:<name>``, constrain-only), in order."""
        return [ExtensionHook(x.name, h) for x in self.loaded for h in x.extension.hooks]

    def tools(self) -> list[Tool]:
        return [t for x in self.loaded for t in x.extension.tools]

    def system_prompt(self, base: str | None) -> str | None:
        """``base`` with every extension's ``system_prompt_append`` after it, in order."""
        parts = [x.extension.system_prompt_append for x in self.loaded]
        extra = [p.strip() for p in parts if p and p.strip()]
        if not extra:
            return base
        return "\n\n".join([*([base.rstrip()] if base else []), *extra])

    def appends(self) -> dict[str, str]:
        """Each extension's ``system_prompt_append`` by name (the rent ledger shows each)."""
        return {
            f"{x.extension.name}": x.extension.system_prompt_append.strip()
            for x in self.loaded
            if x.extension.system_prompt_append and x.extension.system_prompt_append.strip()
        }

    def notices(self) -> list[str]:
        """``extensions: safe-defaults (user), audit (project)``, then each shadowing."""
        if not self.loaded:
            return []
        lines = ["extensions: " + ", ".join(f"{x.name} ({x.layer})" for x in self.loaded)]
        for x in self.loaded:
            if x.shadows is not None:
                lines.append(
                    f"the user extension {x.name} ({x.source}) shadows the built-in {x.name}"
                )
        return lines

    def status_lines(self) -> list[str]:
        """One line per extension for ``/status``: where it is from and its prompt rent."""
        out = []
        for x in self.loaded:
            r = x.rent
            tools = len(x.extension.tools)
            out.append(
                f"{x.name} ({x.layer}, {x.source}) · {len(x.extension.hooks)} hooks, {tools} "
                f"tools · rent {r.chars:,} chars ~{r.tokens:,} tokens "
                f"(prompt {r.prompt_chars:,}, schemas {r.schema_chars:,})"
            )
        return out


class ExtensionHook(Hook):
    """An extension's hook as the runtime sees it: named ``extension:<name>``, constrain-only."""

    constrain_only = True

    def __init__(self, extension: str, hook: Hook) -> None:
        self.wrapped = hook
        self.extension = extension
        self.name = f"extension:{extension}"
        self.allow_only = hook.allow_only

    def on_user_message(self, text: str, run: RunInfo) -> str | Veto | None:
        said = self.wrapped.on_user_message(text, run)
        return Veto(said.reason, self.name) if isinstance(said, Veto) else said

    def on_event(self, event: Event, run: RunInfo) -> None:
        self.wrapped.on_event(event, run)

    def before_model(self, request: ModelRequest, run: RunInfo) -> ModelRequest | None:
        return self.wrapped.before_model(request, run)

    def after_turn(self, turn: Assistant, run: RunInfo) -> None:
        self.wrapped.after_turn(turn, run)

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        verdict = self.wrapped.before_tool(ctx)
        if verdict is None:
            return None
        if not isinstance(verdict, Verdict):
            raise TypeError(f"before_tool returned {type(verdict).__name__}; return a Verdict")
        return replace(verdict, by=self.name, rule=None)

    def after_tool(self, call: ToolCall, result: ToolResult, run: RunInfo) -> ToolResult | None:
        return self.wrapped.after_tool(call, result, run)

    def on_compaction(self, event: Compacted, run: RunInfo) -> None:
        self.wrapped.on_compaction(event, run)

    def on_run_end(self, outcome: Outcome, run: RunInfo) -> None:
        self.wrapped.on_run_end(outcome, run)


# ----------------------------------------------------------------------------------- loading


def user_dir(home: Path, environ: Mapping[str, str] | None = None) -> Path:
    """``$KISO_EXTENSIONS_DIR`` when set, else ``$KISO_HOME/extensions``."""
    env = os.environ if environ is None else environ
    given = env.get(EXTENSIONS_DIR_ENV)
    return Path(given).expanduser() if given else home / "extensions"


_loads = itertools.count(1)


def load_file(source: bytes, path: Path, ctx: ExtensionContext) -> Extension:
    """Run one extension file's ``source`` (the bytes given, never the disk) and return its
    extension; anything wrong raises :class:`ExtensionLoadError` naming ``path``."""
    where = f"the {ctx.layer} extension {path}"
    try:
        code = compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        line = f" line {exc.lineno}" if exc.lineno else ""
        raise ExtensionLoadError(
            f"{where}:{line} does not compile ({exc.msg}); fix it or remove the file"
        ) from None
    except ValueError as exc:  # null bytes
        raise ExtensionLoadError(f"{where}: does not compile ({exc}); fix it") from None
    # a fresh module name per load, so /reload runs the new text (a small leak per reload)
    module = types.ModuleType(f"kiso_extension_{next(_loads)}_{_stem(path)}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # dataclasses and typing look modules up by name
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(module.__name__, None)
        raise ExtensionLoadError(
            f"{where}: raised {type(exc).__name__} while loading: {exc}; fix it or remove the file"
        ) from None
    found = module.__dict__.get("extension")
    if found is None:
        raise ExtensionLoadError(
            f"{where}: defines no `extension`; add `extension = Extension(name=...)` (from "
            f"kiso.runtime.extensions) or a factory `def extension(ctx) -> Extension`"
        )
    if not isinstance(found, Extension) and callable(found):
        factory: Callable[[ExtensionContext], object] = found
        try:
            found = factory(ctx)
        except Exception as exc:
            raise ExtensionLoadError(
                f"{where}: its factory `extension(ctx)` raised {type(exc).__name__}: {exc}"
            ) from None
    _check(found, where)
    assert isinstance(found, Extension)
    return found


def _check(ext: object, where: str) -> None:
    if not isinstance(ext, Extension):
        raise ExtensionLoadError(
            f"{where}: `extension` is a {type(ext).__name__}; it must be an Extension (from "
            f"kiso.runtime.extensions) or a function returning one"
        )
    if not isinstance(ext.name, str) or not NAME.match(ext.name):
        raise ExtensionLoadError(
            f"{where}: the name {ext.name!r} is not valid; use 1-64 lowercase letters, digits, "
            f"'-' or '_'"
        )
    for hook in ext.hooks:
        if not isinstance(hook, Hook):
            raise ExtensionLoadError(
                f"{where}: hooks holds a {type(hook).__name__}; each must be a "
                f"kiso.runtime.hooks.Hook (subclass it)"
            )
    for tool in ext.tools:
        if not isinstance(tool, Tool):
            raise ExtensionLoadError(
                f"{where}: tools holds a {type(tool).__name__}; make each with "
                f"kiso.tools.define_tool"
            )
    if ext.system_prompt_append is not None and not isinstance(ext.system_prompt_append, str):
        raise ExtensionLoadError(f"{where}: system_prompt_append must be a str or None")


def _stem(path: Path) -> str:
    return re.sub(r"\W", "_", path.stem) or "x"


def load_cascade(
    *,
    home: Path,
    workspace: Path,
    project_files: Mapping[str, bytes] | None,
    builtins: Sequence[Extension] = (),
    builtin_tools: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> ExtensionSet:
    """Built-in → user → project (``project_files``: the trust gate's snapshot, None when the
    project does not apply). Raises :class:`ExtensionLoadError` with the file named."""
    loaded: dict[str, Loaded] = {}
    for ext in builtins:
        loaded[ext.name] = Loaded(ext, "built-in", "built-in")
    udir = user_dir(home, environ)
    for path in _user_files(udir):
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise ExtensionLoadError(
                f"the user extension {path}: cannot read it ({exc.strerror}); fix its "
                f"permissions or remove it"
            ) from None
        ext = load_file(source, path, ExtensionContext("user", path, home, workspace))
        before = loaded.get(ext.name)
        if before is not None and before.layer == "user":
            raise ExtensionLoadError(
                f"the user extension {path}: the name {ext.name!r} is already taken by "
                f"{before.source}; rename one of them"
            )
        shadows = before.source if before is not None else None
        loaded.pop(ext.name, None)
        loaded[ext.name] = Loaded(ext, "user", str(path), shadows)
    root = workspace / ".kiso"
    for rel in sorted(project_files or {}):
        if not _is_extension_file(rel):
            continue
        path = root / rel
        assert project_files is not None
        ext = load_file(
            project_files[rel], path, ExtensionContext("project", path, home, workspace)
        )
        before = loaded.get(ext.name)
        if before is not None:
            raise ExtensionLoadError(
                f"the project extension {path}: the name {ext.name!r} is already taken by the "
                f"{before.layer} extension {before.source}; a project extension may not shadow "
                f"one: rename it"
            )
        loaded[ext.name] = Loaded(ext, "project", str(path))
    _check_tools(list(loaded.values()), set(builtin_tools))
    return ExtensionSet(tuple(loaded.values()))


def _user_files(directory: Path) -> list[Path]:
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise ExtensionLoadError(
            f"the user extensions directory {directory} is not a directory; remove it or point "
            f"{EXTENSIONS_DIR_ENV} at a directory"
        ) from None
    except OSError as exc:
        raise ExtensionLoadError(
            f"the user extensions directory {directory}: cannot list it ({exc.strerror})"
        ) from None
    return [p for p in entries if p.suffix == ".py" and not p.name.startswith((".", "_"))]


def _is_extension_file(rel: str) -> bool:
    if not rel.startswith(PROJECT_PREFIX) or not rel.endswith(".py"):
        return False
    name = rel[len(PROJECT_PREFIX) :]
    return "/" not in name and not name.startswith((".", "_"))


def _check_tools(loaded: Sequence[Loaded], builtin: set[str]) -> None:
    owner: dict[str, Loaded] = {}
    for x in loaded:
        for tool in x.extension.tools:
            if tool.name in builtin:
                raise ExtensionLoadError(
                    f"the {x.layer} extension {x.source}: its tool {tool.name!r} has the name of "
                    f"a built-in tool; rename it"
                )
            other = owner.get(tool.name)
            if other is not None:
                raise ExtensionLoadError(
                    f"the {x.layer} extension {x.source}: its tool {tool.name!r} is also a tool "
                    f"of {other.source}; rename one of them"
                )
            owner[tool.name] = x
