"""How big the context is, and how big it may be: the model's window, the last request's size,
and the rent ledger that ``/context`` shows and ``ctx left ~N%`` is computed from.

**The window**, first found:

1. an explicit setting, the person's word: ``KISO_CONTEXT_WINDOW``, else a profile's
   ``contextWindow`` (or ``Agent(window=…)``);
2. a window *learned* from an endpoint's refusal: a server that says "request (6031 tokens)
   exceeds the available context size (4096 tokens)" has a 4,096-token window whatever the
   registry thinks. Learned windows are kept in ``$KISO_HOME/learned-windows.json``, keyed by
   endpoint and model, so the next start knows;
3. the registry's row for the model (:mod:`kiso.providers.registry`), else 128,000
   (``DEFAULT``; said so in ``/context``).

Within a process a refusal always lowers the window (an explicit one too: the endpoint has
just said it holds less), and the value is recorded; an explicit setting wins again at the
next start, so a learned window can always be raised by setting one.

**The size** of the next request is measured by the provider's own count of the last one
(input, cache reads and writes, plus the output it added to the conversation), plus an estimate
(about four bytes a token) of what was appended since. Where the provider reported no count, or a
compaction replaced the history since, the whole request is estimated, and labelled so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kiso.kernel import Assistant, Compacted, Event, Message
from kiso.kernel.messages import AssistantMessage, ToolResultMessage, UserMessage
from kiso.kernel.values import TextBlock, ThinkingBlock, ToolCall
from kiso.providers.base import ToolSpec
from kiso.providers.registry import DEFAULT, lookup
from kiso.runtime.prompt import estimate_tokens

__all__ = [
    "LEARNED_FILE",
    "Ledger",
    "Measure",
    "MessageSizes",
    "Window",
    "WindowInfo",
    "ledger",
    "measure",
    "message_tokens",
    "parse_request_size",
    "parse_window",
]

LEARNED_FILE = "learned-windows.json"


@dataclass(frozen=True, slots=True)
class WindowInfo:
    tokens: int
    source: str
    """``profile``, ``KISO_CONTEXT_WINDOW``, ``agent``, ``registry``, ``default`` (nothing
    known: assumed) or ``learned``."""

    @property
    def how_to_change(self) -> str:
        """What sets another window, for a message that names this one."""
        return _CHANGE.get(self.source, _OVERRIDE)

    @property
    def says_how_to_change(self) -> bool:
        """Whether :meth:`describe` already says how to set another window."""
        return self.source in ("learned", "default")

    def describe(self) -> str:
        """The size and where it came from; a window kiso assumed or learned also says how to
        override it (an explicit setting wins over both)."""
        said = f"{self.tokens:,} tokens ({_SAID.get(self.source, self.source)})"
        if self.says_how_to_change:
            said += f", which {_OVERRIDERS} overrides"
        return said


_SAID = {
    "profile": "the profile's contextWindow",
    "KISO_CONTEXT_WINDOW": "set by KISO_CONTEXT_WINDOW",
    "agent": "given to the Agent",
    "registry": "kiso's model registry",
    "default": "assumed: the model is not in the registry",
    "learned": "learned from the endpoint's refusal",
}
_OVERRIDERS = "a profile's contextWindow or KISO_CONTEXT_WINDOW"
_OVERRIDE = f"{_OVERRIDERS} overrides it"
_CHANGE = {
    "profile": "KISO_CONTEXT_WINDOW or the profile's contextWindow changes it",
    "KISO_CONTEXT_WINDOW": "KISO_CONTEXT_WINDOW changes it",
    "agent": "Agent(window=…) changes it",
}


class Window:
    """The context window of one model at one endpoint: resolved, and lowered by refusals.

    ``explicit`` (the person's setting) wins over a window learned at an earlier start, which
    wins over the registry; a refusal in this process lowers whichever is in force."""

    def __init__(
        self,
        model: str,
        *,
        explicit: int | None = None,
        key: str | None = None,
        learned_file: Path | None = None,
        explicit_source: str = "profile",
    ) -> None:
        self.model = model
        self.explicit = explicit
        self.explicit_source = explicit_source
        self.key = key or model
        self.learned_file = learned_file
        self._learned: int | None = None
        self._base: WindowInfo | None = None
        self._lock = threading.Lock()
        if learned_file is not None and not explicit:  # the person's word wins over a memory
            value = _read_learned(learned_file).get(self.key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                self._learned = value

    def base(self) -> WindowInfo:
        found = self._base
        if found is None:
            if self.explicit:
                found = WindowInfo(self.explicit, self.explicit_source)
            elif (row := lookup(self.model)) is DEFAULT:
                found = WindowInfo(DEFAULT.context_window, "default")
            else:
                found = WindowInfo(row.context_window, "registry")
            self._base = found
        return found

    def current(self) -> WindowInfo:
        base = self.base()
        learned = self._learned
        if learned is not None and learned < base.tokens:
            return WindowInfo(learned, "learned")
        return base

    @property
    def tokens(self) -> int:
        return self.current().tokens

    def learn(self, tokens: int) -> bool:
        """Record that the endpoint holds at most ``tokens``; whether the window went down."""
        if tokens <= 0 or tokens >= self.tokens:
            return False
        with self._lock:
            self._learned = tokens
            if self.learned_file is not None:
                _write_learned(self.learned_file, self.key, tokens)
        return True


_WINDOW_PATTERNS = (
    re.compile(r"available context size \((\d+) tokens\)", re.I),
    re.compile(r"a (\d+)-token context", re.I),  # our own note on llama.cpp's n_ctx
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"maximum model length (?:is |of )?(\d+)", re.I),
    re.compile(r"context (?:window|length|size) (?:is|of) (\d+)", re.I),
    re.compile(r"\d+ tokens > (\d+) maximum", re.I),  # anthropic: "prompt is too long"
    re.compile(r"n_ctx[\"']?\s*[:=]\s*(\d+)", re.I),
)


def parse_window(message: str) -> int | None:
    """The window an endpoint's "too long" refusal names, if it names one."""
    for pattern in _WINDOW_PATTERNS:
        found = pattern.search(message)
        if found:
            value = int(found.group(1))
            if value > 0:
                return value
    return None


_SIZE_PATTERNS = (
    re.compile(r"request \((\d+) tokens\)", re.I),  # llama.cpp
    re.compile(r"\((\d+) prompt tokens", re.I),  # our own note on llama.cpp's n_prompt_tokens
    re.compile(r"you requested (\d+) tokens", re.I),  # vLLM, OpenAI
    re.compile(r"resulted in (\d+) tokens", re.I),  # OpenAI
    re.compile(r"(\d+) tokens > \d+ maximum", re.I),  # Anthropic
    re.compile(r"prompt \(length (\d+)\)", re.I),  # vLLM
    re.compile(r"prompt length of (\d+)", re.I),  # vLLM
)


def parse_request_size(message: str) -> int | None:
    """The size of the refused request, in the endpoint's own tokens, if its refusal says."""
    for pattern in _SIZE_PATTERNS:
        found = pattern.search(message)
        if found and int(found.group(1)) > 0:
            return int(found.group(1))
    return None


def _read_learned(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}  # a cache: unreadable means nothing learned yet (it is rewritten whole)
    return data if isinstance(data, dict) else {}


def _write_learned(path: Path, key: str, tokens: int) -> None:
    data = _read_learned(path)
    data[key] = tokens
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".learned-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        pass  # the window is still lowered for this process; the file is only a memory


# ------------------------------------------------------------------------------ sizes


def message_tokens(message: Message) -> int:
    """An estimate of one message's tokens (about four bytes a token, plus a little framing)."""
    if isinstance(message, ToolResultMessage):
        return estimate_tokens(message.content) + 8
    if isinstance(message, UserMessage):
        total = 4
        for block in message.content:
            total += estimate_tokens(block.text) if isinstance(block, TextBlock) else 800
        return total
    assert isinstance(message, AssistantMessage)
    total = 4
    for b in message.blocks:
        if isinstance(b, TextBlock | ThinkingBlock):
            total += estimate_tokens(b.text)
        elif isinstance(b, ToolCall):
            total += estimate_tokens(b.name + json.dumps(b.input, ensure_ascii=False)) + 8
    return total


def specs_tokens(specs: Iterable[ToolSpec]) -> int:
    return sum(
        estimate_tokens(s.name + s.description + json.dumps(s.parameters, sort_keys=True)) + 8
        for s in specs
    )


@dataclass(frozen=True, slots=True)
class Measure:
    tokens: int
    estimated: bool
    """True when no provider count covers the request (then the whole of it is estimated)."""
    counted: int | None = None
    """The provider's count of the last request (with its output), when one is used."""

    def describe(self) -> str:
        return f"~{self.tokens:,} tokens" + (" (estimated)" if self.estimated else "")


class MessageSizes:
    """The estimated size of a projection, kept as it grows: a message already counted is not
    counted again (the projection only grows at its end, until a compaction rebuilds it), so
    measuring every round costs the new messages only, not the whole history."""

    __slots__ = ("_count", "_first", "_last", "_total")

    def __init__(self) -> None:
        self._count = 0
        self._total = 0
        self._first: Message | None = None
        self._last: Message | None = None

    def total(self, messages: Sequence[Message]) -> int:
        n = self._count
        if n > len(messages) or (
            n and (messages[0] is not self._first or messages[n - 1] is not self._last)
        ):
            n = self._count = self._total = 0  # rebuilt (a compaction): count it again
        if len(messages) > n:
            self._total += sum(message_tokens(m) for m in messages[n:])
            self._count = len(messages)
            self._first, self._last = messages[0], messages[-1]
        return self._total


def measure(
    events: Sequence[Event],
    messages: Sequence[Message],
    anchors: Sequence[int],
    *,
    system: str | None,
    specs: Sequence[ToolSpec] | int,
    sizes: MessageSizes | None = None,
) -> Measure:
    """The size of the next request: the provider's count of the last request plus what came
    after it; or, when the last turn carries no count, an estimate of the whole of it. Costs the
    messages since the last turn (and, estimating, the new ones: ``sizes`` remembers the rest).
    ``specs``: the tool schemas, or their estimated size."""
    last: Assistant | None = None
    for e in reversed(events):
        if isinstance(e, Compacted):
            break  # the history a count measured is no longer what is sent
        if isinstance(e, Assistant):
            last = e
            break
    if last is not None and (last.usage.input is not None or last.usage.cache_read is not None):
        u = last.usage
        base = (u.input or 0) + (u.cache_read or 0) + (u.cache_write or 0) + (u.output or 0)
        after = 0
        for m, a in zip(reversed(messages), reversed(anchors), strict=True):
            if a > last.seq or (a == last.seq and isinstance(m, ToolResultMessage)):
                after += message_tokens(m)
            else:
                break
        return Measure(base + after, False, base)
    schemas = specs if isinstance(specs, int) else specs_tokens(specs)
    history = sizes.total(messages) if sizes is not None else sum(map(message_tokens, messages))
    return Measure(estimate_tokens(system or "") + schemas + history, True)


# ------------------------------------------------------------------------------ the ledger


@dataclass(frozen=True, slots=True)
class Ledger:
    """The rent of the next request by part, in tokens (``/context``)."""

    parts: tuple[tuple[str, int], ...]
    total: int
    measured: bool
    """The total is the provider's count (the parts are split from it by estimate)."""
    window: WindowInfo

    @property
    def left_percent(self) -> int:
        return max(0, min(100, round(100 - self.total * 100 / max(self.window.tokens, 1))))

    def rows(self) -> list[str]:
        width = max((len(name) for name, _ in self.parts), default=0)
        out = [f"{name.ljust(width)}  {tokens:>9,}" for name, tokens in self.parts]
        how = "the provider's count of the last request" if self.measured else "estimated"
        out.append(f"{'total'.ljust(width)}  {self.total:>9,}  ({how})")
        out.append(f"window {self.window.describe()} · ctx left ~{self.left_percent}%")
        return out


def ledger(
    *,
    events: Sequence[Event],
    messages: Sequence[Message],
    anchors: Sequence[int],
    system: str | None,
    specs: Sequence[ToolSpec],
    window: WindowInfo,
    appends: Mapping[str, str] | None = None,
) -> Ledger:
    """Split the next request into its parts: the system prompt (less each extension's append,
    shown on its own), the tool schemas, the summary, the messages and the tool results."""
    text = system or ""
    parts: list[tuple[str, int]] = []
    appended = 0
    for name, append in (appends or {}).items():
        if append and append in text:
            tokens = estimate_tokens(append)
            appended += tokens
            parts.append((f"extension {name}", tokens))
    parts.insert(0, ("system prompt", max(estimate_tokens(text) - appended, 0)))
    parts.insert(1, ("tool schemas", specs_tokens(specs)))
    summary = chat = results = 0
    covered = {e.seq for e in events if isinstance(e, Compacted)}
    for m, a in zip(messages, anchors, strict=True):
        n = message_tokens(m)
        if isinstance(m, ToolResultMessage):
            results += n
        elif isinstance(m, UserMessage) and a in covered:
            summary += n
        else:
            chat += n
    parts += [("summary", summary), ("messages", chat), ("tool results", results)]
    estimate = sum(n for _, n in parts)
    size = measure(events, messages, anchors, system=system, specs=specs)
    if not size.estimated and estimate > 0:
        scale = size.tokens / estimate
        scaled = [(name, round(n * scale)) for name, n in parts]
        return Ledger(tuple(scaled), size.tokens, True, window)
    return Ledger(tuple(parts), estimate, False, window)
