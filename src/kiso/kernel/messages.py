"""Provider-neutral messages: what a model is shown, as derived from the log.

Three roles: ``user`` (text and images), ``assistant`` (text, thinking, tool calls) and ``tool``
(one result per call). Adapters translate these into each provider's wire shape. :func:`to_wire`
gives each message one canonical JSON object, and :func:`dumps_messages` serialises a list the
same way every time, so the same log prefix always yields the same bytes and prompt caches hit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from kiso.kernel._fast import fast_constructor
from kiso.kernel.events import AssistantBlock, UserBlock

__all__ = [
    "AssistantMessage",
    "Message",
    "ToolResultMessage",
    "UserMessage",
    "dumps_message",
    "dumps_messages",
    "to_wire",
]


@dataclass(frozen=True, slots=True)
class UserMessage:
    content: tuple[UserBlock, ...]
    role: ClassVar[str] = "user"


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    blocks: tuple[AssistantBlock, ...]
    role: ClassVar[str] = "assistant"


@dataclass(frozen=True, slots=True)
class ToolResultMessage:
    call_id: str
    name: str
    content: str
    is_error: bool
    role: ClassVar[str] = "tool"


Message: TypeAlias = UserMessage | AssistantMessage | ToolResultMessage


new_assistant_message = fast_constructor(AssistantMessage)
new_tool_result = fast_constructor(ToolResultMessage)


def to_wire(message: Message) -> dict[str, Any]:
    """The canonical JSON object of one message (fixed key order)."""
    if isinstance(message, ToolResultMessage):
        return {
            "role": "tool",
            "call_id": message.call_id,
            "name": message.name,
            "content": message.content,
            "is_error": message.is_error,
        }
    if isinstance(message, AssistantMessage):
        return {"role": "assistant", "content": [b.to_json() for b in message.blocks]}
    return {"role": "user", "content": [b.to_json() for b in message.content]}


def dumps_message(message: Message) -> bytes:
    return json.dumps(to_wire(message), ensure_ascii=False, separators=(",", ":")).encode()


def dumps_messages(messages: Sequence[Message]) -> bytes:
    """A JSON array of the messages; element ``i`` is always exactly ``dumps_message(m[i])``."""
    return b"[" + b",".join(dumps_message(m) for m in messages) + b"]"
