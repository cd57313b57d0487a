"""The scripted model: every end-to-end path runs offline, deterministically, with no key.

A script is ``{"turns": [turn, ...]}``, one turn per model response::

    {"text": "Let me look.",                     optional, streamed in small pieces
     "thinking": "...",                          optional
     "tool_calls": [{"name": "read_file", "input": {"path": "a.txt"}}],   optional
     "stop": "tool_use",                         optional: tool_use with calls, else end_turn
     "usage": {"input": 10, "output": 5},        optional (missing counts are null)
     "delay_ms": 200,                            optional: spread over the stream
     "error": {"status": 429, "message": "slow down"}}   optional: this attempt fails instead

A script may also hold ``"summaries": [turn, ...]``: the answers to compaction requests
(docs/context.md), in order, one per summary asked (an ``error`` entry, or a bad summary, is
consumed by its attempt). Without them a compaction gets a plain scripted summary.

``KISO_FAUX_SCRIPT=<file>`` selects it. The format is a public contract: users script demos and
tests with it. Positions are derived from the log, not kept in memory: the turn a request gets is
the one after the turn the session last committed, so a resumed session continues from the next
unconsumed turn. An ``error`` turn fails one attempt and is consumed by it (the retry gets the next
turn); after a restart, error turns before the next committed turn are replayed, as a real
provider would fail again. A script that runs out ends the run with a clear error.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiso.kernel import TextBlock, ThinkingBlock, ToolCall, Usage, UsageError
from kiso.kernel.events import ASSISTANT_STOPS, AssistantBlock
from kiso.providers.base import (
    ModelRequest,
    ProviderError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    TurnDone,
    retryable_status,
)

__all__ = [
    "KEYLESS_SCRIPT",
    "FauxAdapter",
    "FauxTurn",
    "ScriptError",
    "load_script",
    "parse_script",
]

_TURN_KEYS = frozenset({"text", "thinking", "tool_calls", "stop", "usage", "delay_ms", "error"})


class ScriptError(UsageError):
    """A faux script is malformed; the message names the turn and the key."""


@dataclass(frozen=True, slots=True)
class FauxTurn:
    text: str = ""
    thinking: str = ""
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    stop: str | None = None
    usage: Usage = field(default_factory=Usage)
    delay_ms: int = 0
    error: tuple[int, str] | None = None


def _turn(raw: Any, where: str) -> FauxTurn:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: must be an object")
    unknown = set(raw) - _TURN_KEYS
    if unknown:
        raise ScriptError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"a turn may have {', '.join(sorted(_TURN_KEYS))}"
        )
    text, thinking = raw.get("text", ""), raw.get("thinking", "")
    if not isinstance(text, str) or not isinstance(thinking, str):
        raise ScriptError(f"{where}: text and thinking must be strings")
    calls: list[tuple[str, dict[str, Any]]] = []
    raw_calls = raw.get("tool_calls", [])
    if not isinstance(raw_calls, list):
        raise ScriptError(f"{where}.tool_calls: must be a list of {{name, input}}")
    for i, c in enumerate(raw_calls):
        if (
            not isinstance(c, dict)
            or not isinstance(c.get("name"), str)
            or not isinstance(c.get("input", {}), dict)
            or set(c) - {"name", "input"}
        ):
            raise ScriptError(f'{where}.tool_calls[{i}]: must be {{"name": str, "input": object}}')
        calls.append((c["name"], dict(c.get("input", {}))))
    stop = raw.get("stop")
    if stop is not None and stop not in ASSISTANT_STOPS:
        raise ScriptError(f"{where}.stop: must be one of {', '.join(sorted(ASSISTANT_STOPS))}")
    usage_raw = raw.get("usage", {})
    if not isinstance(usage_raw, dict) or set(usage_raw) - {
        "input",
        "output",
        "cache_read",
        "cache_write",
    }:
        raise ScriptError(
            f"{where}.usage: must be an object of input/output/cache_read/cache_write"
        )
    for k, v in usage_raw.items():
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ScriptError(f"{where}.usage.{k}: must be a non-negative integer or null")
    delay = raw.get("delay_ms", 0)
    if not isinstance(delay, int) or isinstance(delay, bool) or delay < 0:
        raise ScriptError(f"{where}.delay_ms: must be a non-negative integer")
    error = raw.get("error")
    parsed_error: tuple[int, str] | None = None
    if error is not None:
        if (
            not isinstance(error, dict)
            or not isinstance(error.get("status"), int)
            or not isinstance(error.get("message", ""), str)
        ):
            raise ScriptError(f'{where}.error: must be {{"status": int, "message": str}}')
        parsed_error = (error["status"], error.get("message", ""))
    return FauxTurn(
        text=text,
        thinking=thinking,
        tool_calls=tuple(calls),
        stop=stop,
        usage=Usage(**usage_raw),
        delay_ms=delay,
        error=parsed_error,
    )


def parse_script(data: Any, source: str = "faux script") -> tuple[FauxTurn, ...]:
    """Validate a decoded script (its ``turns``; :func:`parse_summaries` reads the rest)."""
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        raise ScriptError(f'{source}: expected {{"turns": [ ... ]}}')
    if set(data) - {"turns", "summaries"}:
        unknown = ", ".join(sorted(set(data) - {"turns", "summaries"}))
        raise ScriptError(f"{source}: unknown key(s) {unknown}; a script has turns and summaries")
    parse_summaries(data, source)
    return tuple(_turn(t, f"{source}: turns[{i}]") for i, t in enumerate(data["turns"]))


def parse_summaries(data: Any, source: str = "faux script") -> tuple[FauxTurn, ...]:
    """The script's answers to compaction requests (``summaries``, optional)."""
    raw = data.get("summaries", []) if isinstance(data, dict) else []
    if not isinstance(raw, list):
        raise ScriptError(f"{source}: summaries must be a list of turns")
    return tuple(_turn(t, f"{source}: summaries[{i}]") for i, t in enumerate(raw))


