"""Context relief: a summary replaces older history, as one durable ``compacted`` event.

When (docs/context.md):

* past half the window (at most 400K tokens) at the next round that ends a phase: a new turn
  began, the checks ran (a ``shell`` call), the edits finished or the reading finished (the
  previous round edited, or read, and this one did not);
* past 80% (at most 700K) at the next round, whatever it is;
* when the provider refuses the context anyway (``context_overflow``): once, then the request is
  retried once;
* on demand: ``/compact [focus]`` (:meth:`kiso.runtime.session.Session.compact`).

What stays verbatim: the most recent tenth of the window (at most 100K) of messages; every user
input no earlier summary covered and every write/edit result (both copied, word for word, after
the model's summary). Covered events stay on disk; only the projection changes, and since the
boundary is a persisted fact a resume replays to the byte-identical projection.

The summary is asked of the run's own model on the run's own prefix (the same system prompt,
tools and messages, so a prompt cache hits) followed by a fixed instruction. When that prefix no
longer fits the window (the refusal case), the history is sent instead as one clipped transcript.
A summary that is empty, carries tool calls or tool-call markup, or continues the work instead of
summarizing it is rejected and nothing is written; three failures in a row turn auto-compaction
off for the session (``/compact`` still works, and a success turns it back on).
"""

from __future__ import annotations

import asyncio
import json
import re
import unicodedata
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiso.kernel import Assistant, Compacted, Event, ExecutionFinished, Message, User
from kiso.kernel.events import CompactionTrigger, RunStarted
from kiso.kernel.messages import AssistantMessage, ToolResultMessage, UserMessage
from kiso.kernel.values import TextBlock, ToolCall
from kiso.providers.base import ModelRequest, ProviderError, ToolSpec, TurnDone
from kiso.runtime import stream as ev
from kiso.runtime.context import (
    Measure,
    measure,
    message_tokens,
    parse_request_size,
    parse_window,
    specs_tokens,
)
from kiso.runtime.prompt import estimate_tokens
from kiso.tools.base import AbortSignal, Effects

if TYPE_CHECKING:
    from kiso.runtime.session import Session

__all__ = [
    "MAX_FAILURES",
    "SUMMARY_INSTRUCTION",
    "Cut",
    "Thresholds",
    "check_summary",
    "compact",
    "maybe_compact",
    "phase_ended",
    "plan_cut",
]

MAX_FAILURES = 3
"""Failed summaries in a row after which auto-compaction stops for the session."""

SUMMARY_INSTRUCTION = """\
[kiso: context compaction] Stop the task for a moment. Do not call any tool and do not continue \
the work: write a summary of the conversation above, which will replace it. The most recent \
messages are kept verbatim after your summary, and so are the user's own words and the results \
of every file write and edit, so do not copy those out. Write plain text under these headings:

## Goal
## Constraints
## User requests
## Files and changes
## Errors and fixes
## Current work
## Next steps

Be specific: paths, names, commands, decisions and why. Output only the summary."""

VERBATIM_HEADER = "## Kept verbatim from the summarized part"

