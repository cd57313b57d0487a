"""Pickers: the resume picker, the model profiles ``/model`` picks from, and the completer that
picks a command or a workspace file.

The resume picker: one row per session, with the state kiso would resume into, in words.

It opens on the sessions that started in this directory; tab shows every workspace, each row then
tagged with where it started. Arrows move, typing filters, enter picks, esc cancels. It reads the
listing only: no session is opened, no writer lock taken.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
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

from kiso.kernel import KisoError, SessionInfo, StoreError, UsageError
from kiso.kernel.jsonl import JsonlSessionStore
from kiso.providers.registry import check_effort, lookup
from kiso.runtime.config import Config
from kiso.runtime.models import ResolvedModel

from .records import age
from .render import CURSOR, shorten_end, shorten_middle

__all__ = [
    "Picker",
    "ProfileRow",
    "WorkspaceCompleter",
    "model_args",
    "pick_session",
    "pick_session_async",
    "profile_rows",
    "switch_model",
]

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
# the model profiles /model picks from


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One model ``/model`` offers: a profile, or the model in use when it is none of them."""

    name: str
    detail: str
    """Its kind and model id, in use or not, available or why not, its effort levels."""
    available: bool
    in_use: bool
    profile: str | None
    """The profile to switch to (None: the model in use, which is no profile)."""
    state: str = "available"
    """``available``, or ``unavailable: <why>``."""


def _levels(levels: tuple[str, ...], chosen: str | None) -> str:
    if not levels:
        return " · no effort levels"
    now = f" (set: {chosen})" if chosen else ""
    return f" · effort {'/'.join(levels)}{now}"


def profile_rows(config: Config, resolved: ResolvedModel, home: Path) -> list[ProfileRow]:
    """Every profile, and the model in use if it is none of them: available when its key can be
    found the way a switch would find it (why not, otherwise; a key is never shown), and the
    effort levels its model accepts."""
    from kiso.runtime.models import resolve_model

    current = resolved.profile
    rows: list[ProfileRow] = []
    if current is None or current.name not in config.models:
        levels = lookup(current.model).efforts if current is not None else ()
        name = current.name if current is not None else "faux"
        detail = f"{resolved.describe()} · in use{_levels(levels, None)}"
        rows.append(ProfileRow(name, detail, True, True, None))
    for name, profile in sorted(config.models.items()):
        try:
            resolve_model(dataclasses.replace(config, model=name), home=home)
            state, available = "available", True
        except KisoError as exc:
            state, available = f"unavailable: {exc}", False
        in_use = current is not None and current.name == name
        efforts = _levels(lookup(profile.model).efforts, profile.effort)
        detail = f"{profile.kind} {profile.model}{' · in use' if in_use else ''} · {state}{efforts}"
        rows.append(ProfileRow(name, detail, available, in_use, name, state))
    return rows


def switch_model(
    config: Config, name: str, effort: str | None, home: Path
) -> tuple[ResolvedModel, Config]:
    """The model ``/model NAME [EFFORT]`` selects, and the config with that effort recorded on
    its profile. An effort the model does not accept is refused by name, with its levels."""
    from kiso.runtime.models import resolve_model

    models = dict(config.models)
    if effort is not None and name in models:
        models[name] = dataclasses.replace(models[name], effort=effort)
    resolved = resolve_model(dataclasses.replace(config, model=name, models=models), home=home)
    if effort is not None:
        if resolved.profile is None:
            raise UsageError("the scripted model takes no effort setting")
        check_effort(resolved.profile.model, effort)
        resolved = dataclasses.replace(
            resolved, profile=dataclasses.replace(resolved.profile, effort=effort)
        )
    return resolved, dataclasses.replace(config, models=models)


def model_args(arg: str) -> tuple[str, str | None]:
    """``NAME [EFFORT]``, as ``/model`` takes them."""
    parts = arg.split()
    if not parts:
        return "", None
    return parts[0], (parts[1] if len(parts) > 1 else None)


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
