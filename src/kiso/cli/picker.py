"""Pickers: the resume picker, and the completer that picks a command or a workspace file.

The resume picker: one row per session, with the state kiso would resume into, in words.

It opens on the sessions that started in this directory; tab shows every workspace, each row then
tagged with where it started. Arrows move, typing filters, enter picks, esc cancels. It reads the
listing only: no session is opened, no writer lock taken.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from prompt_toolkit.application import Application
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.keys import Keys
from prompt_toolkit.layout import HSplit, Layout, Window
from prompt_toolkit.layout.controls import FormattedTextControl
from prompt_toolkit.output import ColorDepth
from prompt_toolkit.styles import Style

from kiso.kernel import SessionInfo, StoreError
from kiso.kernel.jsonl import JsonlSessionStore

from .render import CURSOR, age, shorten_end, shorten_middle

__all__ = ["Picker", "WorkspaceCompleter", "pick_session", "pick_session_async"]

STYLE = Style.from_dict({"selected": "reverse", "title": "bold", "hint": "", "error": "ansired"})


class Picker:
    """The picker's state: the rows of one scope, a filter, a selection. No terminal here."""

    def __init__(self, store: JsonlSessionStore, workspace: Path) -> None:
        self.store = store
        self.workspace = Path(os.path.realpath(workspace))
        self.all = False
        self.filter = ""
        self.selected = 0
        self.error = ""
        self._rows: dict[bool, list[SessionInfo]] = {}

    def rows(self) -> list[SessionInfo]:
        if self.all not in self._rows:
            try:
                self._rows[self.all] = self.store.list(None if self.all else self.workspace)
            except StoreError as exc:
                self.error = str(exc)
                self._rows[self.all] = []
        return self._rows[self.all]

    def visible(self) -> list[SessionInfo]:
        words = self.filter.lower().split()
        out = []
        for row in self.rows():
            hay = f"{row.id} {state_of(row)} {row.title} {row.workspace if self.all else ''}"
            if all(w in hay.lower() for w in words):
                out.append(row)
        return out

    def move(self, delta: int) -> None:
        count = len(self.visible())
        self.selected = min(max(self.selected + delta, 0), max(count - 1, 0))

    def type(self, text: str) -> None:
        self.filter += text
        self.selected = 0

    def backspace(self) -> None:
        self.filter = self.filter[:-1]
        self.selected = 0

    def toggle(self) -> None:
        self.all = not self.all
        self.selected = 0

    def chosen(self) -> str | None:
        rows = self.visible()
        return rows[self.selected].id if 0 <= self.selected < len(rows) else None

    def fragments(self, width: int, height: int) -> StyleAndTextTuples:
        scope = "every workspace" if self.all else "this directory"
        other = "this directory" if self.all else "every workspace"
        out: StyleAndTextTuples = [("class:title", f"Resume a session · {scope}\n")]
        if self.filter:
            out.append(("", f"filter: {self.filter}\n"))
        if self.error:
            out.append(("class:error", self.error + "\n"))
        rows = self.visible()
        if not rows:
            empty = "no session matches the filter" if self.filter else f"no sessions in {scope}"
            out.append(("", f"  {empty}\n"))
        room = max(height - 4, 3)
        first = min(max(self.selected - room + 1, 0), max(len(rows) - room, 0))
        now = time.time() * 1000
        idw = max((len(r.id) for r in rows), default=0)
        for i, row in enumerate(rows[first : first + room], start=first):
            head = f"{row.id:<{idw}}  {state_of(row):<17}  {age(now - row.updated):>4}  "
            title = row.title or "(no prompt yet)"
            line = _row(head, title, row.workspace if self.all else None, width - 3)
            if i == self.selected:
                out.append(("class:selected", CURSOR + line))
            else:
                out.append(("", f"  {line}"))
            out.append(("", "\n"))
        out.append(
            (
                "class:hint",
                f"↑↓ move · type to filter · ⏎ continue · tab {other} · esc cancel",
            )
        )
        return out


