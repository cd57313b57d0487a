"""The closed event union of the session log, version 1.

A session log is a header (``seq`` 0, type ``session``) followed by events. Each event is a frozen
dataclass; :func:`event_from_json` validates a decoded JSON object field by field and builds the
right one, and ``to_json`` gives the object back in a fixed key order. Valid JSON that is not a
valid event is corruption, not history: unknown types, unknown keys, missing keys, wrong types and
values outside an enumeration are all refused with an :class:`EventError` naming the field.

The envelope of every event is ``seq`` (contiguous from 0), ``ts`` (unix milliseconds) and ``run``
(the run id; ``null`` only for a ``setting_changed`` made between runs). ``seq`` and ``ts`` are
stamped by the store when the event is appended: build events with the defaults.

Each class is the whole declaration of its type: :mod:`kiso.kernel._codec` generates its validator
and serialiser from the field hints. docs/adr/0002-event-types-v1.md says why the union is this
small and what each field means.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias, TypeVar, get_args

from kiso.kernel._codec import DUMP, OMIT_NONE, PARSE, compile_event
from kiso.kernel._fields import JsonObject, fail, only, read_int, read_opt_str, read_str
from kiso.kernel.errors import EventError
from kiso.kernel.values import (
    AssistantBlock,
    ImageBlock,
    ModelRef,
    Outcome,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    Usage,
    UserBlock,
    dump_blocks,
    dump_user_content,
    dump_value,
    parse_assistant_blocks,
    parse_model_ref,
    parse_outcome,
    parse_usage,
    parse_user_content,
)

__all__ = [
    "ASSISTANT_STOPS",
    "ERROR_KINDS",
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "ApprovalDecided",
    "ApprovalRequested",
    "Assistant",
    "AssistantBlock",
    "Compacted",
    "Event",
    "ExecutionFinished",
    "ExecutionResolved",
    "ExecutionStarted",
    "ImageBlock",
    "ModelRef",
    "Outcome",
    "RunEnded",
    "RunStarted",
    "SessionHeader",
    "SettingChanged",
    "TextBlock",
    "ThinkingBlock",
    "ToolCall",
    "Usage",
    "User",
    "UserBlock",
    "billed",
    "dumps_line",
    "event_from_json",
    "header_from_json",
    "input_sha256",
]

SCHEMA_VERSION = 1
"""The version written in every new session header. A loader refuses a newer one."""

Trigger = Literal["user", "resume", "subagent", "api"]
Source = Literal["user", "system", "subagent", "skill"]
Decision = Literal["approved", "denied"]
Resolution = Literal["rerun", "skipped", "applied"]
CompactionTrigger = Literal["auto", "manual"]
ErrorKind = Literal["invalid_input", "precondition", "transient", "fatal", "timeout", "aborted"]
ERROR_KINDS = frozenset(get_args(ErrorKind))
Stop = Literal[
    "end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "content_filter", "pause_turn"
]
ASSISTANT_STOPS = frozenset(get_args(Stop))
"""Stop reasons a committed ``assistant`` record may carry (the provider's stop, normalised)."""


def _custom(parse: Callable[[Any, str], Any], dump: Callable[[Any], Any]) -> dict[str, Any]:
    return {PARSE: parse, DUMP: dump}


_OPTIONAL = {OMIT_NONE: True}


def _parse_opt_usage(v: Any, where: str) -> Usage | None:
    return None if v is None else parse_usage(v, where)


# --------------------------------------------------------------------------- encoding

_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode
_LINE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def input_sha256(value: Mapping[str, Any]) -> str:
    """The digest that binds an approval verdict to one exact tool input.

    Canonical JSON (sorted keys, no insignificant whitespace, UTF-8), hashed with SHA-256.
    """
    return hashlib.sha256(_CANONICAL(value).encode("utf-8")).hexdigest()


def dumps_line(obj: Mapping[str, Any]) -> bytes:
    """One log line: compact JSON, UTF-8, no NaN, a trailing newline."""
    return (_LINE(obj) + "\n").encode("utf-8")


# --------------------------------------------------------------------------- the header


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionHeader:
    """Line 1 of every log: which session, where it started, which kiso wrote it."""

    id: str
    workspace: str
    created: int
    kiso: str
    parent: str | None = None
    v: int = SCHEMA_VERSION
    seq: int = 0
    type: ClassVar[str] = "session"

    def to_json(self) -> JsonObject:
        return {
            "seq": 0,
            "type": "session",
            "v": self.v,
            "id": self.id,
            "workspace": self.workspace,
            "created": self.created,
            "kiso": self.kiso,
            "parent": self.parent,
        }


_HEADER_KEYS = frozenset({"seq", "type", "v", "id", "workspace", "created", "kiso", "parent"})


def header_from_json(d: Any) -> SessionHeader:
    """Validate line 1 of a log."""
    where = "session header"
    if type(d) is not dict:
        raise EventError(f"{where}: must be a JSON object")
    if d.get("type") != "session":
        raise EventError(f"{where}: the first line must have type 'session'")
    only(d, _HEADER_KEYS, where)
    if d.get("seq") != 0 or type(d.get("seq")) is not int:
        raise fail(where, "seq", "0", d.get("seq", ...))
    v = read_int(d, "v", where)
    if v == 0 or v > SCHEMA_VERSION:
        raise EventError(
            f"{where}: schema version {v} is not supported by this kiso (it reads "
            f"1..{SCHEMA_VERSION}); upgrade kiso to open this session"
        )
    if "parent" not in d:
        raise fail(where, "parent", "a session id or null")
    return SessionHeader(
        id=read_str(d, "id", where),
        workspace=read_str(d, "workspace", where),
        created=read_int(d, "created", where),
        kiso=read_str(d, "kiso", where),
        parent=read_opt_str(d, "parent", where),
        v=v,
    )


# --------------------------------------------------------------------------- the events
# Each class: its fields (hints are the contract), then the envelope seq/ts with their defaults.
# The @event decorator generates from_json and to_json, and registers the type.

_PARSERS: dict[str, Callable[..., Any]] = {}
_E = TypeVar("_E")


def event(type_name: str) -> Callable[[type[_E]], type[_E]]:
    def register(cls: type[_E]) -> type[_E]:
        parse, to_json = compile_event(cls, type_name)
        cls.to_json = to_json  # type: ignore[attr-defined]
        _PARSERS[type_name] = parse
        return cls

    return register


class _EventBase:
    __slots__ = ()
    type: ClassVar[str]

    if TYPE_CHECKING:

        def to_json(self) -> JsonObject: ...


@event("run_started")
@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted(_EventBase):
    """A run begins. ``run`` (the envelope field) is its id."""

    run: str
    trigger: Trigger
    model: ModelRef = field(metadata=_custom(parse_model_ref, dump_value))
    mode: str
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "run_started"


@event("user")
@dataclass(frozen=True, slots=True, kw_only=True)
class User(_EventBase):
    """Input admitted into the conversation: text, or text and image blocks."""

    run: str
    content: str | tuple[UserBlock, ...] = field(
        metadata=_custom(parse_user_content, dump_user_content)
    )
    source: Source = "user"
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "user"

    @property
    def text(self) -> str:
        """The text of the input, blocks joined by blank lines, images left out."""
        if isinstance(self.content, str):
            return self.content
        return "\n\n".join(b.text for b in self.content if isinstance(b, TextBlock))


@event("assistant")
@dataclass(frozen=True, slots=True, kw_only=True)
class Assistant(_EventBase):
    """One committed model turn, written once the provider's stream ended cleanly with a stop."""

    run: str
    blocks: tuple[AssistantBlock, ...] = field(
        metadata=_custom(parse_assistant_blocks, dump_blocks)
    )
    stop: Stop
    usage: Usage = field(metadata=_custom(parse_usage, dump_value))
    model: str
    ms: int
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "assistant"

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(b for b in self.blocks if isinstance(b, ToolCall))

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.blocks if isinstance(b, TextBlock))


