"""The questions a run puts to the person at the terminal, and the bottom of the terminal where
they are asked.

The approval panel and the uncertain execution are selections, not forms: the highlight starts on
the first option, arrows move it, a digit acts on its row, enter confirms, ``t`` types a free
answer where one makes sense (for an approval: a denial, with what was typed as the reason the
model is told). Space never answers anything. :class:`Tui` is the inline application at the
bottom: the live part of the turn, the panel or the input, and the status row.

The call itself is shown in full (the whole command, the whole diff, the whole content), printed
into the scrollback above the panel so nothing is ever cut to fit the window. What the approval
may offer is not decided here: the runtime decides it (:func:`kiso.runtime.offers.approval_offer`:
the "don't ask again" rule, or why there is none, and the one yellow line an irreversible delete
carries) and the panel renders it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prompt_toolkit.application import Application, in_terminal, run_in_terminal
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.document import Document
from prompt_toolkit.filters import Condition, has_focus
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import FileHistory
from prompt_toolkit.input.ansi_escape_sequences import ANSI_SEQUENCES
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent, merge_key_bindings
from prompt_toolkit.key_binding.bindings.named_commands import get_by_name
from prompt_toolkit.key_binding.defaults import load_key_bindings
from prompt_toolkit.keys import Keys
from prompt_toolkit.layout import (
    ConditionalContainer,
    Dimension,
    Float,
    FloatContainer,
    HSplit,
    Layout,
    Window,
)
from prompt_toolkit.layout.controls import BufferControl, FormattedTextControl
from prompt_toolkit.layout.menus import CompletionsMenu
from prompt_toolkit.output import ColorDepth
from prompt_toolkit.styles import Style
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from kiso.kernel import ToolCall, Uncertain
from kiso.kernel.layout import make_private_dirs, projects_dir, workspace_slug

from .picker import WorkspaceCompleter
from .records import copy_sequence, diff_view
from .render import COMMANDS, CURSOR, KEYS, PROMPT, WARNING, report, wrap, wrap_fragments, write

if TYPE_CHECKING:
    from kiso.runtime.offers import Offer

    from .repl import Repl

__all__ = [
    "NARROWER",
    "Option",
    "Panel",
    "PrivateHistory",
    "Tui",
    "approval_panel",
    "call_view",
    "history_path",
    "uncertain_panel",
]

Action = Literal[
    "yes", "always", "everywhere", "no", "narrower", "rerun", "skipped", "applied", "pick"
]

NARROWER = (
    "The user did not run this call as it is and asks for narrower versions of it instead: "
    "reply with two or three narrower alternatives (fewer files or paths, a smaller scope, no "
    "compound command), each with what it would touch, and do not call a tool until the user "
    "picks one."
)
"""The reason the model is given when the person presses "ask for narrower versions"."""


@dataclass(slots=True)
class Option:
    label: str
    action: Action
    detail: str = ""
    enabled: bool = True
    why_not: str = ""
    value: str = ""
    """What the option stands for beyond its action (a model profile, an effort level)."""


@dataclass(slots=True)
class Panel:
    """A question with options; ``typing`` while the person types a free answer."""

    question: str
    options: list[Option]
    selected: int = 0
    typing: bool = False
    note: str = ""
    """Shown under the options (why a disabled option cannot be chosen)."""
    reason: str = ""
    """What the person typed (``t``, or the option that asks for it): the free answer."""
    typed: Action | None = None
    """What a typed answer means (None: this question takes no free answer)."""
    ask: str = "why? "
    """The prompt of the line a free answer is typed on."""
    hint: str = "↑↓ move · ⏎ confirms · digits act on their row · t types · esc stops the run"
    extra: list[str] = field(default_factory=list)
    multi: bool = False
    """Several rows may be chosen: digits and space toggle them, enter confirms the set."""
    checked: set[int] = field(default_factory=set)

    def toggle(self, index: int) -> None:
        """A multi-choice panel: check or uncheck the row (one that cannot be chosen says why)."""
        if self.pick(index) is not None:
            self.checked ^= {index}

    def confirm(self) -> Option | None:
        """Enter: the highlighted row, or for a multi-choice panel the rows checked (the
        highlighted one when none is)."""
        if not self.multi or not self.checked:
            return self.pick(self.selected)
        rows = ",".join(str(i) for i in sorted(self.checked))
        return Option("checked", self.options[min(self.checked)].action, value=f"options:{rows}")

    def move(self, delta: int) -> None:
        """Move the highlight, over the options that cannot be chosen."""
        self.note = ""
        for _ in self.options:
            self.selected = (self.selected + delta) % len(self.options)
            if self.options[self.selected].enabled:
                return

    def pick(self, index: int) -> Option | None:
        """The option at ``index`` if it can be chosen (a disabled one says why instead)."""
        if not 0 <= index < len(self.options):
            return None
        option = self.options[index]
        if not option.enabled:
            self.note = option.why_not
            return None
        self.selected = index
        return option

    def typed_answer(self) -> Option | None:
        """The answer typed (its text is also in ``reason``), or None if none is taken."""
        if self.typed is None:
            return None
        return Option("typed", self.typed, value=self.reason)

    def fragments(self, width: int) -> StyleAndTextTuples:
        """The panel in ``width`` columns, every line broken between words."""
        out: StyleAndTextTuples = []
        out += wrap_fragments([("class:question", self.question)], width)
        out.append(("", "\n"))
        for i, option in enumerate(self.options):
            chosen = i == self.selected
            box = ("[x] " if i in self.checked else "[ ] ") if self.multi else ""
            marker = f"{CURSOR if chosen else '  '}{i + 1}. {box}"
            style = "class:selected" if chosen else ""
            if not option.enabled:
                style += " class:disabled"
            row = [(style, marker + option.label)]
            if option.detail:
                row.append(("class:detail", "  " + option.detail))
            out += wrap_fragments(row, width, hang=len(marker))
            out.append(("", "\n"))
        if self.note and not self.typing:
            out += wrap_fragments([("class:warning", self.note)], width)
            out.append(("", "\n"))
        if not self.typing:
            out += wrap_fragments([("class:hint", self.hint)], width)
        elif out and out[-1] == ("", "\n"):
            out.pop()
        return out


# --------------------------------------------------------------------------------------------
# the panels


def approval_panel(call: ToolCall, offer: Offer) -> Panel:
    """The question for ``call``, offering what the runtime decided (``offer``)."""
    inp: dict[str, Any] = dict(call.input)
    path = inp.get("path") if isinstance(inp.get("path"), str) else None
    if call.name == "shell" and inp.get("outside_sandbox") is True:
        question = "Run this command OUTSIDE the sandbox, with your full access?"
    elif call.name == "shell":
        question = "Run this command?"
    elif call.name == "edit_file" and path:
        question = f"Apply this edit to {path}?"
    elif call.name == "write_file" and path:
        question = f"Write {path}?"
    else:
        question = f"Allow {call.name}?"
    always = Option("Yes, and don't ask again", "always")
    everywhere: list[Option] = []
    if offer.rule is None:
        why = offer.no_rule_because or "no rule can cover this call"
        always.enabled = False
        always.detail = f"(not offered: {why})"
        always.why_not = f'"don\'t ask again" is not offered: {why}'
    else:
        where = f" ({offer.project})" if offer.project is not None else ""
        always.label = f"Yes, and don't ask again in this project{where}"
        always.detail = f"(adds the rule `{offer.rule.text}`)"
        label = "Yes, and don't ask again in every project"
        everywhere.append(Option(label, "everywhere", always.detail))
    narrower = Option("No, ask for narrower versions", "narrower", "(the model proposes 2-3)")
    return Panel(
        question,
        [
            Option("Yes", "yes"),
            always,
            Option("No (tell the model why)", "no"),
            narrower,
            *everywhere,  # last: the wider grant is never a slip of the finger away from 2
        ],
        typed="no",
    )


def uncertain_panel(u: Uncertain) -> Panel:
    return Panel(
        f"interrupted execution: {u.name} ({u.execution_id}) — did it apply?",
        [
            Option("rerun it", "rerun"),
            Option("skip it", "skipped"),
            Option("it was applied", "applied"),
        ],
        hint="↑↓ move · ⏎ confirms · digits act on their row · esc leaves it for later",
    )


# --------------------------------------------------------------------------------------------
# the call in full


def call_view(
    call: ToolCall, workspace: Path, *, warning: str | None = None, heading: str | None = None
) -> RenderableType:
    """The whole call: the command, the diff or the content, never truncated.

    ``warning`` is the one yellow line the runtime gave the call (an irreversible delete), if any.
    """
    inp: dict[str, Any] = dict(call.input)
    path = inp.get("path")
    where = f" {path}" if isinstance(path, str) and call.name != "shell" else ""
    title = Text(heading or f"● {call.name}{where}", style="bold")
    parts: list[RenderableType] = [Text(""), title]
    if call.name == "shell" and isinstance(inp.get("command"), str):
        parts.append(Padding(Text(inp["command"], overflow="fold"), (0, 0, 0, 2)))
        if "timeout_ms" in inp:
            parts.append(Text(f"  timeout {inp['timeout_ms']} ms"))
        if inp.get("outside_sandbox") is True:
            why = inp.get("justification")
            said = f": {why}" if isinstance(why, str) and why.strip() else " (no reason given)"
            parts.append(Text(f"⚠ outside the sandbox{said}", style=WARNING))
    elif call.name in ("edit_file", "write_file") and isinstance(inp.get("path"), str):
        parts.append(Padding(diff_view(call.name, inp, workspace), (0, 0, 0, 2)))
    else:
        body = json.dumps(inp, ensure_ascii=False, indent=2)
        parts.append(Padding(Text(body, overflow="fold"), (0, 0, 0, 2)))
    if warning:
        parts.append(Text(f"⚠ irreversible: {warning}", style=WARNING))
    return Group(*parts)


# --------------------------------------------------------------------------------------------
# the input's history: one file per workspace


def history_path(home: Path, workspace: Path) -> Path:
    """``$KISO_HOME/projects/<workspace>/history``: next to that workspace's session logs."""
    return projects_dir(home) / workspace_slug(workspace) / "history"


