"""Translation of a :class:`ModelRequest` into the Anthropic Messages API's request parameters.

Pure functions over plain dicts (no SDK import), so the same request always yields equal
parameters, and so the same body bytes: prompt caches hit, and tests can compare bodies.

* ``system`` is a string; with prompt caching, one text block marked ``cache_control``.
* User text and images become content blocks (an image is a ``base64`` or a ``url`` source).
* Assistant blocks keep their order: ``thinking`` (replayed exactly, text and signature; an
  unsigned one is dropped, the API rejects it), ``text``, ``tool_use``. Empty text is dropped.
* Tool results become ``tool_result`` blocks in a user message. Messages of the same role merge,
  so roles alternate; in a merged user message the tool results come first, as the API requires.
* With prompt caching, three ``cache_control`` marks: the system block, the last tool, and the
  last content block of the last message. Without it, no mark anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kiso.kernel import (
    AssistantMessage,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from kiso.providers.base import ModelRequest, ToolSpec

__all__ = ["EPHEMERAL", "build_params", "max_tokens_for", "to_messages", "to_tools"]

EPHEMERAL = {"type": "ephemeral"}

JsonObj = dict[str, Any]


def build_params(
    request: ModelRequest,
    *,
    model: str,
    max_output_tokens: int,
    prompt_caching: bool,
    thinking_budget: int | None,
) -> JsonObj:
    """The keyword arguments of ``messages.create`` (without ``stream``)."""
    params: JsonObj = {
        "model": model,
        "max_tokens": max_tokens_for(max_output_tokens, thinking_budget),
        "messages": to_messages(request.messages, prompt_caching=prompt_caching),
    }
    if request.system:
        if prompt_caching:
            params["system"] = [
                {"type": "text", "text": request.system, "cache_control": dict(EPHEMERAL)}
            ]
        else:
            params["system"] = request.system
    if request.tools:
        params["tools"] = to_tools(request.tools, prompt_caching=prompt_caching)
    if thinking_budget is not None:
        params["thinking"] = {"type": "enabled", "budget_tokens": thinking_budget}
    return params


def max_tokens_for(max_output_tokens: int, thinking_budget: int | None) -> int:
    """``max_output_tokens``; with a thinking budget that does not fit under it, budget + reply."""
    if thinking_budget is None or max_output_tokens > thinking_budget:
        return max_output_tokens
    return thinking_budget + max_output_tokens


def to_tools(tools: Sequence[ToolSpec], *, prompt_caching: bool = False) -> list[JsonObj]:
    out: list[JsonObj] = [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]
    if prompt_caching and out:
        out[-1]["cache_control"] = dict(EPHEMERAL)
    return out


def to_messages(messages: Sequence[Message], *, prompt_caching: bool = False) -> list[JsonObj]:
    """Alternating ``user``/``assistant`` messages, each with a non-empty content list."""
    out: list[JsonObj] = []
    for message in messages:
        if isinstance(message, ToolResultMessage):
            role, blocks = "user", [_tool_result(message)]
        elif isinstance(message, AssistantMessage):
            role, blocks = "assistant", _assistant_blocks(message)
        else:
            role, blocks = "user", _user_blocks(message)
        if not blocks:
            continue  # nothing the API would accept (e.g. only unsigned thinking)
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for wire in out:
        if wire["role"] == "user":
            content = wire["content"]
            results = [b for b in content if b["type"] == "tool_result"]
            if results and len(results) != len(content):
                wire["content"] = results + [b for b in content if b["type"] != "tool_result"]
    if prompt_caching and out:
        last = out[-1]["content"]
        # a thinking block cannot carry a cache mark; mark the last block that can
        for block in reversed(last):
            if block["type"] != "thinking":
                block["cache_control"] = dict(EPHEMERAL)
                break
    return out


def _user_blocks(message: UserMessage) -> list[JsonObj]:
    out: list[JsonObj] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            if block.text:
                out.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            out.append(_image(block))
    return out


def _image(block: ImageBlock) -> JsonObj:
    if block.data is not None:
        source: JsonObj = {"type": "base64", "media_type": block.media_type, "data": block.data}
    else:
        source = {"type": "url", "url": block.url}
    return {"type": "image", "source": source}


def _assistant_blocks(message: AssistantMessage) -> list[JsonObj]:
    out: list[JsonObj] = []
    for block in message.blocks:
        if isinstance(block, ThinkingBlock):
            if block.signature:  # the API rejects thinking it cannot verify
                out.append(
                    {"type": "thinking", "thinking": block.text, "signature": block.signature}
                )
        elif isinstance(block, TextBlock):
            if block.text:
                out.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolCall):
            out.append(
                {"type": "tool_use", "id": block.call_id, "name": block.name, "input": block.input}
            )
    return out


def _tool_result(message: ToolResultMessage) -> JsonObj:
    return {
        "type": "tool_result",
        "tool_use_id": message.call_id,
        "content": message.content,
        "is_error": message.is_error,
    }
