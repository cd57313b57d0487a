"""The closed event union of the session log, version 1.

A session log is a header (``seq`` 0, type ``session``) followed by events. Each event is a frozen
dataclass; :func:`event_from_json` validates a decoded JSON object field by field and builds the
right one, and :meth:`to_json` gives the object back in a fixed key order. Valid JSON that is not a
valid event is corruption, not history: unknown types, unknown keys, missing keys, wrong types and
values outside an enumeration are all refused with an :class:`EventError` naming the field.

The envelope of every event is ``seq`` (contiguous from 0), ``ts`` (unix milliseconds) and ``run``
(the run id; ``null`` only for a ``setting_changed`` made between runs). ``seq`` and ``ts`` are
stamped by the store when the event is appended; build events with the defaults.

docs/adr/0002-event-types-v1.md says why the union is this small and what each field means.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias, cast

from kiso.kernel.errors import EventError

__all__ = [
    "ASSISTANT_STOPS",
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
    "dumps_line",
    "event_from_json",
    "header_from_json",
    "input_sha256",
]

SCHEMA_VERSION = 1
"""The version written in every new session header. A loader refuses a newer one."""

JsonObject: TypeAlias = dict[str, Any]

Trigger = Literal["user", "resume", "subagent", "api"]
Source = Literal["user", "system", "subagent", "skill"]
Decision = Literal["approved", "denied"]
Resolution = Literal["rerun", "skipped", "applied"]
CompactionTrigger = Literal["auto", "manual"]
OutcomeKind = Literal["completed", "max_turns", "error", "aborted", "budget"]
ErrorKind = Literal["invalid_input", "precondition", "transient", "fatal", "timeout", "aborted"]

TRIGGERS = frozenset({"user", "resume", "subagent", "api"})
SOURCES = frozenset({"user", "system", "subagent", "skill"})
DECISIONS = frozenset({"approved", "denied"})
RESOLUTIONS = frozenset({"rerun", "skipped", "applied"})
COMPACTION_TRIGGERS = frozenset({"auto", "manual"})
OUTCOME_KINDS = frozenset({"completed", "max_turns", "error", "aborted", "budget"})
ERROR_KINDS = frozenset({"invalid_input", "precondition", "transient", "fatal", "timeout", "aborted"})
ASSISTANT_STOPS = frozenset(
    {"end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "content_filter", "pause_turn"}
)
"""Stop reasons a committed ``assistant`` record may carry (the provider's stop, normalised)."""

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


# --------------------------------------------------------------------------- field readers
# Each reader takes the decoded object, the key and the name of the thing being read, and returns
# the value with its static type or raises EventError naming the field. They are small and called
# once per field, so loading stays close to the cost of json.loads itself.


def _fail(where: str, key: str, expected: str, value: Any = ...) -> EventError:
    if value is ...:
        return EventError(f"{where}: missing field {key!r} ({expected})")
    shown = json.dumps(value, ensure_ascii=False)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return EventError(f"{where}: field {key!r} must be {expected}, got {shown}")


def _str(d: Mapping[str, Any], key: str, where: str) -> str:
    v = d.get(key, ...)
    if type(v) is not str:
        raise _fail(where, key, "a string", v)
    return v


def _opt_str(d: Mapping[str, Any], key: str, where: str) -> str | None:
    v = d.get(key)
    if v is None or type(v) is str:
        return v
    raise _fail(where, key, "a string or null", v)


def _int(d: Mapping[str, Any], key: str, where: str) -> int:
    v = d.get(key, ...)
    if type(v) is not int or v < 0:
        raise _fail(where, key, "a non-negative integer", v)
    return v


def _opt_int(d: Mapping[str, Any], key: str, where: str) -> int | None:
    v = d.get(key)
    if v is None or (type(v) is int and v >= 0):
        return v
    raise _fail(where, key, "a non-negative integer or null", v)


def _bool(d: Mapping[str, Any], key: str, where: str) -> bool:
    v = d.get(key, ...)
    if type(v) is not bool:
        raise _fail(where, key, "true or false", v)
    return v


def _obj(d: Mapping[str, Any], key: str, where: str) -> JsonObject:
    v = d.get(key, ...)
    if type(v) is not dict:
        raise _fail(where, key, "an object", v)
    return cast(JsonObject, v)


def _enum(d: Mapping[str, Any], key: str, where: str, allowed: frozenset[str]) -> Any:
    v = d.get(key, ...)
    if type(v) is not str or v not in allowed:
        raise _fail(where, key, "one of " + ", ".join(sorted(allowed)), v)
    return v


def _only(d: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    if not d.keys() <= allowed:
        extra = sorted(set(d) - allowed)
        raise EventError(f"{where}: unknown field(s) {', '.join(map(repr, extra))}")


def _keys(*names: str) -> frozenset[str]:
    return frozenset(("seq", "ts", "run", "type", *names))


def input_sha256(value: Mapping[str, Any]) -> str:
    """The digest that binds an approval verdict to one exact tool input.

    Canonical JSON (sorted keys, no insignificant whitespace, UTF-8), hashed with SHA-256.
    """
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def dumps_line(obj: Mapping[str, Any]) -> bytes:
    """One log line: compact JSON, UTF-8, no NaN, a trailing newline."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (text + "\n").encode("utf-8")


# --------------------------------------------------------------------------- value types


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str
    type: ClassVar[str] = "text"

    def to_json(self) -> JsonObject:
        return {"type": "text", "text": self.text}


@dataclass(frozen=True, slots=True)
class ImageBlock:
    """An image the user attached: inline base64 ``data`` or a ``url``, never both."""

    media_type: str
    data: str | None = None
    url: str | None = None
    type: ClassVar[str] = "image"

    def to_json(self) -> JsonObject:
        out: JsonObject = {"type": "image", "media_type": self.media_type}
        if self.data is not None:
            out["data"] = self.data
        if self.url is not None:
            out["url"] = self.url
        return out


@dataclass(frozen=True, slots=True)
class ThinkingBlock:
    """Model reasoning; ``signature`` is replayed byte for byte to providers that sign it."""

    text: str
    signature: str | None = None
    type: ClassVar[str] = "thinking"

    def to_json(self) -> JsonObject:
        out: JsonObject = {"type": "thinking", "text": self.text}
        if self.signature is not None:
            out["signature"] = self.signature
        return out


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model made. ``call_id`` is the provider's correlation id, unique in its turn."""

    call_id: str
    name: str
    input: JsonObject
    type: ClassVar[str] = "tool_call"

    def to_json(self) -> JsonObject:
        return {"type": "tool_call", "call_id": self.call_id, "name": self.name, "input": self.input}


UserBlock: TypeAlias = TextBlock | ImageBlock
AssistantBlock: TypeAlias = TextBlock | ThinkingBlock | ToolCall


@dataclass(frozen=True, slots=True)
class Usage:
    """The provider's own token counts for one request; ``None`` where it reported none."""

    input: int | None = None
    output: int | None = None
    cache_read: int | None = None
    cache_write: int | None = None

    def to_json(self) -> JsonObject:
        return {
            "input": self.input,
            "output": self.output,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
        }


@dataclass(frozen=True, slots=True)
class ModelRef:
    provider: str
    model: str
    profile: str | None = None

    def to_json(self) -> JsonObject:
        return {"provider": self.provider, "model": self.model, "profile": self.profile}


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended.

    ``completed``, ``max_turns`` and ``budget`` carry nothing else; ``error`` carries ``code``,
    ``message`` and ``retryable``; ``aborted`` carries ``by`` (who stopped it).
    """

    kind: OutcomeKind
    code: str | None = None
    message: str | None = None
    retryable: bool | None = None
    by: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in OUTCOME_KINDS:
            raise EventError(f"outcome: unknown kind {self.kind!r}")
        if self.kind == "error" and (
            self.code is None or self.message is None or self.retryable is None
        ):
            raise EventError("outcome: an error outcome needs code, message and retryable")
        if self.kind == "aborted" and self.by is None:
            raise EventError("outcome: an aborted outcome needs 'by'")

    @classmethod
    def completed(cls) -> Outcome:
        return cls("completed")

    @classmethod
    def error(cls, code: str, message: str, *, retryable: bool = False) -> Outcome:
        return cls("error", code=code, message=message, retryable=retryable)

    @classmethod
    def aborted(cls, by: str) -> Outcome:
        return cls("aborted", by=by)

    def to_json(self) -> JsonObject:
        out: JsonObject = {"kind": self.kind}
        if self.kind == "error":
            out["code"] = self.code
            out["message"] = self.message
            out["retryable"] = self.retryable
        elif self.kind == "aborted":
            out["by"] = self.by
        return out


# --------------------------------------------------------------------------- parsing helpers


def _user_content(v: Any, where: str) -> str | tuple[UserBlock, ...]:
    if type(v) is str:
        return v
    if type(v) is not list or not v:
        raise _fail(where, "content", "a string or a non-empty list of text/image blocks", v)
    blocks: list[UserBlock] = []
    for i, raw in enumerate(v):
        at = f"{where}.content[{i}]"
        if type(raw) is not dict:
            raise _fail(at, "block", "an object", raw)
        kind = raw.get("type")
        if kind == "text":
            _only(raw, frozenset({"type", "text"}), at)
            blocks.append(TextBlock(_str(raw, "text", at)))
        elif kind == "image":
            _only(raw, frozenset({"type", "media_type", "data", "url"}), at)
            media = _enum(raw, "media_type", at, IMAGE_TYPES)
            data, url = _opt_str(raw, "data", at), _opt_str(raw, "url", at)
            if (data is None) == (url is None):
                raise EventError(f"{at}: an image has exactly one of 'data' or 'url'")
            blocks.append(ImageBlock(media, data, url))
        else:
            raise _fail(at, "type", "'text' or 'image'", kind)
    return tuple(blocks)


_TOOL_CALL_KEYS = frozenset({"type", "call_id", "name", "input"})
_THINKING_KEYS = frozenset({"type", "text", "signature"})
_TEXT_KEYS = frozenset({"type", "text"})


def _assistant_blocks(v: Any, where: str) -> tuple[AssistantBlock, ...]:
    if type(v) is not list:
        raise _fail(where, "blocks", "a list", v)
    blocks: list[AssistantBlock] = []
    seen: set[str] = set()
    for i, raw in enumerate(v):
        at = f"{where}.blocks[{i}]"
        if type(raw) is not dict:
            raise _fail(at, "block", "an object", raw)
        kind = raw.get("type")
        if kind == "tool_call":
            _only(raw, _TOOL_CALL_KEYS, at)
            call_id = _str(raw, "call_id", at)
            if call_id in seen:
                raise EventError(f"{at}: call_id {call_id!r} repeats within one turn")
            seen.add(call_id)
            blocks.append(ToolCall(call_id, _str(raw, "name", at), _obj(raw, "input", at)))
        elif kind == "text":
            _only(raw, _TEXT_KEYS, at)
            blocks.append(TextBlock(_str(raw, "text", at)))
        elif kind == "thinking":
            _only(raw, _THINKING_KEYS, at)
            blocks.append(ThinkingBlock(_str(raw, "text", at), _opt_str(raw, "signature", at)))
        else:
            raise _fail(at, "type", "'text', 'thinking' or 'tool_call'", kind)
    return tuple(blocks)


_USAGE_KEYS = frozenset({"input", "output", "cache_read", "cache_write"})


def _usage(v: Any, where: str) -> Usage:
    if type(v) is not dict:
        raise _fail(where, "usage", "an object", v)
    at = where + ".usage"
    _only(v, _USAGE_KEYS, at)
    if len(v) != len(_USAGE_KEYS):
        missing = ", ".join(sorted(_USAGE_KEYS - v.keys()))
        raise EventError(f"{at}: missing field(s) {missing} (a count, or null when not reported)")
    return Usage(
        _opt_int(v, "input", at),
        _opt_int(v, "output", at),
        _opt_int(v, "cache_read", at),
        _opt_int(v, "cache_write", at),
    )


def _outcome(v: Any, where: str) -> Outcome:
    if type(v) is not dict:
        raise _fail(where, "outcome", "an object", v)
    at = where + ".outcome"
    kind = _enum(v, "kind", at, OUTCOME_KINDS)
    if kind == "error":
        _only(v, frozenset({"kind", "code", "message", "retryable"}), at)
        return Outcome(
            "error",
            code=_str(v, "code", at),
            message=_str(v, "message", at),
            retryable=_bool(v, "retryable", at),
        )
    if kind == "aborted":
        _only(v, frozenset({"kind", "by"}), at)
        return Outcome("aborted", by=_str(v, "by", at))
    _only(v, frozenset({"kind"}), at)
    return Outcome(kind)


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
    _only(d, _HEADER_KEYS, where)
    if d.get("seq") != 0 or type(d.get("seq")) is not int:
        raise _fail(where, "seq", "0", d.get("seq", ...))
    v = _int(d, "v", where)
    if v == 0 or v > SCHEMA_VERSION:
        raise EventError(
            f"{where}: schema version {v} is not supported by this kiso (it reads "
            f"1..{SCHEMA_VERSION}); upgrade kiso to open this session"
        )
    return SessionHeader(
        id=_str(d, "id", where),
        workspace=_str(d, "workspace", where),
        created=_int(d, "created", where),
        kiso=_str(d, "kiso", where),
        parent=_opt_str(d, "parent", where),
        v=v,
    )


# --------------------------------------------------------------------------- the events
# Envelope fields come first in every to_json: seq, ts, run, type.


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted:
    """A run begins. ``run`` (the envelope field) is its id."""

    run: str
    trigger: Trigger
    model: ModelRef
    mode: str
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "run_started"

    def to_json(self) -> JsonObject:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "run_started",
            "trigger": self.trigger,
            "model": self.model.to_json(),
            "mode": self.mode,
        }

    _KEYS: ClassVar[frozenset[str]] = _keys("trigger", "model", "mode")
    _MODEL_KEYS: ClassVar[frozenset[str]] = frozenset({"provider", "model", "profile"})

    @classmethod
    def from_json(cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str) -> RunStarted:
        _only(d, cls._KEYS, where)
        m = _obj(d, "model", where)
        _only(m, cls._MODEL_KEYS, where + ".model")
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            trigger=_enum(d, "trigger", where, TRIGGERS),
            model=ModelRef(
                _str(m, "provider", where + ".model"),
                _str(m, "model", where + ".model"),
                _opt_str(m, "profile", where + ".model"),
            ),
            mode=_str(d, "mode", where),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class User:
    """Input admitted into the conversation."""

    run: str
    content: str | tuple[UserBlock, ...]
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

    def to_json(self) -> JsonObject:
        content: Any = (
            self.content if isinstance(self.content, str) else [b.to_json() for b in self.content]
        )
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "user",
            "content": content,
            "source": self.source,
        }

    _KEYS: ClassVar[frozenset[str]] = _keys("content", "source")

    @classmethod
    def from_json(cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str) -> User:
        _only(d, cls._KEYS, where)
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            content=_user_content(d.get("content", ...), where),
            source=_enum(d, "source", where, SOURCES),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Assistant:
    """One committed model turn, written once the provider's stream ended cleanly with a stop."""

    run: str
    blocks: tuple[AssistantBlock, ...]
    stop: str
    usage: Usage
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

    def to_json(self) -> JsonObject:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "assistant",
            "blocks": [b.to_json() for b in self.blocks],
            "stop": self.stop,
            "usage": self.usage.to_json(),
            "model": self.model,
            "ms": self.ms,
        }

    _KEYS: ClassVar[frozenset[str]] = _keys("blocks", "stop", "usage", "model", "ms")

    @classmethod
    def from_json(cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str) -> Assistant:
        _only(d, cls._KEYS, where)
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            blocks=_assistant_blocks(d.get("blocks", ...), where),
            stop=_enum(d, "stop", where, ASSISTANT_STOPS),
            usage=_usage(d.get("usage", ...), where),
            model=_str(d, "model", where),
            ms=_int(d, "ms", where),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequested:
    """A human is asked about a call; ``speaker`` is the policy that asked."""

    run: str
    call_id: str
    name: str
    input: JsonObject
    speaker: str
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "approval_requested"

    def to_json(self) -> JsonObject:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "approval_requested",
            "call_id": self.call_id,
            "name": self.name,
            "input": self.input,
            "speaker": self.speaker,
        }

    _KEYS: ClassVar[frozenset[str]] = _keys("call_id", "name", "input", "speaker")

    @classmethod
    def from_json(
        cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str
    ) -> ApprovalRequested:
        _only(d, cls._KEYS, where)
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            call_id=_str(d, "call_id", where),
            name=_str(d, "name", where),
            input=_obj(d, "input", where),
            speaker=_str(d, "speaker", where),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecided:
    """A verdict on a call, by a human or a policy, bound to the input by its digest."""

    run: str
    call_id: str
    decision: Decision
    decided_by: str
    reason: str | None
    input_sha256: str
    rule: str | None = None
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "approval_decided"

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "approval_decided",
            "call_id": self.call_id,
            "decision": self.decision,
            "decided_by": self.decided_by,
            "reason": self.reason,
            "input_sha256": self.input_sha256,
        }
        if self.rule is not None:
            out["rule"] = self.rule
        return out

    _KEYS: ClassVar[frozenset[str]] = _keys(
        "call_id", "decision", "decided_by", "reason", "input_sha256", "rule"
    )

    @classmethod
    def from_json(
        cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str
    ) -> ApprovalDecided:
        _only(d, cls._KEYS, where)
        if "reason" not in d:
            raise _fail(where, "reason", "a string or null")
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            call_id=_str(d, "call_id", where),
            decision=_enum(d, "decision", where, DECISIONS),
            decided_by=_str(d, "decided_by", where),
            reason=_opt_str(d, "reason", where),
            input_sha256=_str(d, "input_sha256", where),
            rule=_opt_str(d, "rule", where),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionStarted:
    """Written (and fsynced) immediately before a handler runs: the side effect may follow."""

    run: str
    execution_id: str
    call_id: str
    name: str
    input: JsonObject
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "execution_started"

    def to_json(self) -> JsonObject:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "execution_started",
            "execution_id": self.execution_id,
            "call_id": self.call_id,
            "name": self.name,
            "input": self.input,
        }

    _KEYS: ClassVar[frozenset[str]] = _keys("execution_id", "call_id", "name", "input")

    @classmethod
    def from_json(
        cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str
    ) -> ExecutionStarted:
        _only(d, cls._KEYS, where)
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            execution_id=_str(d, "execution_id", where),
            call_id=_str(d, "call_id", where),
            name=_str(d, "name", where),
            input=_obj(d, "input", where),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionFinished:
    """The receipt: the handler returned. ``ok`` is false when the handler itself failed."""

    run: str
    execution_id: str
    call_id: str
    ok: bool
    content: str
    is_error: bool
    ms: int
    error_kind: ErrorKind | None = None
    truncated: bool | None = None
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "execution_finished"

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "execution_finished",
            "execution_id": self.execution_id,
            "call_id": self.call_id,
            "ok": self.ok,
            "content": self.content,
            "is_error": self.is_error,
            "ms": self.ms,
        }
        if self.error_kind is not None:
            out["error_kind"] = self.error_kind
        if self.truncated is not None:
            out["truncated"] = self.truncated
        return out

    _KEYS: ClassVar[frozenset[str]] = _keys(
        "execution_id", "call_id", "ok", "content", "is_error", "ms", "error_kind", "truncated"
    )

    @classmethod
    def from_json(
        cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str
    ) -> ExecutionFinished:
        _only(d, cls._KEYS, where)
        error_kind = d.get("error_kind")
        if error_kind is not None:
            error_kind = _enum(d, "error_kind", where, ERROR_KINDS)
        truncated = d.get("truncated")
        if truncated is not None:
            truncated = _bool(d, "truncated", where)
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            execution_id=_str(d, "execution_id", where),
            call_id=_str(d, "call_id", where),
            ok=_bool(d, "ok", where),
            content=_str(d, "content", where),
            is_error=_bool(d, "is_error", where),
            ms=_int(d, "ms", where),
            error_kind=error_kind,
            truncated=truncated,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionResolved:
    """A ruling on an uncertain execution: ``rerun`` it, it was ``skipped``, or it was ``applied``."""

    run: str
    execution_id: str
    call_id: str
    resolution: Resolution
    decided_by: str
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "execution_resolved"

    def to_json(self) -> JsonObject:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "execution_resolved",
            "execution_id": self.execution_id,
            "call_id": self.call_id,
            "resolution": self.resolution,
            "decided_by": self.decided_by,
        }

    _KEYS: ClassVar[frozenset[str]] = _keys("execution_id", "call_id", "resolution", "decided_by")

    @classmethod
    def from_json(
        cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str
    ) -> ExecutionResolved:
        _only(d, cls._KEYS, where)
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            execution_id=_str(d, "execution_id", where),
            call_id=_str(d, "call_id", where),
            resolution=_enum(d, "resolution", where, RESOLUTIONS),
            decided_by=_str(d, "decided_by", where),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Compacted:
    """A summary that replaces every event with ``seq <= covers_to_seq`` in the projection."""

    run: str
    covers_to_seq: int
    summary: str
    trigger: CompactionTrigger
    tokens_before: int | None
    tokens_after: int | None
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "compacted"

    def to_json(self) -> JsonObject:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "compacted",
            "covers_to_seq": self.covers_to_seq,
            "summary": self.summary,
            "trigger": self.trigger,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
        }

    _KEYS: ClassVar[frozenset[str]] = _keys(
        "covers_to_seq", "summary", "trigger", "tokens_before", "tokens_after"
    )

    @classmethod
    def from_json(cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str) -> Compacted:
        _only(d, cls._KEYS, where)
        covers = _int(d, "covers_to_seq", where)
        if covers >= seq:
            raise EventError(f"{where}: covers_to_seq {covers} must be below its own seq {seq}")
        summary = _str(d, "summary", where)
        if not summary.strip():
            raise EventError(f"{where}: summary must not be empty")
        for key in ("tokens_before", "tokens_after"):
            if key not in d:
                raise _fail(where, key, "a non-negative integer or null")
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            covers_to_seq=covers,
            summary=summary,
            trigger=_enum(d, "trigger", where, COMPACTION_TRIGGERS),
            tokens_before=_opt_int(d, "tokens_before", where),
            tokens_after=_opt_int(d, "tokens_after", where),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SettingChanged:
    """``/model``, ``/mode`` and the like; ``run`` is null when changed between runs."""

    key: str
    value: Any
    run: str | None = None
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "setting_changed"

    def to_json(self) -> JsonObject:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "setting_changed",
            "key": self.key,
            "value": self.value,
        }

    _KEYS: ClassVar[frozenset[str]] = _keys("key", "value")

    @classmethod
    def from_json(
        cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str
    ) -> SettingChanged:
        _only(d, cls._KEYS, where)
        if "value" not in d:
            raise _fail(where, "value", "any JSON value")
        return cls(seq=seq, ts=ts, run=run, key=_str(d, "key", where), value=d["value"])


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnded:
    """Every run ends with exactly one of these."""

    run: str
    outcome: Outcome
    seq: int = -1
    ts: int = 0
    type: ClassVar[str] = "run_ended"

    def to_json(self) -> JsonObject:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run": self.run,
            "type": "run_ended",
            "outcome": self.outcome.to_json(),
        }

    _KEYS: ClassVar[frozenset[str]] = _keys("outcome")

    @classmethod
    def from_json(cls, d: JsonObject, seq: int, ts: int, run: str | None, where: str) -> RunEnded:
        _only(d, cls._KEYS, where)
        return cls(
            seq=seq,
            ts=ts,
            run=_need_run(run, where),
            outcome=_outcome(d.get("outcome", ...), where),
        )


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

