"""What one tool call produced: one typed model, and the document's dict shape it becomes.

The Kyronix document gives every result one shape, returned by ``execute()``, stored in the
receipts and sent in a ``kml_result`` frame::

    {"tool": "write_file",
     "args": {"path": "/full/path/test.txt", "content": "hello"},
     "result": {"success": true, "output": "...", "executionId": "exec_xyz789", "ms": 2,
                ...the optional keys of ResultDict, only when they apply}}

Inside the executer an entry is a :class:`ResultEntry` holding a :class:`ToolResult`: frozen
values, built in one place, so no code path can forget a key or spell one differently. They
become the dict at the edge (:meth:`ResultEntry.to_dict`); a stored or received dict comes back
through :meth:`ResultEntry.from_dict`, which checks the shape. :class:`EntryDict` and
:class:`ResultDict` type the dicts for callers; they are the wire format's
(:mod:`kyronix.wire`), re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kyronix.errors import KyronixUsageError
from kyronix.wire import EntryDict, ResultDict

__all__ = ["EntryDict", "ResultDict", "ResultEntry", "ToolResult"]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The ``result`` part of an entry."""

    success: bool
    output: str
    execution_id: str
    ms: int = 0
    error: str | None = None
    error_type: str | None = None
    data: dict[str, Any] | None = None
    truncated: bool = False
    uncertain: bool = False
    running: bool = False
    pid: int | None = None
    skipped: bool = False
    resolved: Literal["skipped", "applied"] | None = None
    stored: dict[str, dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.success and (self.error is not None or self.error_type is not None):
            raise KyronixUsageError("a successful result has no error")
        if not self.success and self.error_type is None:
            raise KyronixUsageError("a failed result says its errorType")

    def to_dict(self) -> ResultDict:
        out: ResultDict = {
            "success": self.success,
            "output": self.output,
            "executionId": self.execution_id,
            "ms": self.ms,
        }
        if self.error is not None:
            out["error"] = self.error
        if self.error_type is not None:
            out["errorType"] = self.error_type
        if self.data is not None:
            out["data"] = self.data
        if self.truncated:
            out["truncated"] = True
        if self.uncertain:
            out["uncertain"] = True
        if self.running:
            out["running"] = True
        if self.pid is not None:
            out["pid"] = self.pid
        if self.skipped:
            out["skipped"] = True
        if self.resolved is not None:
            out["resolved"] = self.resolved
        if self.stored:
            out["stored"] = self.stored
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ToolResult:
        """The model of a ``result`` dict; :class:`~kyronix.errors.KyronixUsageError` when it
        does not have the shape (a damaged receipt, a frame from something else)."""
        if not isinstance(raw, Mapping):
            raise KyronixUsageError(f"a result is an object, got {type(raw).__name__}")
        unknown = set(raw) - _RESULT_KEYS
        if unknown:
            raise KyronixUsageError(f"a result has no key {', '.join(sorted(unknown))}")
        try:
            return cls(
                success=_typed(raw, "success", bool),
                output=_typed(raw, "output", str),
                execution_id=_typed(raw, "executionId", str),
                ms=_typed(raw, "ms", int, 0),
                error=_typed(raw, "error", str, None),
                error_type=_typed(raw, "errorType", str, None),
                data=_typed(raw, "data", dict, None),
                truncated=_typed(raw, "truncated", bool, False),
                uncertain=_typed(raw, "uncertain", bool, False),
                running=_typed(raw, "running", bool, False),
                pid=_typed(raw, "pid", int, None),
                skipped=_typed(raw, "skipped", bool, False),
                resolved=_resolved(raw.get("resolved")),
                stored=_typed(raw, "stored", dict, None),
            )
        except KyronixUsageError:
            raise
        except (TypeError, ValueError) as exc:  # pragma: no cover - _typed checks first
            raise KyronixUsageError(f"a result does not have the documented shape: {exc}") from None


_RESULT_KEYS = frozenset(ResultDict.__annotations__)
_MISSING: Any = object()


def _typed(raw: Mapping[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
    if key not in raw:
        if default is _MISSING:
            raise KyronixUsageError(f"a result needs {key!r}")
        return default
    value = raw[key]
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise KyronixUsageError(
            f"a result's {key!r} is a {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _resolved(value: object) -> Literal["skipped", "applied"] | None:
    if value is None:
        return None
    if value == "skipped":
        return "skipped"
    if value == "applied":
        return "applied"
    raise KyronixUsageError(f"a result's 'resolved' is 'skipped' or 'applied', got {value!r}")


@dataclass(frozen=True, slots=True)
class ResultEntry:
    """One tool call's entry: the tool, its arguments as resolved, and its result."""

    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    result: ToolResult = field(default_factory=lambda: ToolResult(True, "", ""))

    def to_dict(self) -> EntryDict:
        return {"tool": self.tool, "args": dict(self.args), "result": self.result.to_dict()}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ResultEntry:
        """The model of an entry dict (what a receipt stores); raises
        :class:`~kyronix.errors.KyronixUsageError` when it does not have the shape."""
        if not isinstance(raw, Mapping) or set(raw) != {"tool", "args", "result"}:
            raise KyronixUsageError("an entry is an object with exactly tool, args and result")
        tool, args = raw["tool"], raw["args"]
        if not isinstance(tool, str) or not isinstance(args, dict):
            raise KyronixUsageError("an entry's tool is a string and its args an object")
        return cls(tool, dict(args), ToolResult.from_dict(raw["result"]))
