"""What the interactive session prints: the colour policy, markdown, tool cards and records, the
status row. Pure functions of what the session already knows; nothing here asks the model.

Colour is reserved for three meanings: green for a diff's additions, red for errors, yellow for
warnings. ``NO_COLOR`` (any value) keeps bold and reverse but drops every colour; a stdout that is
not a terminal gets plain text with no escape code at all.
"""

from __future__ import annotations

import asyncio
import difflib
import io
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from markdown_it.token import Token
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.default_styles import DEFAULT_STYLES
from rich.markdown import CodeBlock, Markdown, MarkdownElement
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from rich.theme import Theme

from kiso.kernel import (
    ApprovalDecided,
    Assistant,
    Compacted,
    Event,
    ExecutionFinished,
    ImageBlock,
    RunEnded,
    RunStarted,
    ToolCall,
    User,
)
from kiso.providers.registry import cost, lookup
from kiso.runtime.prompt import estimate_tokens
from kiso.tools import resolve_in_workspace

from .theme import UNKNOWN, Palette

__all__ = [
    "COMMANDS",
    "CURSOR",
    "KEYS",
    "MODE_HELP",
    "PROMPT",
    "Meter",
    "Policy",
    "Printer",
    "StreamText",
    "Streamed",
    "age",
    "copy_sequence",
    "diff_view",
    "duration",
    "error_text",
    "help_view",
    "last_view",
    "markdown",
    "meter",
    "modes_view",
    "prompt_echo",
    "record_text",
    "report",
    "running_card",
    "shorten_end",
    "shorten_middle",
    "spend",
    "status_row",
    "target_of",
    "transcript",
    "warning_text",
    "working_row",
    "wrap",
    "wrap_fragments",
    "write",
]

ERROR, WARNING, ADDED = "kiso.error", "kiso.warning", "kiso.added"
"""The three colours, as style names: the palette (:mod:`kiso.cli.theme`) gives their shades."""
PROMPT = "\u203a "
"""The input's mark (a single right-pointing angle quote)."""
CURSOR = "\u276f "
"""The highlight's mark in panels and the picker."""


@dataclass(frozen=True, slots=True)
class Policy:
    """Where escape codes may go: ``ansi`` (stdout is a terminal), ``color`` (and no NO_COLOR)."""

    ansi: bool
    color: bool

    @classmethod
    def detect(cls) -> Policy:
        try:
            tty = sys.stdout.isatty()
        except (AttributeError, ValueError):
            tty = False
        return cls(ansi=tty, color=tty and "NO_COLOR" not in os.environ)


def _mono(style: Style | str) -> Style:
    s = Style.parse(style) if isinstance(style, str) else style
    return Style(bold=s.bold, italic=s.italic, underline=s.underline, strike=s.strike)


MONO_STYLES = {k: _mono(v) for k, v in DEFAULT_STYLES.items() if k.startswith("markdown.")}
"""Rich's markdown styles without their colours: the interface is monochrome."""


