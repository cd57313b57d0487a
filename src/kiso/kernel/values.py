"""The value types inside events: content blocks, usage, the model reference, a run's outcome.

Each is a frozen dataclass with a ``to_json``; the parsers below validate their JSON shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

from kiso.kernel._fast import fast_constructor
from kiso.kernel._fields import (
    JsonObject,
    fail,
    only,
    read_bool,
    read_enum,
    read_obj,
    read_opt_int,
    read_opt_str,
    read_str,
)
from kiso.kernel.errors import EventError

__all__ = [
    "AssistantBlock",
    "ImageBlock",
    "ModelRef",
    "Outcome",
    "TextBlock",
    "ThinkingBlock",
    "ToolCall",
    "Usage",
    "UserBlock",
]

OutcomeKind = Literal["completed", "max_turns", "error", "aborted", "budget"]
OUTCOME_KINDS = frozenset({"completed", "max_turns", "error", "aborted", "budget"})
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


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
        return {
            "type": "tool_call",
            "call_id": self.call_id,
            "name": self.name,
            "input": self.input,
        }


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


# --------------------------------------------------------------------------- parsers


def parse_user_content(v: Any, where: str) -> str | tuple[UserBlock, ...]:
    if type(v) is str:
        return v
    if type(v) is not list or not v:
        raise fail(where, "content", "a string or a non-empty list of text/image blocks", v)
    blocks: list[UserBlock] = []
    for i, raw in enumerate(v):
        at = f"{where}.content[{i}]"
        if type(raw) is not dict:
            raise fail(at, "block", "an object", raw)
        kind = raw.get("type")
        if kind == "text":
            only(raw, frozenset({"type", "text"}), at)
            blocks.append(_new_TextBlock(text=read_str(raw, "text", at)))
        elif kind == "image":
            only(raw, frozenset({"type", "media_type", "data", "url"}), at)
            media = read_enum(raw, "media_type", at, IMAGE_TYPES)
            data, url = read_opt_str(raw, "data", at), read_opt_str(raw, "url", at)
            if (data is None) == (url is None):
                raise EventError(f"{at}: an image has exactly one of 'data' or 'url'")
            blocks.append(ImageBlock(media, data, url))
        else:
            raise fail(at, "type", "'text' or 'image'", kind)
    return tuple(blocks)


_TOOL_CALL_KEYS = frozenset({"type", "call_id", "name", "input"})
_THINKING_KEYS = frozenset({"type", "text", "signature"})
_TEXT_KEYS = frozenset({"type", "text"})


def parse_assistant_blocks(v: Any, where: str) -> tuple[AssistantBlock, ...]:
    # The hottest parser of a log (every model turn): checks are inline, and the location of a
    # block is only formatted when there is an error to report.
    if type(v) is not list:
        raise fail(where, "blocks", "a list", v)
    blocks: list[AssistantBlock] = []
    seen: set[str] = set()
    for i, raw in enumerate(v):
        if type(raw) is not dict:
            raise fail(f"{where}.blocks[{i}]", "block", "an object", raw)
        kind = raw.get("type")
        if kind == "tool_call":
            try:
                call_id, name, args = raw["call_id"], raw["name"], raw["input"]
            except KeyError:
                call_id = name = args = ...
            if (
                len(raw) != 4
                or type(call_id) is not str
                or type(name) is not str
                or type(args) is not dict
                or call_id in seen
            ):
                at = f"{where}.blocks[{i}]"
                only(raw, _TOOL_CALL_KEYS, at)
                read_str(raw, "call_id", at)
                read_str(raw, "name", at)
                read_obj(raw, "input", at)
                raise EventError(f"{at}: call_id {call_id!r} repeats within one turn")
            seen.add(call_id)
            blocks.append(_new_ToolCall(call_id=call_id, name=name, input=args))
        elif kind == "text":
            text = raw.get("text")
            if len(raw) != 2 or type(text) is not str:
                at = f"{where}.blocks[{i}]"
                only(raw, _TEXT_KEYS, at)
                read_str(raw, "text", at)
            blocks.append(_new_TextBlock(text=text))
        elif kind == "thinking":
            at = f"{where}.blocks[{i}]"
            only(raw, _THINKING_KEYS, at)
            blocks.append(
                ThinkingBlock(read_str(raw, "text", at), read_opt_str(raw, "signature", at))
            )
        else:
            raise fail(f"{where}.blocks[{i}]", "type", "'text', 'thinking' or 'tool_call'", kind)
    return tuple(blocks)


_USAGE_KEYS = frozenset({"input", "output", "cache_read", "cache_write"})


def parse_usage(v: Any, where: str) -> Usage:
    if type(v) is not dict:
        raise fail(where, "usage", "an object", v)
    i, o = v.get("input", ...), v.get("output", ...)
    r, w = v.get("cache_read", ...), v.get("cache_write", ...)
    if (
        len(v) == 4
        and (i is None or (type(i) is int and i >= 0))
        and (o is None or (type(o) is int and o >= 0))
        and (r is None or (type(r) is int and r >= 0))
        and (w is None or (type(w) is int and w >= 0))
    ):
        return _new_Usage(input=i, output=o, cache_read=r, cache_write=w)
    at = where + ".usage"
    only(v, _USAGE_KEYS, at)
    if len(v) != len(_USAGE_KEYS):
        missing = ", ".join(sorted(_USAGE_KEYS - v.keys()))
        raise EventError(f"{at}: missing field(s) {missing} (a count, or null when not reported)")
    for key in _USAGE_KEYS:
        read_opt_int(v, key, at)
    raise AssertionError("unreachable: a usage field failed and read_opt_int did not say which")


_MODEL_KEYS = frozenset({"provider", "model", "profile"})


def parse_model_ref(v: Any, where: str) -> ModelRef:
    if type(v) is not dict:
        raise fail(where, "model", "an object", v)
    at = where + ".model"
    only(v, _MODEL_KEYS, at)
    return ModelRef(
        read_str(v, "provider", at), read_str(v, "model", at), read_opt_str(v, "profile", at)
    )


def parse_outcome(v: Any, where: str) -> Outcome:
    if type(v) is not dict:
        raise fail(where, "outcome", "an object", v)
    at = where + ".outcome"
    kind = read_enum(v, "kind", at, OUTCOME_KINDS)
    if kind == "error":
        only(v, frozenset({"kind", "code", "message", "retryable"}), at)
        return Outcome(
            "error",
            code=read_str(v, "code", at),
            message=read_str(v, "message", at),
            retryable=read_bool(v, "retryable", at),
        )
    if kind == "aborted":
        only(v, frozenset({"kind", "by"}), at)
        return Outcome("aborted", by=read_str(v, "by", at))
    only(v, frozenset({"kind"}), at)
    return Outcome(kind)


def dump_user_content(content: str | tuple[UserBlock, ...]) -> str | list[JsonObject]:
    return content if isinstance(content, str) else [b.to_json() for b in content]


def dump_blocks(blocks: tuple[AssistantBlock, ...]) -> list[JsonObject]:
    return [b.to_json() for b in blocks]


def dump_value(value: ModelRef | Usage | Outcome) -> JsonObject:
    return value.to_json()


_new_TextBlock = fast_constructor(TextBlock)
_new_ToolCall = fast_constructor(ToolCall)
_new_Usage = fast_constructor(Usage)
