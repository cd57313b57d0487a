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

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.default_styles import DEFAULT_STYLES
from rich.markdown import CodeBlock, Markdown, MarkdownElement
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from rich.theme import Theme

from kiso.kernel import Assistant, Event, ExecutionFinished, ToolCall
from kiso.tools import resolve_in_workspace

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
    "age",
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
    "status_row",
    "target_of",
    "warning_text",
    "write",
]

ERROR, WARNING, ADDED = "red", "yellow", "green"
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


MONO_THEME = Theme({k: _mono(v) for k, v in DEFAULT_STYLES.items() if k.startswith("markdown.")})
"""Rich's markdown styles without their colours: the interface is monochrome."""


class _PlainCode(CodeBlock):
    """A fenced code block as plain indented text: no syntax colours, no background."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Padding(Text(str(self.text).rstrip("\n")), (0, 0, 0, 4))


class _Markdown(Markdown):
    elements: ClassVar[dict[str, type[MarkdownElement]]] = {
        **Markdown.elements,
        "fence": _PlainCode,
        "code_block": _PlainCode,
    }


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

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

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
            theme=MONO_THEME,
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


def outcome_of(call: ToolCall, finished: ExecutionFinished) -> tuple[str, bool, int]:
    """``(status, is_error, lines of output)`` of a finished call."""
    lines = finished.content.splitlines()
    if finished.error_kind == "aborted":
        status = "stopped"
    elif finished.error_kind == "timeout":
        status = "timed out"
    elif call.name == "shell" and lines:
        last = lines[-1]
        match = _EXIT.match(last)
        status = f"exit {match.group(1)}" if match else one_line(last)
        lines = [ln for ln in lines[:-1] if not ln.startswith("[processes the command left")]
    elif finished.is_error:
        status = "error: " + one_line(lines[0] if lines else "failed")
    elif call.name in ("edit_file", "write_file") and lines:
        status = re.sub(r"\s*\[rev:[^\]]*\]$", "", one_line(lines[0]))
        status = re.sub(r"^edited [^:]*: |^wrote (\S+ bytes) to .*$", r"\1", status)
        return status, False, -1
    else:
        status = "ok"
    return status, finished.is_error or not finished.ok, len(lines)


def _fit(prefix: str, target: str, tail: Sequence[str], width: int) -> str:
    """``prefix target · tail...`` in ``width`` columns: only the target is shortened."""
    facts = "".join(f" · {t}" for t in tail)
    room = width - len(prefix) - len(facts)
    return f"{prefix}{shorten_end(target, max(room, 3))}{facts}"


def record_text(call: ToolCall, finished: ExecutionFinished, width: int) -> Text:
    """The one-line record a finished call settles into."""
    status, failed, count = outcome_of(call, finished)
    noun = "line" if count == 1 else "lines"
    tail = [status, *([f"{count} {noun}"] if count >= 0 else []), duration(finished.ms)]
    line = _fit(f"  {call.name} ", target_of(call), tail, width)
    text = Text(line)
    if failed and status != "stopped":
        start = line.rfind(f" · {status}") + 3
        text.stylize(ERROR, start, start + len(status))
    return text


def running_card(call: ToolCall, elapsed_ms: float, width: int) -> str:
    hint = "esc stops"
    return _fit(f"● {call.name} ", target_of(call), [duration(elapsed_ms), hint], width)


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
    *, mode: str, model: str, m: Meter, width: int, floor: bool = True, note: str = ""
) -> str:
    """``▸ mode · /mode to switch · model · facts``: when the row is too narrow the hint goes
    first, then the model name is shortened in its middle; the facts are never cut."""
    facts = [f"ctx left ~{m.ctx_left}%" if m.ctx_left is not None else "ctx left ?"]
    if m.cache_hit is not None:
        facts.append(f"cache {m.cache_hit}%")
    if m.tok_s is not None:
        facts.append(f"{m.tok_s:.0f} tok/s")
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
    "/model": "list the model profiles",
    "/status": "session, model, mode, context",
    "/last": "the last tool call in full: input and complete output",
    "/clear": "clear the screen",
    "/resume": "pick a session to continue",
    "/compact": "compact the context (not available yet)",
    "/exit": "quit (ctrl+d on an empty line too)",
}
KEYS = (
    "enter send · ctrl+j newline · @ files · esc stop · / commands · ↑↓ history · "
    "ctrl+o expand the last tool call · tab complete · ? this sheet · ctrl+d quit\n"
    "panels: ↑↓ move · ⏎ confirms · digits act on their row · esc stops the run"
)
MODE_HELP = {
    "default": "reads run; edits and shell commands ask",
    "accept-edits": "reads and edits run; shell commands ask",
    "plan": "reads only: edits and shell commands are denied",
    "dontAsk": "never asks: whatever would ask is denied",
    "bypass": "everything runs (the catastrophe floor still refuses)",
}


def help_view() -> Text:
    rows = [f"{k:<9} {v}" for k, v in COMMANDS.items()]
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