class _PlainCode(CodeBlock):
    """A fenced code block as plain indented text: no syntax colours, no background."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Padding(Text(str(self.text).rstrip("\n")), (0, 0, 0, 4))


class _Markdown(Markdown):
    """Markdown as the model wrote it: its single line breaks stay line breaks (a four-line
    poem stays four lines), which CommonMark would join into one paragraph line."""

    elements: ClassVar[dict[str, type[MarkdownElement]]] = {
        **Markdown.elements,
        "fence": _PlainCode,
        "code_block": _PlainCode,
    }

    def __init__(self, markup: str, **kwargs: Any) -> None:
        super().__init__(markup, **kwargs)
        _hard_breaks(self.parsed)


def _hard_breaks(tokens: list[Token]) -> None:
    for token in tokens:
        if token.type == "softbreak":
            token.type = "hardbreak"
        if token.children:
            _hard_breaks(token.children)


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def report(task: asyncio.Future[None]) -> None:
    """Done-callback of a fire-and-forget task: a failure is said, not swallowed."""
    exc = None if task.cancelled() else task.exception()
    if exc is not None:
        print(f"kiso: {type(exc).__name__}: {exc}", file=sys.stderr)


class _Block:
    """A renderable after exactly one blank line, its own leading blank lines dropped."""

    def __init__(self, inner: RenderableType) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = console.render_lines(self.inner, options, pad=False)
        while lines and not "".join(seg.text for seg in lines[0]).strip():
            lines.pop(0)
        yield Segment.line()
        for line in lines:
            yield from line
            yield Segment.line()


def markdown(text: str) -> RenderableType:
    """A finished block of answer text, after a blank line."""
    return _Block(_Markdown(text, hyperlinks=False))


def prompt_echo(text: str) -> Text:
    """What the person sent, as the transcript keeps it."""
    return Text(PROMPT + text.replace("\n", "\n  "), style="bold")


def error_text(message: str) -> Text:
    return Text(message, style=ERROR)


def warning_text(message: str) -> Text:
    return Text(message, style=WARNING)


_TRAILING = re.compile(r"[ ]+((?:\x1b\[[0-9;]*m)*)\n")
"""Spaces rich pads a line with, before its newline (and any closing style codes)."""


class Printer:
    """Renders rich renderables to the string the terminal gets."""

    def __init__(self, policy: Policy, palette: Palette = UNKNOWN) -> None:
        self.policy = policy
        self.palette = palette
        self.theme = Theme({**MONO_STYLES, **palette.rich_styles})

    def render(self, renderable: RenderableType, width: int) -> str:
        buf = io.StringIO()
        console = Console(
            file=buf,
            width=max(width, 20),
            force_terminal=self.policy.ansi,
            color_system="standard" if self.policy.ansi else None,
            no_color=not self.policy.color,
            highlight=False,
            markup=False,
            emoji=False,
            theme=self.theme,
            legacy_windows=False,
            force_jupyter=False,
            force_interactive=False,
        )
        console.print(renderable)
        return _TRAILING.sub(r"\1\n", buf.getvalue())


# --------------------------------------------------------------------------------------------
# streaming text


_FENCE = re.compile(r"^\s*(```|~~~)", re.MULTILINE)


class StreamText:
    """Answer text as it streams: finished paragraphs go to the scrollback, the rest stays live.

    A paragraph is finished at a blank line outside a code fence.
    """

    def __init__(self) -> None:
        self.pending = ""

    def feed(self, text: str) -> list[str]:
        self.pending += text
        done: list[str] = []
        while True:
            cut = self._cut()
            if cut is None:
                return done
            block, self.pending = self.pending[:cut], self.pending[cut:].lstrip("\n")
            if block.strip():
                done.append(block.rstrip("\n"))

    def _cut(self) -> int | None:
        start = 0
        while True:
            found = self.pending.find("\n\n", start)
            if found < 0:
                return None
            fences = len(_FENCE.findall(self.pending[:found]))
            if fences % 2 == 0:
                return found
            start = found + 2

    def flush(self) -> str:
        rest, self.pending = self.pending.strip("\n"), ""
        return rest


# --------------------------------------------------------------------------------------------
# word wrapping, for what prompt_toolkit shows (rich wraps what goes to the scrollback)


Fragments = list[tuple[str, str]]
_TOKENS = re.compile(r"\n|[^\S\n]+|\S+")


def wrap_fragments(fragments: Iterable[tuple[str, str]], width: int, hang: int = 0) -> Fragments:
    """``(style, text)`` fragments laid out in ``width`` columns, lines broken between words
    (a word longer than a whole line is cut); a wrapped line starts with ``hang`` spaces, and
    the spaces where a line was broken are dropped."""
    width = max(width, 1)
    hang = hang if hang < width // 2 else 0
    out: Fragments = []
    col, start, broke = 0, 0, False  # the column; where this line's text starts; after a wrap

    def newline() -> None:
        nonlocal col, start, broke
        while out and out[-1][1].isspace() and out[-1][1] != "\n":
            out.pop()  # no trailing spaces where a line was broken
        out.append(("", "\n" + " " * hang))
        col = start = hang
        broke = True

    for style, text in fragments:
        for word in _TOKENS.findall(text):
            token = word
            if token == "\n":
                out.append((style, "\n"))
                col = start = 0
                broke = False
                continue
            size = cell_len(token)
            if token.isspace():
                if broke and col == start:
                    continue
                if col + size > width:
                    newline()
                    continue
                out.append((style, token))
                col += size
                continue
            if col + size > width and col > start:
                newline()
            while col + size > width:  # longer than a line: cut it
                room, cut = width - col, 0
                while cut < len(token) and cell_len(token[: cut + 1]) <= room:
                    cut += 1
                cut = max(cut, 1)
                out.append((style, token[:cut]))
                token = token[cut:]
                size = cell_len(token)
                newline()
            if token:
                out.append((style, token))
                col += size
                broke = False
    return out


def wrap(text: str, width: int, hang: int = 0) -> list[str]:
    """``text`` as the lines it takes in ``width`` columns, broken between words."""
    return "".join(t for _, t in wrap_fragments([("", text)], width, hang)).split("\n")


# --------------------------------------------------------------------------------------------
# tool cards and records


def duration(ms: float) -> str:
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def age(ms: float) -> str:
    seconds = max(ms, 0) / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def one_line(text: str) -> str:
    return " ".join(text.split())


def target_of(call: ToolCall) -> str:
    """What a call aims at: the command, the path, the pattern."""
    inp: dict[str, Any] = dict(call.input)
    if call.name == "shell" and isinstance(inp.get("command"), str):
        return one_line(inp["command"])
    if call.name == "search_text" and isinstance(inp.get("pattern"), str):
        where = inp.get("path")
        pattern: str = inp["pattern"]
        return pattern + (f" in {where}" if isinstance(where, str) and where else "")
    path = inp.get("path")
    if isinstance(path, str):
        return path
    return one_line(json.dumps(inp, ensure_ascii=False, sort_keys=True)) if inp else ""


_EXIT = re.compile(r"^exit (-?\d+)")
_READ = re.compile(r"^\[lines (\d+)-(\d+) of (\d+)")
_FOOTER = re.compile(r"^\[.*\]$")
SETTLED_TAIL = 4
"""How many of a finished shell command's last output lines its record keeps."""
LIVE_TAIL = 3
"""How many of a running call's latest output lines its card shows."""