_Parser = Callable[[JsonObject, int, int, "str | None", str], Event]
_PARSERS: dict[str, _Parser] = {
    cls.type: cls.from_json
    for cls in (
        RunStarted,
        User,
        Assistant,
        ApprovalRequested,
        ApprovalDecided,
        ExecutionStarted,
        ExecutionFinished,
        ExecutionResolved,
        Compacted,
        SettingChanged,
        RunEnded,
    )
}
EVENT_TYPES = frozenset(_PARSERS)
"""The type names of the union (the header's ``session`` is not among them)."""


def _need_run(run: str | None, where: str) -> str:
    if run is None:
        raise EventError(f"{where}: field 'run' must be a run id, got null")
    return run


def event_from_json(d: Any) -> Event:
    """Validate one decoded log line (not the header) and build its event."""
    if type(d) is not dict:
        raise EventError("an event must be a JSON object")
    kind = d.get("type")
    parser = _PARSERS.get(kind) if type(kind) is str else None
    if parser is None:
        shown = json.dumps(kind) if kind is not None else "none"
        raise EventError(f"unknown event type {shown}")
    where = kind
    seq = d.get("seq", ...)
    if type(seq) is not int or seq < 1:
        raise _fail(where, "seq", "a positive integer", seq)
    ts = d.get("ts", ...)
    if type(ts) is not int or ts < 0:
        raise _fail(where, "ts", "a non-negative integer (unix ms)", ts)
    run = d.get("run", ...)
    if run is not None and type(run) is not str:
        raise _fail(where, "run", "a run id or null", run)
    return parser(d, seq, ts, run, f"{where} (seq {seq})")