class PrivateHistory(FileHistory):
    """prompt_toolkit's file history, its file created 0600 in a 0700 folder (a file that
    already exists keeps the mode its owner gave it)."""

    def store_string(self, string: str) -> None:
        path = Path(os.fsdecode(self.filename))
        lines = "".join(f"+{line}\n" for line in string.split("\n"))
        data = f"\n# {datetime.datetime.now()}\n{lines}".encode("utf-8", errors="replace")
        try:
            make_private_dirs(path.parent)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "ab") as f:
                f.write(data)
        except OSError:
            pass  # the history is a convenience: a full disk must not take the session down

    def load_history_strings(self) -> Iterable[str]:
        try:
            return list(super().load_history_strings())
        except OSError:
            return []


# --------------------------------------------------------------------------------------------
# the terminal: an inline application at the bottom, finished output above it

MODIFIED_ENTER: dict[str, Keys | tuple[Keys, ...]] = {
    "\x1b[27;5;13~": (Keys.Escape, Keys.ControlM),  # ctrl+enter redirects, as alt+enter does
    "\x1b[13;5u": (Keys.Escape, Keys.ControlM),
    "\x1b[27;2;13~": Keys.ControlJ,  # shift+enter is a newline, as ctrl+j is
    "\x1b[13;2u": Keys.ControlJ,
}
"""ctrl+enter and shift+enter, for terminals that tell them from enter (xterm's
modifyOtherKeys, the CSI u keyboard protocol); prompt_toolkit reads both as a plain enter."""


