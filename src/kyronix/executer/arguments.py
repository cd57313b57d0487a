"""Step 3 of the pipeline: a call's KML argument strings become the tool's typed arguments.

Line numbers become integers, ``create`` a boolean, ``headers`` a JSON object, and every
``path`` / ``dir`` argument goes through the one path sandbox
(:func:`~kyronix.executer.tools.base.sandbox_resolve`). What cannot be converted is a
:class:`~kyronix.errors.ToolFailure` with ``errorType: "InvalidArguments"`` for that call (an
empty path included: it names nothing, so there is nothing for the sandbox to refuse); what
the sandbox refuses is a :class:`~kyronix.errors.SecurityError`. Pure but for the sandbox's
look at the filesystem.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kyronix.executer.tools.base import (
    Param,
    ToolFailure,
    sandbox_resolve,
    sandbox_resolve_entry,
)
from kyronix.kml import ToolCall

__all__ = ["Arguments", "convert", "prepare", "relative"]

_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})
_INT = re.compile(r"[+-]?[0-9]{1,18}")  # ASCII digits only: "٣" is not 3


Arguments = tuple[dict[str, Any], dict[str, Any], list[str], list[Path]]
"""(typed args for the handler, args as shown in the result, base-relative targets to check
permissions on, the file paths (``path`` parameters) the call names, to lock while it runs)."""


def prepare(call: ToolCall, params: tuple[Param, ...] | None, base: Path) -> Arguments:
    """Convert and check ``call``'s arguments against ``params`` (None: a custom tool without
    declared parameters, which gets the strings)."""
    raw = call.args
    if params is None:
        return dict(raw), dict(raw), [], []
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
    files: list[Path] = []
    # Anchors (cwd) first, so a path relative to one can be resolved against it.
    ordered = sorted(params, key=lambda p: p.relative_to is not None)
    for p in ordered:
        if p.name not in raw:
            if p.type == "dir":
                anchor = args.get(p.relative_to) if p.relative_to else None
                value: Any = anchor if isinstance(anchor, Path) else base
                args[p.name] = value
                shown[p.name] = str(value)
                targets.append(relative(value, base))
                continue
            if p.required:
                raise ToolFailure(
                    f"{call.name} needs <{p.name}>; it takes "
                    + ", ".join(f"<{q.name}>" + ("" if q.required else "?") for q in params),
                    error_type="InvalidArguments",
                )
            continue
        value = convert(call.name, p, raw[p.name], base, args)
        args[p.name] = value
        shown[p.name] = str(value) if isinstance(value, Path) else value
        if isinstance(value, Path):
            targets.append(relative(value, base))
            if p.type == "path":
                files.append(value)
    order = [p.name for p in params]
    shown = {k: shown[k] for k in order if k in shown}
    return args, shown, targets, files


def relative(path: Path, base: Path) -> str:
    """``path`` (resolved, inside ``base``) relative to ``base``; ``.`` for the base itself."""
    full, root = str(path), str(base)
    if full == root:
        return "."
    return full[len(root) + 1 :] if root != "/" else full[1:]


def convert(tool: str, p: Param, text: str, base: Path, args: Mapping[str, Any]) -> Any:
    """One argument's text as ``p``'s type (``args``: those converted so far, for anchors)."""
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
    name = text.strip()
    if not name:
        what = "directory" if p.type == "dir" else "file or directory"
        hint = " (leave it out for the base)" if p.type == "dir" and not p.required else ""
        raise ToolFailure(
            f"<{p.name}> of {tool} is empty; give the {what} relative to the base{hint}",
            error_type="InvalidArguments",
        )
    anchor = args.get(p.relative_to) if p.relative_to else None
    where = anchor if isinstance(anchor, Path) else None
    resolve = sandbox_resolve if p.follow else sandbox_resolve_entry
    path = resolve(base, name, relative_to=where)
    if p.type == "dir" and not path.is_dir():
        raise ToolFailure(
            f"<{p.name}> of {tool} must be an existing directory; {relative(path, base)} "
            + ("is a file" if path.exists() else "does not exist"),
            error_type="InvalidArguments",
        )
    return path
