"""What the interactive session prints: the colour policy, markdown, tool cards and records, the
status row. Pure functions of what the session already knows; nothing here asks the model.

Colour is reserved for three meanings: green for a diff's additions, red for errors, yellow for
warnings. ``NO_COLOR`` (any value) keeps bold and reverse but drops every colour; a stdout that is
not a terminal gets plain text with no escape code at all.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from markdown_it.token import Token
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.default_styles import DEFAULT_STYLES
from rich.markdown import CodeBlock, Markdown, MarkdownElement
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from rich.theme import Theme

from .theme import UNKNOWN, Palette

__all__ = [
    "COMMANDS",
    "CURSOR",
    "KEYS",
    "MODE_HELP",
    "PROMPT",
    "Policy",
    "Printer",
    "StreamText",
    "error_text",
    "help_view",
    "markdown",
    "modes_view",
    "prompt_echo",
    "report",
    "shorten_end",
    "shorten_middle",
    "warning_text",
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
    "/compact": "summarize the history now: /compact [focus] (the log keeps every event)",
    "/context": "the next request's rent by part: system, tools, summary, messages, results",
    "/reload": "load the extensions, skills, MCP servers and config again",
    "/mcp": "the MCP servers: state, tools, last error",
    "/skills": "the skills; /<name> [args] runs one",
    "/tasks": 'the task list (with "tasks": true in the config)',
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