def outcome_of(call: ToolCall, finished: ExecutionFinished) -> tuple[str, bool, int]:
    """``(status, is_error, lines of output)`` of a finished call (-1: no line count)."""
    status, failed, lines = _outcome(call, finished)
    return status, failed, -1 if lines is None else len(lines)


def _outcome(call: ToolCall, finished: ExecutionFinished) -> tuple[str, bool, list[str] | None]:
    """``(status, is_error, the output's lines)``: the output without the tool's own footers."""
    lines = finished.content.splitlines()
    failed = finished.is_error or not finished.ok
    if finished.error_kind in ("aborted", "timeout"):
        status = "stopped" if finished.error_kind == "aborted" else "timed out"
        if call.name == "shell" and lines:
            lines = lines[:-1]  # "cancelled; the process group was killed", "timed out after..."
    elif call.name == "shell" and lines:
        last = lines[-1]
        match = _EXIT.match(last)
        status = f"exit {match.group(1)}" if match else one_line(last)
        lines = lines[:-1]
    elif finished.is_error:
        return "error: " + one_line(lines[0] if lines else "failed"), failed, lines
    elif call.name in ("edit_file", "write_file") and lines:
        status = re.sub(r"\s*\[rev:[^\]]*\]$", "", one_line(lines[0]))
        status = re.sub(r"^edited [^:]*: |^wrote (\S+ bytes) to .*$", r"\1", status)
        return status, False, None
    elif call.name == "read_file":
        return _read_outcome(lines), failed, [ln for ln in lines if not _FOOTER.match(ln)]
    else:
        status = "ok"
        while lines and _FOOTER.match(lines[-1]):
            lines.pop()  # "[12 entries]", "[rev:...]": what the tool said about its output
    if call.name == "shell":
        lines = [ln for ln in lines if not ln.startswith("[processes the command left")]
    return status, failed, lines