@event("approval_requested")
@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequested(_EventBase):
    """A human is asked about a call; ``speaker`` is the policy that asked."""

    run: str
    call_id: str
    name: str
    input: JsonObject
    speaker: str
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "approval_requested"


@event("approval_decided")
@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecided(_EventBase):
    """A verdict on a call, by a human or a policy, bound to the input by its digest."""

    run: str
    call_id: str
    decision: Decision
    decided_by: str
    reason: str | None
    input_sha256: str
    rule: str | None = field(default=None, metadata=_OPTIONAL)
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "approval_decided"


@event("execution_started")
@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionStarted(_EventBase):
    """Written (and fsynced) immediately before a handler runs: the side effect may follow."""

    run: str
    execution_id: str
    call_id: str
    name: str
    input: JsonObject
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "execution_started"


@event("execution_finished")
@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionFinished(_EventBase):
    """The receipt: the handler returned. ``ok`` is false when the handler itself failed."""

    run: str
    execution_id: str
    call_id: str
    ok: bool
    content: str
    is_error: bool
    ms: int
    error_kind: ErrorKind | None = field(default=None, metadata=_OPTIONAL)
    truncated: bool | None = field(default=None, metadata=_OPTIONAL)
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "execution_finished"


@event("execution_resolved")
@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionResolved(_EventBase):
    """A ruling on an uncertain execution: ``rerun`` it, it was ``skipped``, or ``applied``."""

    run: str
    execution_id: str
    call_id: str
    resolution: Resolution
    decided_by: str
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "execution_resolved"