class Tui:
    def __init__(self, repl: Repl, history: Path | None = None) -> None:
        self.repl = repl
        self.panel: Panel | None = None
        self.answer: asyncio.Future[Option | None] | None = None
        ANSI_SEQUENCES.update(MODIFIED_ENTER)
        if history is None:
            from kiso.kernel import kiso_home

            history = history_path(kiso_home(), repl.setup.workspace)
        self.input = Buffer(
            multiline=True,
            history=PrivateHistory(history),
            completer=WorkspaceCompleter(repl.setup.workspace, COMMANDS),
            complete_while_typing=True,
        )
        self.why = Buffer(multiline=False)
        self.panel_window = Window(
            FormattedTextControl(self._panel, focusable=True, show_cursor=False),
            dont_extend_height=True,
        )
        self.why_window = Window(
            BufferControl(self.why),
            height=1,
            get_line_prefix=lambda n, w: "  " + (self.panel.ask if self.panel else "") + PROMPT,
        )
        self.input_window = Window(
            BufferControl(self.input),
            wrap_lines=True,
            dont_extend_height=True,
            height=Dimension(min=1, max=12),
            get_line_prefix=lambda n, w: PROMPT if n == 0 and w == 0 else "  ",
        )
        palette = repl.printer.palette
        self.app: Application[int] = Application(
            layout=self._layout(),
            key_bindings=merge_key_bindings([load_key_bindings(), self._bindings()]),
            style=Style.from_dict({**STYLE, **palette.toolkit}),
            full_screen=False,
            erase_when_done=True,
            mouse_support=False,
            include_default_pygments_style=False,
            color_depth=None if repl.policy.color else ColorDepth.DEPTH_1_BIT,
        )
        # A lone esc waits this long for the key it may start (alt+d is esc then d).
        self.app.ttimeoutlen = 0.05
        self.app.timeoutlen = 0.1

    # ------------------------------------------------------------------ Screen

    def width(self) -> int:
        return max(self.app.output.get_size().columns, 20)

    def rows(self) -> int:
        return max(self.app.output.get_size().rows, 8)

    async def show(self, item: RenderableType) -> None:
        text = self.repl.printer.render(item, self.width())
        await run_in_terminal(lambda: write(text))

    def refresh(self) -> None:
        self.app.invalidate()

    def clear(self) -> None:
        self.app.renderer.clear()

    def exit(self, code: int) -> None:
        if self.app.is_running and not self.app.is_done:
            self.app.exit(result=code)

    def copy(self, text: str) -> bool:
        """Put ``text`` on the clipboard through the terminal (OSC 52)."""
        self.app.output.write_raw(copy_sequence(text, tmux="TMUX" in os.environ))
        self.app.output.flush()
        return True

    async def ask(self, panel: Panel) -> Option | None:
        self.panel = panel
        self.answer = asyncio.get_running_loop().create_future()
        self.app.layout.focus(self.panel_window)
        self.refresh()
        try:
            return await self.answer
        finally:
            self.panel = self.answer = None
            self.why.reset()
            self.app.layout.focus(self.input_window)
            self.refresh()

    async def pick(self) -> str | None:
        from kiso.kernel.jsonl import JsonlSessionStore

        from .picker import pick_session_async

        store = self.repl.setup.agent.store
        if not isinstance(store, JsonlSessionStore):
            return None
        async with in_terminal():
            return await pick_session_async(store, self.repl.setup.workspace)

    async def run(self) -> int:
        repl = self.repl
        worker: asyncio.Task[None] | None = None

        def start() -> None:
            nonlocal worker
            worker = asyncio.ensure_future(repl.worker())

        try:
            return await self.app.run_async(pre_run=start)
        except EOFError:
            return repl.quit_code()
        finally:
            if self.answer is not None and not self.answer.done():
                self.answer.cancel()
            if repl.running and repl.session is not None:
                repl.session.abort()
                for _ in range(200):
                    if not repl.running:
                        break
                    await asyncio.sleep(0.05)
            if worker is not None:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker

    # ------------------------------------------------------------------ layout

    def _layout(self) -> Layout:
        repl = self.repl
        has_panel = Condition(lambda: self.panel is not None)
        typing = Condition(lambda: self.panel is not None and self.panel.typing)
        completing = Condition(lambda: self.input.complete_state is not None)
        body = HSplit(
            [
                ConditionalContainer(
                    Window(FormattedTextControl(self._live), dont_extend_height=True),
                    Condition(lambda: bool(repl.text.pending.strip())),
                ),
                ConditionalContainer(
                    Window(FormattedTextControl(self._cards), dont_extend_height=True),
                    Condition(lambda: bool(repl.cards)),
                ),
                ConditionalContainer(
                    Window(FormattedTextControl(self._working), height=1),
                    Condition(lambda: repl.running),
                ),
                ConditionalContainer(
                    Window(FormattedTextControl(self._queued), dont_extend_height=True),
                    Condition(lambda: bool(repl.queued())),
                ),
                ConditionalContainer(
                    HSplit([self.panel_window, ConditionalContainer(self.why_window, typing)]),
                    has_panel,
                ),
                ConditionalContainer(self.input_window, ~has_panel),
                ConditionalContainer(Window(height=self._menu_height), completing),
                Window(FormattedTextControl(self._status), height=1),
            ]
        )
        menu = Float(xcursor=True, ycursor=True, content=CompletionsMenu(max_height=8))
        return Layout(FloatContainer(body, floats=[menu]), focused_element=self.input_window)

    def _menu_height(self) -> Dimension:
        state = self.input.complete_state
        return Dimension.exact(min(len(state.completions), 8) if state else 0)

    def _live(self) -> StyleAndTextTuples:
        """The paragraph still streaming, broken between words: its latest lines only, so the
        input and the status row below it always keep their place on the screen."""
        lines = wrap(self.repl.text.pending.strip("\n"), self.width())
        return [("", "\n".join(lines[-max(self.rows() // 2 - 2, 3) :]))]

    def _cards(self) -> StyleAndTextTuples:
        lines = self.repl.live_cards(self.width())
        return [("", "\n".join(lines[-max(self.rows() // 3, 5) :]))]

    def _working(self) -> StyleAndTextTuples:
        return [("class:working", self.repl.working(self.width()))]

    def _queued(self) -> StyleAndTextTuples:
        width, prompts = self.width(), self.repl.queued()
        rows = [_shorten(f"  queued {PROMPT}{' '.join(p.split())}", width) for p in prompts[-3:]]
        if len(prompts) > 3:
            rows.insert(0, f"  … {len(prompts) - 3} more queued")
        rows[-1] = _shorten(rows[-1], width - 24) + "  (↑ takes the last back)"
        return [("class:hint", "\n".join(rows))]

    def _status(self) -> StyleAndTextTuples:
        return [("class:status", self.repl.status(self.width()))]

    def _panel(self) -> StyleAndTextTuples:
        return self.panel.fragments(self.width()) if self.panel else []

    # ------------------------------------------------------------------ keys

    def _choose(self, option: Option | None) -> None:
        panel = self.panel
        if panel is None or option is None:
            self.refresh()
            return
        if option.action == "no" and not panel.typing:
            self._type()
        elif self.answer is not None and not self.answer.done():
            self.answer.set_result(option)
        self.refresh()

    def _type(self) -> None:
        """``t`` in a panel: type a free answer (a denial's reason, a model's name)."""
        panel = self.panel
        if panel is None:
            return
        if panel.typed is None:
            panel.note = "this question takes no typed answer: pick a row"
        else:
            panel.typing = True
            self.app.layout.focus(self.why_window)
        self.refresh()

    def _escape(self) -> None:
        panel = self.panel
        if panel is not None and panel.typing:
            panel.typing = False
            self.why.reset()
            self.app.layout.focus(self.panel_window)
        elif panel is not None:
            if self.answer is not None and not self.answer.done():
                self.answer.set_result(None)
        elif self.input.complete_state is not None:
            self.input.cancel_completion()
        else:
            self.repl.abort()

    def _send(self, *, redirect: bool = False) -> None:
        b = self.input
        state = b.complete_state
        if state is not None and state.current_completion is not None and not redirect:
            b.apply_completion(state.current_completion)
            return
        text = b.text
        b.reset(append_to_history=bool(text.strip()))
        self.repl.submit(text, redirect=redirect)

    def _pop_queued(self) -> None:
        text = self.repl.pop_queued()
        if text is not None:
            self.input.document = Document(text, len(text))
        self.refresh()

    def _copy(self) -> None:
        task = asyncio.ensure_future(self.repl.copy_last_answer())
        task.add_done_callback(report)

    def _later(self, item: RenderableType) -> None:
        asyncio.ensure_future(self.show(item)).add_done_callback(report)

    def _bindings(self) -> KeyBindings:
        kb = KeyBindings()
        repl = self.repl
        in_input = has_focus(self.input)
        empty = Condition(lambda: not self.input.text)
        queued = Condition(lambda: bool(repl.queued()))
        in_panel = Condition(lambda: self.panel is not None and not self.panel.typing)
        in_why = has_focus(self.why)
        no_panel = Condition(lambda: self.panel is None)

        kb.add("enter", filter=in_input)(lambda e: self._send())
        kb.add("escape", "enter", filter=in_input)(lambda e: self._send(redirect=True))
        kb.add("c-j", filter=in_input)(lambda e: self.input.insert_text("\n"))
        kb.add("escape")(lambda e: self._escape())
        kb.add("?", filter=in_input & empty)(lambda e: self._later(Text(KEYS)))
        kb.add("c-o")(lambda e: self._later(repl.last_view(full=False)))
        kb.add("c-r", filter=no_panel)(lambda e: self._later(repl.transcript()))
        kb.add("c-x", eager=True)(lambda e: self._copy())
        # undo and redo must not save an undo state first (that would clear what redo redoes)
        kb.add("c-z", filter=in_input, save_before=_never)(lambda e: self.input.undo())
        kb.add("c-y", filter=in_input, save_before=_never)(lambda e: self.input.redo())
        kb.add("c-g", filter=in_input)(lambda e: self.input.open_in_editor())
        # alt+←→ move by words like ctrl+←→ (prompt_toolkit's alt+→ stops at a word's start)
        kb.add("escape", "left", filter=in_input)(get_by_name("backward-word"))
        kb.add("escape", "right", filter=in_input)(get_by_name("forward-word"))
        kb.add("up", filter=in_input & empty & queued)(lambda e: self._pop_queued())
        kb.add("c-d", filter=in_input & empty)(lambda e: repl.quit(repl.quit_code()))
        kb.add("c-l")(lambda e: self.clear())

        @kb.add("c-c")
        def _interrupt(event: KeyPressEvent) -> None:
            if self.panel is not None or repl.running:
                self._escape()
            else:
                self.input.reset()

        for key, delta in (("up", -1), ("down", 1), ("c-p", -1), ("c-n", 1), ("k", -1), ("j", 1)):
            kb.add(key, filter=in_panel)(lambda e, d=delta: self._move(d))
        for digit in "123456789":
            kb.add(digit, filter=in_panel)(lambda e: self._digit(int(e.data) - 1))
        kb.add("space", filter=in_panel)(lambda e: self._toggle(None))
        kb.add("enter", filter=in_panel)(
            lambda e: self._choose(self.panel.confirm() if self.panel else None)
        )
        kb.add("t", filter=in_panel)(lambda e: self._type())

        @kb.add("enter", filter=in_why)
        def _why(event: KeyPressEvent) -> None:
            if self.panel is not None and self.answer is not None and not self.answer.done():
                self.panel.reason = self.why.text
                answer = self.panel.typed_answer()
                if answer is not None:
                    self.answer.set_result(answer)

        return kb

    def _move(self, delta: int) -> None:
        if self.panel is not None:
            self.panel.move(delta)
            self.refresh()

    def _digit(self, index: int) -> None:
        """A digit picks its row, or in a multi-choice panel checks or unchecks it."""
        if self.panel is not None and self.panel.multi:
            self._toggle(index)
        else:
            self._choose(self.panel.pick(index) if self.panel else None)

    def _toggle(self, index: int | None) -> None:
        panel = self.panel
        if panel is not None and panel.multi:
            panel.toggle(panel.selected if index is None else index)
            self.refresh()


def _never(event: KeyPressEvent) -> bool:
    return False


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


STYLE = {
    "question": "bold",
    "selected": "reverse",
    "warning": "ansiyellow",
    "error": "ansired",
    "working": "bold",
    "completion-menu": "noinherit",
    "completion-menu.completion": "noinherit",
    "completion-menu.completion.current": "noinherit reverse",
    "completion-menu.meta.completion": "noinherit",
    "completion-menu.meta.completion.current": "noinherit reverse",
    "scrollbar.background": "noinherit",
    "scrollbar.button": "noinherit reverse",
}