def _read_outcome(lines: list[str]) -> str:
    """``ok``, or which part of a longer file was shown (``lines 1-200 of 950``)."""
    for line in reversed(lines):
        match = _READ.match(line)
        if match is not None:
            first, last, total = (int(g) for g in match.groups())
            return "ok" if first == 1 and last == total else f"lines {first}-{last} of {total}"
    return "ok"


def _fit(prefix: str, target: str, tail: Sequence[str], width: int) -> str:
    """``prefix target · tail...`` in ``width`` columns: only the target is shortened."""
    facts = "".join(f" · {t}" for t in tail)
    room = width - len(prefix) - len(facts)
    return f"{prefix}{shorten_end(target, max(room, 3))}{facts}"


def _tail_lines(lines: Sequence[str], keep: int, width: int, *, hidden: int = 0) -> list[str]:
    """The last ``keep`` output lines under a card: ``└`` before the first, each cut to fit."""
    shown = list(lines[-keep:])
    more = len(lines) - len(shown) + hidden
    rows = [f"… {more} earlier line{'s' if more != 1 else ''} · ctrl+o expands"] if more else []
    rows += shown
    return [shorten_end(("  └ " if i == 0 else "    ") + r, width) for i, r in enumerate(rows)]


def record_text(call: ToolCall, finished: ExecutionFinished, width: int) -> Text:
    """What a finished call settles into: one line, ``name target · status · N lines · time``;
    a shell command that printed something keeps the tail of its output under its command."""
    status, failed, lines = _outcome(call, finished)
    count = -1 if lines is None else len(lines)
    noun = "line" if count == 1 else "lines"
    facts = [status, *([f"{count} {noun}"] if count >= 0 else []), duration(finished.ms)]
    body = [ln.rstrip() for ln in lines or []]
    while body and not body[-1].strip():
        body.pop()
    if call.name == "shell" and body:
        head = shorten_end(f"  shell {target_of(call)}", width)
        tail = _tail_lines(body, SETTLED_TAIL, width)
        last = "    " + " · ".join(facts)
        text = Text("\n".join([head, *tail, last]))
        at = len(text.plain) - len(last) + 4
    else:
        line = _fit(f"  {call.name} ", target_of(call), facts, width)
        text = Text(line)
        at = line.rfind(f" · {status}") + 3
    if failed and status != "stopped":
        text.stylize(ERROR, at, at + len(status))
    return text


def running_card(call: ToolCall, elapsed_ms: float, output: str, width: int) -> list[str]:
    """A running call: ``● name target``, the latest lines of its output, then how long it has
    run and how to stop it (``1.2s · esc stops · alt+⏎ redirects``)."""
    head = shorten_end(f"● {call.name} {target_of(call)}", width)
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    tail = _tail_lines(lines[-LIVE_TAIL:], LIVE_TAIL, width)
    facts = shorten_end(f"    {duration(elapsed_ms)} · esc stops · alt+⏎ redirects", width)
    return [head, *tail, facts]