@event("compacted")
@dataclass(frozen=True, slots=True, kw_only=True)
class Compacted(_EventBase):
    """A summary that replaces every event with ``seq <= covers_to_seq`` in the projection."""

    run: str
    covers_to_seq: int
    summary: str
    trigger: CompactionTrigger
    tokens_before: int | None
    tokens_after: int | None
    model: str | None = field(default=None, metadata=_OPTIONAL)
    """The model that wrote the summary (absent in logs written before it was recorded)."""
    usage: Usage | None = field(
        default=None, metadata={**_OPTIONAL, **_custom(_parse_opt_usage, dump_value)}
    )
    """What the summary request cost, as the provider counted it: it is billed like a turn."""
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "compacted"

    def _check(self, where: str) -> None:
        if self.covers_to_seq >= self.seq:
            raise EventError(
                f"{where}: covers_to_seq {self.covers_to_seq} must be below its own seq {self.seq}"
            )
        if not self.summary.strip():
            raise EventError(f"{where}: summary must not be empty")


@event("setting_changed")
@dataclass(frozen=True, slots=True, kw_only=True)
class SettingChanged(_EventBase):
    """``/model``, ``/mode`` and the like; ``run`` is null when changed between runs."""

    key: str
    value: Any
    run: str | None = None
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "setting_changed"


@event("run_ended")
@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnded(_EventBase):
    """Every run ends with exactly one of these."""

    run: str
    outcome: Outcome = field(metadata=_custom(parse_outcome, dump_value))
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "run_ended"


Event: TypeAlias = (
    RunStarted
    | User
    | Assistant
    | ApprovalRequested
    | ApprovalDecided
    | ExecutionStarted
    | ExecutionFinished
    | ExecutionResolved
    | Compacted
    | SettingChanged
    | RunEnded
)


def billed(events: Iterable[Event]) -> Iterator[tuple[str, Usage]]:
    """Every model request the log records as paid for, as (model, usage): each committed turn
    and each summary that made a ``compacted`` record (older records carry no usage)."""
    for e in events:
        if isinstance(e, Assistant):
            yield e.model, e.usage
        elif isinstance(e, Compacted) and e.usage is not None:
            yield e.model or "", e.usage


EVENT_TYPES = frozenset(_PARSERS)
"""The type names of the union (the header's ``session`` is not among them)."""


def event_from_json(d: Any) -> Event:
    """Validate one decoded log line (not the header) and build its event."""
    if type(d) is not dict:
        raise EventError("an event must be a JSON object")
    kind = d.get("type")
    parser = _PARSERS.get(kind) if type(kind) is str else None
    if parser is None:
        shown = json.dumps(kind) if kind is not None else "none"
        raise EventError(f"unknown event type {shown}")
    parsed: Event = parser(d)
    return parsed