def _row(head: str, title: str, workspace: str | None, width: int) -> str:
    """``head title [workspace]`` in ``width``: the title gives way first, then the middle of
    the workspace's path."""
    if workspace is None:
        return shorten_end(head + title, width)
    tag = f"  [{workspace or '?'}]"
    room = width - len(head) - len(tag)
    if room >= 12 or room >= len(title):
        return head + shorten_end(title, room) + tag
    title = shorten_end(title, 12)
    return head + title + f"  [{shorten_middle(workspace, width - len(head) - len(title) - 4)}]"


def state_of(row: SessionInfo) -> str:
    return "corrupt" if row.error else row.state.value


def _application(picker: Picker) -> Application[str | None]:
    kb = KeyBindings()

    @kb.add("up")
    @kb.add("c-p")
    def _up(event: KeyPressEvent) -> None:
        picker.move(-1)

    @kb.add("down")
    @kb.add("c-n")
    def _down(event: KeyPressEvent) -> None:
        picker.move(1)

    @kb.add("pageup")
    def _pgup(event: KeyPressEvent) -> None:
        picker.move(-10)

    @kb.add("pagedown")
    def _pgdown(event: KeyPressEvent) -> None:
        picker.move(10)

    @kb.add("tab")
    def _tab(event: KeyPressEvent) -> None:
        picker.toggle()

    @kb.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        chosen = picker.chosen()
        if chosen is not None:
            event.app.exit(result=chosen)

    @kb.add("escape", eager=True)
    @kb.add("c-c")
    @kb.add("c-d")
    def _cancel(event: KeyPressEvent) -> None:
        event.app.exit(result=None)

    @kb.add("backspace")
    def _back(event: KeyPressEvent) -> None:
        picker.backspace()

    @kb.add(Keys.Any)
    def _type(event: KeyPressEvent) -> None:
        if event.data.isprintable():
            picker.type(event.data)

    def text() -> StyleAndTextTuples:
        size = app.output.get_size()
        return picker.fragments(size.columns, size.rows)

    app: Application[str | None] = Application(
        layout=Layout(HSplit([Window(FormattedTextControl(text, focusable=True))])),
        key_bindings=kb,
        style=STYLE,
        full_screen=False,
        erase_when_done=True,
        mouse_support=False,
        color_depth=ColorDepth.DEPTH_1_BIT if "NO_COLOR" in os.environ else None,
    )
    app.ttimeoutlen = 0.05
    return app


async def pick_session_async(store: JsonlSessionStore, workspace: Path) -> str | None:
    """The picker in a running event loop; the chosen session id, or None (esc)."""
    return await _application(Picker(store, workspace)).run_async()


def pick_session(store: JsonlSessionStore, workspace: Path) -> str | None:
    """Let the person pick a session to resume; None when they cancel. Writes nothing."""
    return asyncio.run(pick_session_async(store, workspace))


# --------------------------------------------------------------------------------------------
# the input's completer


class WorkspaceCompleter(Completer):
    """``/`` at the start completes a command; ``@`` completes a path in the workspace."""

    def __init__(self, workspace: Path, commands: dict[str, str]) -> None:
        self.workspace = workspace
        self.commands = commands
        self._files: tuple[float, list[str]] = (0.0, [])

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterator[Completion]:
        before = document.text_before_cursor
        if before.startswith("/") and not any(c.isspace() for c in before):
            for name, meta in self.commands.items():
                if name.startswith(before):
                    yield Completion(name, -len(before), display_meta=meta)
            return
        match = re.search(r"@([^\s@]*)$", before)
        if match is None:
            return
        fragment = match.group(1)
        low = fragment.lower()
        files = self.files()
        ranked = [p for p in files if p.lower().startswith(low)]
        ranked += [p for p in files if low in p.lower() and not p.lower().startswith(low)]
        for path in ranked[:50]:
            yield Completion("@" + path, -len(fragment) - 1, display=path)

    def files(self) -> list[str]:
        stamp, files = self._files
        if time.monotonic() - stamp < 5:
            return files
        files = []
        for root, dirs, names in os.walk(self.workspace):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP and not d.startswith("."))
            rel = os.path.relpath(root, self.workspace)
            prefix = "" if rel == "." else rel + "/"
            files += [prefix + d + "/" for d in dirs]
            files += [prefix + n for n in sorted(names)]
            if len(files) > 5000:
                break
        self._files = (time.monotonic(), files)
        return files


_SKIP = frozenset({"node_modules", "__pycache__", "venv", "dist", "build", "target"})