def shorten_end(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def shorten_middle(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    keep = width - 1
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


# --------------------------------------------------------------------------------------------
# the status row


@dataclass(frozen=True, slots=True)
class Meter:
    """Facts about the last model turn that reported them, from its recorded usage (the
    provider's own counts); ``None`` where unknown."""

    ctx_left: int | None = None
    cache_hit: int | None = None
    tok_s: float | None = None
    turn: Assistant | None = None


def meter(events: Iterable[Event], window: int) -> Meter:
    last: Assistant | None = None
    counted: Assistant | None = None
    timed: Assistant | None = None
    for e in events:
        if isinstance(e, Assistant):
            last = e
            if e.usage.input is not None or e.usage.cache_read is not None:
                counted = e
            if e.usage.output and e.ms > 0:
                timed = e
    if last is None:
        return Meter(ctx_left=100)
    ctx_left = cache = None
    if counted is not None:
        u = counted.usage
        used = (u.input or 0) + (u.cache_read or 0) + (u.cache_write or 0) + (u.output or 0)
        ctx_left = max(0, min(100, round(100 - used * 100 / max(window, 1))))
        seen = (u.input or 0) + (u.cache_read or 0)
        if seen and u.cache_read is not None:
            cache = round(u.cache_read * 100 / seen)
    tok_s = None
    if timed is not None and timed.usage.output:
        tok_s = timed.usage.output / (timed.ms / 1000)
    return Meter(ctx_left=ctx_left, cache_hit=cache, tok_s=tok_s, turn=last)


def status_row(
    *,
    mode: str,
    model: str,
    m: Meter,
    width: int,
    floor: bool = True,
    note: str = "",
    cost: str = "",
) -> str:
    """``▸ mode · /mode to switch · model · facts``: when the row is too narrow the hint goes
    first, then the model name is shortened in its middle; the facts are never cut."""
    facts = [f"ctx left ~{m.ctx_left}%" if m.ctx_left is not None else "ctx left ?"]
    if m.cache_hit is not None:
        facts.append(f"cache {m.cache_hit}%")
    if m.tok_s is not None:
        facts.append(f"{m.tok_s:.0f} tok/s")
    if cost:
        facts.append(cost)
    if not floor:
        facts.append("floor off")
    if note:
        facts.append(note)
    head = f"▸ {mode}"
    for hint in (["/mode to switch"], []):
        row = " · ".join([head, *hint, model, *facts])
        if len(row) <= width:
            return row
    room = width - len(" · ".join([head, "", *facts]))
    if room < 4:  # no room for even a shortened name: the facts stay, the name goes
        return " · ".join([head, *facts])
    return " · ".join([head, shorten_middle(model, room), *facts])


def money(dollars: float) -> str:
    return f"${dollars:,.2f}" if dollars >= 0.1 or dollars == 0 else f"${dollars:.4f}"


def spend(events: Iterable[Event], model: str) -> str:
    """What the session's model turns cost at the registry's dated list prices: ``$0.0123``;
    ``≥$0.0123`` when some turn could not be priced (no price, or a count the provider did not
    report); ``cost unknown`` when nothing could be priced and the model has no price."""
    total, unpriced = 0.0, 0
    for e in events:
        if isinstance(e, Assistant):
            dollars = cost(e.model, e.usage)
            if dollars is None:
                unpriced += 1
            else:
                total += dollars
    if lookup(model).price is None and total == 0:
        return "cost unknown"
    return ("≥" if unpriced else "") + money(total)


class Streamed:
    """Output tokens of the run going on, counted as they stream, and the decode rate.

    A committed turn counts what the provider reported (``usage.output``); the turn streaming
    now, and a turn whose provider reported nothing, count an estimate from the streamed text
    (about four bytes a token), shown with ``~``. The rate is tokens over the time from the
    turn's first delta to its last: the decode rate, without the wait for the first token.
    """

    def __init__(self) -> None:
        self.reported = 0
        self.estimated = 0
        self.text = ""
        self.first: float | None = None
        self.last: float | None = None
        self.rate: float | None = None
        """The decode rate of the last turn that could be measured."""

    def delta(self, text: str, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now
        self.text += text

    def _measured(self, tokens: int) -> float | None:
        if self.first is None or self.last is None or self.last - self.first < 0.2:
            return None
        return tokens / (self.last - self.first)

    def turn(self, output: int | None) -> None:
        """A model turn was committed; ``output``: its reported output tokens."""
        streamed = estimate_tokens(self.text) if self.text else 0
        if output is None:
            self.estimated += streamed
        else:
            self.reported += output
        rate = self._measured(output if output is not None else streamed)
        if rate is not None:
            self.rate = rate
        self.text, self.first, self.last = "", None, None

    def tokens(self) -> tuple[int, bool]:
        """``(output tokens so far, whether any of it is an estimate)``."""
        live = estimate_tokens(self.text) if self.text else 0
        return self.reported + self.estimated + live, bool(live or self.estimated)

    def live_rate(self) -> float | None:
        if self.text:
            rate = self._measured(estimate_tokens(self.text))
            if rate is not None:
                return rate
        return self.rate


def working_row(
    *,
    thinking: bool,
    seconds: int,
    streamed: Streamed,
    queued: int,
    ctx_left: int | None,
    width: int,
) -> str:
    """``✦ working 19s ↓ 94 tokens · 186 tok/s · esc stop · alt+⏎ redirect · ctx left ~98%``:
    the hints give way first when the row is narrow."""
    head = f"✦ {'thinking' if thinking else 'working'} {seconds}s"
    tokens, approximate = streamed.tokens()
    if tokens:
        head += f" ↓ {'~' if approximate else ''}{tokens} tokens"
    rate = streamed.live_rate()
    facts = [f"{rate:.0f} tok/s"] if rate is not None else []
    tail = [f"{queued} queued"] if queued else []
    if ctx_left is not None:
        tail.append(f"ctx left ~{ctx_left}%")
    for hints in (["esc stop", "alt+⏎ redirect"], ["esc stop"], []):
        row = " · ".join([head, *facts, *hints, *tail])
        if cell_len(row) <= width:
            return row
    return shorten_end(" · ".join([head, *facts, *tail]), width)


# --------------------------------------------------------------------------------------------
# the full call, and what the commands show


def _diff_text(lines: list[str]) -> Text:
    text = Text(overflow="fold")
    for line in lines:
        added = line.startswith("+") and not line.startswith("+++")
        text.append(line + "\n", style=ADDED if added else "")
    text.rstrip()
    return text


def _read(workspace: Path, path: str) -> str | None:
    try:
        target = resolve_in_workspace(workspace, path, must_exist=True)
        data = target.read_bytes()
    except (OSError, ValueError):
        return None
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def _diff_lines(name: str, inp: dict[str, Any], workspace: Path) -> list[str]:
    path: str = inp["path"]
    before = _read(workspace, path)
    if name == "write_file":
        content = inp.get("content")
        after = content if isinstance(content, str) else ""
        if before is None:
            return [f"new file {path}", *(f"+{ln}" for ln in after.splitlines())]
        return _unified(path, before, after) or ["(no change)"]
    edits = [e for e in inp.get("edits") or [] if isinstance(e, dict)]
    pairs = [(str(e.get("oldText", "")), str(e.get("newText", ""))) for e in edits]
    if before is not None:
        after = before
        for old, new in pairs:
            if not old or after.count(old) != 1:
                break
            after = after.replace(old, new, 1)
        else:
            diff = _unified(path, before, after)
            if diff:
                return diff
    out = [f"edits to {path}:"]
    for old, new in pairs:
        out += [f"-{ln}" for ln in old.splitlines()] + [f"+{ln}" for ln in new.splitlines()]
    return out


def _unified(path: str, before: str, after: str) -> list[str]:
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
            n=3,
        )
    ]


def diff_view(name: str, inp: dict[str, Any], workspace: Path) -> Text:
    """What an ``edit_file`` or ``write_file`` call would change, whole: a unified diff against
    the file as it is now (additions green), or the new file's every line."""
    return _diff_text(_diff_lines(name, inp, workspace))


COMMANDS = {
    "/help": "the commands and the keys",
    "/mode": "switch the approval mode: /mode <name> (no name lists them)",
    "/model": "pick a model profile and effort: /model [NAME [EFFORT]]",
    "/status": "session, model, mode, context, cost, theme",
    "/last": "the last tool call in full: input and complete output",
    "/transcript": "the whole conversation so far (ctrl+r)",
    "/copy": "copy the last answer to the clipboard (ctrl+x)",
    "/clear": "clear the screen",
    "/resume": "pick a session to continue",
    "/compact": "compact the context (not available yet)",
    "/exit": "quit (ctrl+d on an empty line too)",
}
KEYS = "\n".join(
    [
        "enter send · ctrl+j / shift+⏎ newline · esc stop · alt+⏎ / ctrl+⏎ redirect",
        "↑↓ history / queue pop · @ files · / commands · tab complete · ? this sheet",
        "ctrl+o expand the last tool call · ctrl+r transcript · ctrl+x copy the last answer",
        "alt+←→ / ctrl+←→ word motion · alt+⌫ / alt+d delete word · ctrl+z / ctrl+y undo / redo",
        "ctrl+g edit in $EDITOR · ctrl+l clear · ctrl+c clear the line · ctrl+d quit",
        "panels: ↑↓ move · ⏎ confirms · digits act on their row · t types · esc stops the run",
    ]
)
MODE_HELP = {
    "default": "reads run; edits and shell commands ask",
    "accept-edits": "reads and edits run; shell commands ask",
    "plan": "reads only: edits and shell commands are denied",
    "dontAsk": "never asks: whatever would ask is denied",
    "bypass": "everything runs (the catastrophe floor still refuses)",
}


def help_view() -> Text:
    rows = [f"{k:<12} {v}" for k, v in COMMANDS.items()]
    return Text("\n".join([*rows, "", KEYS]))


def modes_view(current: str) -> Text:
    rows = [f"{'▸' if m == current else ' '} {m:<13} {h}" for m, h in MODE_HELP.items()]
    return Text("\n".join([*rows, "/mode <name> switches"]))


def last_view(call: ToolCall, finished: ExecutionFinished, width: int, *, full: bool) -> Group:
    """A finished call with its complete output (``full``: and its whole input)."""
    parts: list[RenderableType] = [record_text(call, finished, width)]
    if full:
        body = json.dumps(call.input, ensure_ascii=False, indent=2)
        parts += [Text("  input:"), Padding(Text(body, overflow="fold"), (0, 0, 0, 4))]
        parts.append(Text("  output:"))
    style = ERROR if finished.is_error and finished.error_kind != "aborted" else ""
    content = finished.content or "(no output)"
    parts.append(Padding(Text(content, style=style, overflow="fold"), (0, 0, 0, 4)))
    return Group(*parts)


# --------------------------------------------------------------------------------------------
# the conversation so far, from the log


def transcript(
    events: Sequence[Event], width: int, *, runs: int | None = None
) -> list[RenderableType]:
    """What the log says was said and done, as it was shown: each prompt, the answers, each
    call's record, denials and how runs ended. ``runs``: only the last that many runs, after a
    line saying how many came before."""
    groups: list[list[RenderableType]] = []
    calls: dict[str, ToolCall] = {}
    for e in events:
        if isinstance(e, RunStarted):
            groups.append([])
            continue
        if not groups:
            continue
        shown = groups[-1]
        if isinstance(e, User) and e.source == "user":
            blocks = () if isinstance(e.content, str) else e.content
            images = sum(isinstance(b, ImageBlock) for b in blocks)
            shown.append(prompt_echo(e.text + " [image]" * images))
        elif isinstance(e, Assistant):
            calls.update((c.call_id, c) for c in e.calls)
            if e.text.strip():
                shown.append(markdown(e.text.strip("\n")))
        elif isinstance(e, ExecutionFinished):
            call = calls.get(e.call_id) or ToolCall(e.call_id, "tool", {})
            shown.append(record_text(call, e, width))
        elif isinstance(e, ApprovalDecided) and e.decision == "denied":
            denied = calls.get(e.call_id)
            what = f"{denied.name} {shorten_end(target_of(denied), 60)}" if denied else e.call_id
            shown.append(Text(f"  ✗ {what} denied by {e.decided_by}: {e.reason or ''}"))
        elif isinstance(e, Compacted):
            shown.append(Text("  (the context was compacted here: the model sees a summary)"))
        elif isinstance(e, RunEnded):
            o = e.outcome
            if o.kind == "error":
                shown.append(error_text(f"✗ {o.message} ({o.code})"))
            elif o.kind == "aborted":
                shown.append(Text(f"✦ aborted by {o.by}"))
            elif o.kind != "completed":
                shown.append(warning_text(f"the run ended: {o.kind}"))
    out: list[RenderableType] = []
    if runs is not None and len(groups) > runs:
        earlier = len(groups) - runs
        out.append(
            Text(f"… {earlier} earlier turn{'s' if earlier != 1 else ''} · ctrl+r shows them all")
        )
        groups = groups[-runs:] if runs else []
    for group in groups:
        out.extend(group)
    return out


def copy_sequence(text: str, *, tmux: bool = False) -> str:
    """OSC 52: the terminal puts ``text`` on the system clipboard (inside tmux, passed through)."""
    import base64

    seq = "\x1b]52;c;" + base64.b64encode(text.encode("utf-8")).decode("ascii") + "\x07"
    return f"\x1bPtmux;{seq.replace(chr(27), chr(27) * 2)}\x1b\\" if tmux else seq