_TOOL_MARKUP = re.compile(
    r"<tool_call>|</?function_calls>|<invoke\b|<tool_use\b|\[TOOL_CALLS\]|<\|tool_call|"
    r"\"tool_calls\"\s*:|\"type\"\s*:\s*\"(?:tool_use|function_call)\"|<\|python_tag\|>|"
    r"<function=[\w.-]+>|"  # Llama's <function=shell>{...}</function>
    r"\"name\"\s*:\s*\"[^\"\n]*\"\s*,\s*\"(?:arguments|parameters)\"\s*:|"  # a JSON call
    r"\"function\"\s*:\s*\{\s*\"name\"",
    re.IGNORECASE,
)
_ACK = r"(?:(?:sure|okay|ok|alright|great|got it|right|understood)[,.!]?\s+)"
_THEN = r"(?:(?:first|now|next|then)\b,?\s*)"
_DOING = (
    r"(?:running|checking|reading|looking|opening|searching|writing|editing|fixing|starting|"
    r"continuing|proceeding|executing|applying|trying|calling|creating|updating|installing|"
    r"building|testing|going|moving|implementing|adding|removing|investigating)\b"
)
_CONTINUES = re.compile(
    rf"^(?!.*\bsummar)(?:{_ACK}?{_THEN}?"
    r"(?:i'll|i will|let me|let's|now i|next,? i|i am going to|i'm going to)\b"
    # "OK, running the tests.": an acknowledgement, then the work it is doing (a verb of work:
    # "Okay, according to the user…" and "Understood. Remaining work…" are summaries)
    rf"|{_ACK}{_THEN}?{_DOING})",
    re.IGNORECASE,
)
_THINK = re.compile(r"<(think|thinking)>.*?(?:</\1>|\Z)", re.IGNORECASE | re.DOTALL)
_FENCED = re.compile(r"^[ \t]*(```+|~~~+)[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
"""A fenced code block (to its closing fence, or the end of the text)."""
_INLINE_CODE = re.compile(r"(?<!`)(`{1,2})(?!`)[^\n]+?(?<!`)\1(?!`)")
"""A code span (`` `x` ``, ``` ``x`` ```)."""
_HEADING = re.compile(r"(?:#{1,6}\s*|\*\*|__)(?P<title>[^*_#:]*?)[ \t]*:?[ \t]*(?:\*\*|__)?:?")
_TEMPLATE = frozenset(
    line[3:].lower() for line in SUMMARY_INSTRUCTION.splitlines() if line.startswith("## ")
)
"""The headings the instruction asks for: a summary of only these says nothing."""
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'", "\u201c": '"', "\u201d": '"'})


def _plain(text: str) -> str:
    """The text as judged: compatibility forms folded (a fullwidth less-than is ``<``), curly quotes
    straight, invisible format characters (zero-width spaces, joiners) gone."""
    folded = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    return "".join(c for c in folded if unicodedata.category(c) != "Cf")


@dataclass(frozen=True, slots=True)
class Thresholds:
    soft: int
    """Compact at the next round that ends a phase past this many tokens."""
    hard: int
    """Compact at the next round, whatever it is, past this many tokens."""
    keep: int
    """Tokens of the most recent messages kept verbatim."""

    @classmethod
    def of(cls, window: int) -> Thresholds:
        return cls(
            soft=min(window // 2, 400_000),
            hard=min(window * 4 // 5, 700_000),
            keep=min(window // 10, 100_000),
        )


# ------------------------------------------------------------------------------ when


def phase_ended(events: Sequence[Event], effects: Mapping[str, Effects]) -> bool:
    """Whether the round about to start follows the end of a phase (see the module doc)."""
    last: Assistant | None = None
    previous: Assistant | None = None
    for e in reversed(events):
        if isinstance(e, User) and last is None:
            return True  # a new turn began: the model has not answered this input yet
        if isinstance(e, RunStarted) and last is None:
            return True
        if isinstance(e, Assistant):
            if last is None:
                last = e
            else:
                previous = e
                break
    if last is None:
        return True

    def kinds(turn: Assistant | None) -> set[str]:
        out: set[str] = set()
        for call in turn.calls if turn is not None else ():
            effect = effects.get(call.name)
            if effect is Effects.SHELL:
                out.add("check")
            elif effect is Effects.EDIT:
                out.add("edit")
            elif effect is Effects.READ:
                out.add("read")
        return out

    now, before = kinds(last), kinds(previous)
    if "check" in now:
        return True
    return ("edit" in before and "edit" not in now) or ("read" in before and "read" not in now)


# ------------------------------------------------------------------------------ where


@dataclass(frozen=True, slots=True)
class Cut:
    covers_to_seq: int
    covered: int
    """How many messages of the projection the summary replaces."""
    verbatim: str
    """What is copied after the summary, word for word (may be empty)."""


def plan_cut(
    events: Sequence[Event],
    messages: Sequence[Message],
    anchors: Sequence[int],
    *,
    covers: int,
    keep: int,
    window: int,
    edits: frozenset[str],
    below: int | None = None,
) -> Cut | None:
    """Where the summary ends: the newest boundary that leaves at most ``keep`` tokens of
    messages after it, and lies before seq ``below`` when given (the open turn's input, which a
    summary at a threshold never replaces). None when there is nothing to replace."""
    kept = 0
    first = len(messages)
    while first > 0:
        n = message_tokens(messages[first - 1])
        if kept + n > keep:
            break
        kept += n
        first -= 1
    if below is not None:
        while first > 0 and anchors[first - 1] >= below:
            first -= 1
    if first == 0:
        return None
    boundary = anchors[first - 1]
    dropped = [i for i, a in enumerate(anchors) if a <= boundary]
    compactions = {e.seq for e in events if isinstance(e, Compacted)}
    if all(anchors[i] in compactions for i in dropped):
        return None  # only an earlier summary would go: nothing new to summarize
    return Cut(boundary, len(dropped), _verbatim(events, covers, boundary, window, edits))


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    note = f"[… {cut:,} characters omitted here; the whole text is in the log …]"
    return f"{text[:head]}\n{note}\n{text[-tail:]}"


def _verbatim(
    events: Sequence[Event], covers: int, boundary: int, window: int, edits: frozenset[str]
) -> str:
    """The user inputs in (covers, boundary] and every write/edit result up to the boundary."""
    budget = max(window // 4, 256) * 4  # characters
    per_input = max(window // 8, 200) * 4
    inputs: list[str] = []
    calls: dict[str, ToolCall] = {}
    results: list[str] = []
    for e in events:
        if e.seq > boundary:
            break
        if isinstance(e, User) and e.seq > covers:
            inputs.append(_clip(e.text, per_input))
        elif isinstance(e, Assistant):
            for call in e.calls:
                if call.name in edits:
                    calls[call.call_id] = call
        elif isinstance(e, ExecutionFinished) and e.call_id in calls:
            call = calls[e.call_id]
            target = call.input.get("path")
            where = f" {target}" if isinstance(target, str) else ""
            results.append(f"- {call.name}{where}: {_clip(e.content.strip(), 400)}")
    parts: list[str] = []
    if inputs:
        parts.append("User inputs (verbatim):")
        parts += [f"> {line}" for text in inputs for line in text.splitlines() or [""]]
    if results:
        parts.append("File writes and edits (their results, verbatim):")
        parts += results
    if not parts:
        return ""
    text = "\n".join(parts)
    if len(text) > budget:
        text = _clip(text, budget)
    return f"{VERBATIM_HEADER}\n\n{text}"


# ------------------------------------------------------------------------------ the summary


def check_summary(blocks: Sequence[object]) -> tuple[str | None, str]:
    """``(why it is rejected or None, the summary text)`` for a summary turn's blocks.

    A reasoning model's ``<think>`` blocks are not summary: they are dropped before judging (and
    from the text). Rejected: a tool call; nothing with a letter or digit in it; only the
    instruction's headings; tool-call markup in the prose (markup inside code, a fenced block or
    a code span, is a summary discussing it, unless the summary is nothing but that code); an
    opening that carries on with the work ("Let me…", "OK, running the tests")."""
    raw = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    text = _THINK.sub("", raw).strip()
    if any(isinstance(b, ToolCall) for b in blocks):
        return "the model called a tool instead of summarizing", text
    plain = _plain(text)
    if not any(c.isalnum() for c in plain):
        return "the summary was empty", text
    lines = [line.strip() for line in plain.splitlines() if line.strip()]
    if all(_is_template_heading(line) for line in lines):
        return "the summary was empty: headings with nothing under them", text
    prose = _INLINE_CODE.sub("", _FENCED.sub("", plain))
    if _TOOL_MARKUP.search(prose):
        return "the summary carries tool-call markup", text
    if not any(c.isalnum() for c in prose) and _TOOL_MARKUP.search(plain):
        return (
            "the summary carries tool-call markup and nothing else (a call in a code block)",
            text,
        )
    if _CONTINUES.match(lines[0].lstrip("#*> \t")):
        return "the model continued the work instead of summarizing it", text
    return None, text


def _is_template_heading(line: str) -> bool:
    """A heading line that is one of the instruction's headings and nothing more."""
    found = _HEADING.fullmatch(line)
    return found is not None and found.group("title").strip().lower() in (_TEMPLATE | {""})


def _transcript(messages: Sequence[Message], budget_tokens: int) -> str:
    """The history as plain text for a summary request the prefix no longer fits."""
    lines: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage):
            text = " ".join(b.text if isinstance(b, TextBlock) else "[image]" for b in m.content)
            lines.append(f"[user] {text}")
        elif isinstance(m, AssistantMessage):
            for b in m.blocks:
                if isinstance(b, TextBlock):
                    lines.append(f"[assistant] {b.text}")
                elif isinstance(b, ToolCall):
                    args = _clip(json.dumps(b.input, ensure_ascii=False), 300)
                    lines.append(f"[assistant called {b.name}] {args}")
        elif isinstance(m, ToolResultMessage):
            lines.append(f"[{m.name} result] {_clip(m.content, 2000)}")
    # At three bytes a token, not four: code and markdown tokenize denser than prose, and a
    # transcript is only sent when the window is already tight.
    return _clip("\n".join(lines), max(budget_tokens, 64) * 3)


def summary_request(
    *,
    system: str | None,
    messages: Sequence[Message],
    specs: Sequence[ToolSpec],
    window: int,
    turn: int,
    index: int,
    focus: str | None,
    transcript: bool = False,
    scale: float = 1.0,
) -> ModelRequest:
    """The prefix and the instruction (or, when the prefix does not fit or ``transcript`` is
    asked for, the history as one clipped transcript)."""
    instruction = SUMMARY_INSTRUCTION + (f"\n\nFocus the summary on: {focus}" if focus else "")
    reserve = min(4_000, window // 8)  # the summary's own output
    fixed = estimate_tokens(system or "") + estimate_tokens(instruction) + 16
    prefix = fixed + specs_tokens(specs) + sum(message_tokens(m) for m in messages)
    options = {"purpose": "summary", "summary_index": index}
    if not transcript and prefix + reserve <= window:
        ask = UserMessage((TextBlock(instruction),))
        return ModelRequest(system, (*messages, ask), tuple(specs), turn, options, reserve)
    room = int((window - fixed - reserve - 64) * scale)
    guard = (
        "The conversation so far is quoted between the markers below (as a transcript; some of "
        "it is shortened). Summarize it; do not continue it and do not call tools."
    )
    body = f"{guard}\n\n<<<conversation\n{_transcript(messages, room)}\nconversation>>>\n\n"
    ask = UserMessage((TextBlock(body + instruction),))
    return ModelRequest(system, (ask,), (), turn, {**options, "transcript": True}, reserve)


async def _ask(session: Session, request: ModelRequest, abort: AbortSignal | None) -> TurnDone:
    agent = session.agent
    iterator = agent.adapter.stream(request).__aiter__()
    done: TurnDone | None = None
    try:
        while True:
            if abort is not None and abort.is_set():
                raise asyncio.CancelledError
            try:
                item = await asyncio.wait_for(iterator.__anext__(), agent.idle_timeout)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise ProviderError(
                    f"the model sent nothing for {agent.idle_timeout:g} s", code="timeout"
                ) from None
            if isinstance(item, TurnDone):
                done = item
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
    if done is None:
        raise ProviderError("the summary's stream ended without a stop", code="incomplete_stream")
    return done


def last_run(events: Sequence[Event]) -> str | None:
    for e in reversed(events):
        if isinstance(e, RunStarted):
            return e.run
    return None


async def compact(
    session: Session,
    run_id: str,
    *,
    trigger: CompactionTrigger,
    focus: str | None = None,
    abort: AbortSignal | None = None,
    keep_input: bool = False,
) -> AsyncIterator[ev.RunEvent]:
    """Summarize and commit one ``compacted`` event (yield ``compaction``), or yield
    ``compaction_failed`` and write nothing. ``keep_input``: a user input the model has not
    answered yet stays a message of its own (a threshold never summarizes away the request
    about to be sent; a refusal may have to)."""
    agent = session.agent
    fold = session.fold
    window = agent.window.tokens
    limits = Thresholds.of(window)
    system = session.system_prompt
    specs = agent.tool_specs()
    size = _measure(session)
    edits = frozenset(n for n, t in agent.tools.items() if t.effects is Effects.EDIT)
    keep = limits.keep
    if trigger == "manual":  # asked for: relief even when the history is short of a tenth
        keep = min(keep, sum(message_tokens(m) for m in fold.messages) // 4)
    cut = plan_cut(
        session.events,
        fold.messages,
        fold.anchors,
        covers=fold.covers,
        keep=keep,
        window=window,
        edits=edits,
        below=_newest_input(session.events) if keep_input else None,
    )
    if cut is None:
        yield ev.CompactionFailed(
            "nothing to compact: the history fits in what is kept verbatim",
            session.compaction_failures,
            session.auto_compact_off,
            counted=False,
        )
        return
    index = sum(1 for e in session.events if isinstance(e, Compacted))
    why: str | None = None
    text = ""
    done: TurnDone | None = None
    transcript, scale = False, 1.0
    for attempt in range(3):  # the prefix; a transcript; a smaller transcript
        request = summary_request(
            system=system,
            messages=fold.messages,
            specs=specs,
            window=agent.window.tokens,
            turn=fold.turns,
            index=index,
            focus=focus,
            transcript=transcript,
            scale=scale,
        )
        try:
            done = await _ask(session, request, abort)
        except ProviderError as exc:
            why = f"the summary request failed: {exc.message}"
            if exc.code != "context_overflow" or attempt == 2:
                break
            learned = parse_window(exc.message)
            if learned is not None:
                agent.window.learn(learned)
            if request.options.get("transcript"):  # shrink it by what the endpoint counted
                sent = parse_request_size(exc.message)
                if sent is None:
                    break
                scale *= agent.window.tokens / sent * 0.85
            transcript = True
            continue
        why, text = check_summary(done.blocks)
        break
    if why is not None:
        session.compaction_failures += 1
        if trigger == "auto" and session.compaction_failures >= MAX_FAILURES:
            session.auto_compact_off = True
        yield ev.CompactionFailed(why, session.compaction_failures, session.auto_compact_off)
        return
    summary = f"{text}\n\n{cut.verbatim}" if cut.verbatim else text
    kept = [m for m, a in zip(fold.messages, fold.anchors, strict=True) if a > cut.covers_to_seq]
    after = estimate_tokens(system or "") + specs_tokens(specs)
    after += message_tokens(UserMessage((TextBlock(summary),)))
    after += sum(message_tokens(m) for m in kept)
    (event,) = session.stage(
        Compacted(
            run=run_id,
            covers_to_seq=cut.covers_to_seq,
            summary=summary,
            trigger=trigger,
            tokens_before=size.tokens,
            tokens_after=after,
            model=done.model if done is not None else None,
            usage=done.usage if done is not None else None,
        )
    )
    await session.committed()
    session.compaction_failures = 0
    session.auto_compact_off = False
    assert isinstance(event, Compacted)
    agent.hooks.on_compaction(event, session.run_info(run_id))
    yield ev.Compaction(event, cut.covered, size.estimated)


def _newest_input(events: Sequence[Event]) -> int | None:
    """The seq of a user input the model has not answered yet (it began this turn), if any."""
    for e in reversed(events):
        if isinstance(e, User):
            return e.seq
        if isinstance(e, Assistant | RunStarted):
            return None
    return None


def _measure(session: Session) -> Measure:
    fold = session.fold
    return measure(
        session.events,
        fold.messages,
        fold.anchors,
        system=session.system_prompt,
        specs=session.agent.specs_tokens,
        sizes=session.message_sizes,
    )


async def maybe_compact(
    session: Session, run_id: str, abort: AbortSignal | None
) -> AsyncIterator[ev.RunEvent]:
    """Auto-compaction at a round's head: past the hard threshold, or past the soft one when a
    phase just ended."""
    agent = session.agent
    if not agent.auto_compact or session.auto_compact_off:
        return
    limits = Thresholds.of(agent.window.tokens)
    size = _measure(session)
    if size.tokens < limits.soft:
        return
    if size.tokens < limits.hard:
        effects = {n: t.effects for n, t in agent.tools.items()}
        if not phase_ended(session.events, effects):
            return
    async for item in compact(session, run_id, trigger="auto", abort=abort, keep_input=True):
        if isinstance(item, ev.CompactionFailed) and not item.counted:
            continue  # nothing to replace: not worth a line every round
        yield item