def load_script(path: str | os.PathLike[str]) -> tuple[FauxTurn, ...]:
    """Read and validate a script file (``KISO_FAUX_SCRIPT``): its turns."""
    return _load(path)[0]


def _load(path: str | os.PathLike[str]) -> tuple[tuple[FauxTurn, ...], tuple[FauxTurn, ...]]:
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(f"cannot read the faux script {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ScriptError(f"the faux script {path} is not UTF-8 text") from None
    try:
        data = json.loads(raw)
        return parse_script(data, str(path)), parse_summaries(data, str(path))
    except RecursionError:
        raise ScriptError(f"the faux script {path} is nested too deeply to read") from None
    except ScriptError:
        raise
    except ValueError as exc:
        raise ScriptError(f"the faux script {path} is not valid JSON: {exc}") from None


class FauxAdapter:
    """A model that plays a script. ``provider`` is ``faux``; ``model`` names the script."""

    provider = "faux"

    def __init__(
        self,
        turns: tuple[FauxTurn, ...] | list[Mapping[str, Any]],
        *,
        model: str = "faux",
        summaries: tuple[FauxTurn, ...] | list[Mapping[str, Any]] = (),
    ):
        ready = tuple(t for t in turns if isinstance(t, FauxTurn))
        self.turns: tuple[FauxTurn, ...] = (
            ready if len(ready) == len(turns) else parse_script({"turns": list(turns)})
        )
        self.model = model
        self._attempts: dict[int, int] = {}
        """Error turns consumed in this process, per committed-turn count."""
        self._committed_positions = [i for i, t in enumerate(self.turns) if t.error is None]
        ready_s = tuple(t for t in summaries if isinstance(t, FauxTurn))
        self.summaries: tuple[FauxTurn, ...] = (
            ready_s
            if len(ready_s) == len(summaries)
            else parse_summaries({"summaries": list(summaries)})
        )
        self._summary_attempts: dict[int, int] = {}

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> FauxAdapter:
        turns, summaries = _load(path)
        return cls(turns, model=f"faux:{Path(path).name}", summaries=summaries)

    def position(self, turn: int) -> int:
        """The script index the next attempt of request ``turn`` plays: the entry after the
        turn-th committed one, plus the error entries this process has consumed since."""
        committed = self._committed_positions
        if turn == 0:
            base = 0
        elif turn <= len(committed):
            base = committed[turn - 1] + 1
        else:
            base = len(self.turns)
        return base + self._attempts.get(turn, 0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if request.options.get("purpose") == "summary":
            async for item in self._summary(request):
                yield item
            return
        index = self.position(request.turn)
        if index >= len(self.turns):
            raise ProviderError(
                f"the faux script has no turn {index + 1} (it has {len(self.turns)}): the scripted "
                f"session is over. Set an API key and a model profile to talk to a real model, "
                f"or add turns to the script.",
                code="script_exhausted",
                retryable=False,
            )
        turn = self.turns[index]
        pieces = _pieces(turn.thinking) + _pieces(turn.text)
        pause = turn.delay_ms / 1000 / max(len(pieces) + 1, 1)
        if turn.error is not None:
            self._attempts[request.turn] = self._attempts.get(request.turn, 0) + 1
            if pause:
                await asyncio.sleep(pause)
            status, message = turn.error
            raise _scripted_error(status, message)
        for piece in _pieces(turn.thinking):
            if pause:
                await asyncio.sleep(pause)
            yield ThinkingDelta(piece)
        for piece in _pieces(turn.text):
            if pause:
                await asyncio.sleep(pause)
            yield TextDelta(piece)
        if pause:
            await asyncio.sleep(pause)
        blocks: list[AssistantBlock] = []
        if turn.thinking:
            blocks.append(ThinkingBlock(turn.thinking))
        if turn.text:
            blocks.append(TextBlock(turn.text))
        for i, (name, args) in enumerate(turn.tool_calls):
            blocks.append(ToolCall(f"call_{index}_{i}", name, dict(args)))
        stop = turn.stop or ("tool_use" if turn.tool_calls else "end_turn")
        yield TurnDone(tuple(blocks), stop, turn.usage, self.model)

    async def _summary(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """A compaction request: the next scripted summary (committed compactions plus the
        attempts this process spent), or a plain one when the script has none."""
        committed = int(request.options.get("summary_index", 0))
        tried = self._summary_attempts.get(committed, 0)
        self._summary_attempts[committed] = tried + 1
        if not self.summaries:
            text = (
                f"## Goal\nThe scripted session's task (summary {committed + 1}).\n"
                f"## Current work\nThe scripted turns so far.\n## Next steps\nThe next turn."
            )
            yield TextDelta(text)
            yield TurnDone((TextBlock(text),), "end_turn", Usage(), self.model)
            return
        index = committed + tried
        if index >= len(self.summaries):
            raise ProviderError(
                f"the faux script has no summary {index + 1} (it has {len(self.summaries)})",
                code="script_exhausted",
                retryable=False,
            )
        turn = self.summaries[index]
        if turn.delay_ms:
            await asyncio.sleep(turn.delay_ms / 1000)
        if turn.error is not None:
            status, message = turn.error
            raise _scripted_error(status, message)
        blocks: list[AssistantBlock] = [TextBlock(turn.text)] if turn.text else []
        for i, (name, args) in enumerate(turn.tool_calls):
            blocks.append(ToolCall(f"summary_{index}_{i}", name, dict(args)))
        if turn.text:
            yield TextDelta(turn.text)
        stop = turn.stop or ("tool_use" if turn.tool_calls else "end_turn")
        yield TurnDone(tuple(blocks), stop, turn.usage, self.model)


def _pieces(text: str, size: int = 12) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _scripted_error(status: int, message: str) -> ProviderError:
    """The error a real provider's response with this status and message would be (a "too
    long" message is a ``context_overflow``, as from a real server)."""
    from kiso.providers.errors import from_status

    error = from_status(status, message or f"scripted error {status}")
    if error.code == "context_overflow":
        return error
    return ProviderError(
        message or f"scripted error {status}",
        status=status,
        code=_code(status),
        retryable=retryable_status(status),
    )


def _code(status: int) -> str:
    return {
        400: "invalid_request",
        401: "auth",
        403: "auth",
        404: "not_found",
        408: "timeout",
        409: "conflict",
        429: "rate_limit",
        529: "overloaded",
    }.get(status, "api_5xx" if status >= 500 else "unknown")


KEYLESS_SCRIPT: tuple[FauxTurn, ...] = parse_script(
    {
        "turns": [
            {
                "text": "This is kiso's keyless mode: a scripted model, so you can see how a "
                "session works before anything is spent. First, a look around.",
                "tool_calls": [{"name": "list_dir", "input": {"path": ".", "depth": 1}}],
            },
            {
                "text": "Reads run without asking. A search, as a model would do before editing:",
                "tool_calls": [{"name": "search_text", "input": {"pattern": "TODO"}}],
            },
            {
                "text": "A shell command asks you first in the default mode (and is denied when "
                "nobody can answer). Every step is on disk before it happens, so `kiso resume` "
                "continues after a crash.",
                "tool_calls": [{"name": "shell", "input": {"command": "git status --short"}}],
            },
            {
                "text": "That is the whole script. The next request has no scripted answer, so "
                "kiso stops here: run `kiso login <provider>` (or export OPENAI_API_KEY or "
                "ANTHROPIC_API_KEY) and select a profile in ~/.kiso/config.json.",
                "tool_calls": [{"name": "list_dir", "input": {"path": ".", "depth": 1}}],
            },
        ]
    },
    "kiso's keyless script",
)
"""What kiso runs with no key and no script: four rounds in one run; the fifth request finds the
script exhausted, so the run ends with an error saying how to set a key (a non-zero exit)."""
