"""The interactive session: ``kiso [sessionId]``, ``kiso chat``, ``kiso resume <id> [prompt]``.

An inline prompt_toolkit application sits at the bottom of the terminal: the live part of the turn
(the paragraph still streaming, the tool calls still running, the question being asked), the
input, and the status row. Everything finished is printed above it, into the terminal's own
scrollback, rendered by rich. The session is recovery-first: an open run is carried to its end
before anything new starts.

:class:`Repl` turns run events into what is shown and asked, and runs the slash commands; a
:class:`Screen` shows it: :class:`kiso.cli.panels.Tui` on a terminal, :class:`Plain` (plain lines,
numbered questions, no escape code) when stdout is not one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from rich.console import RenderableType
from rich.text import Text

from kiso.kernel import (
    Assistant,
    ExecutionFinished,
    KisoError,
    Outcome,
    RunStarted,
    ToolCall,
    Uncertain,
    kiso_home,
)
from kiso.providers.registry import lookup
from kiso.runtime import Session, stream

from .panels import Option, Panel, Tui, approval_panel, call_view, uncertain_panel
from .render import (
    MODE_HELP,
    PROMPT,
    Meter,
    Policy,
    Printer,
    StreamText,
    duration,
    error_text,
    help_view,
    last_view,
    markdown,
    meter,
    modes_view,
    prompt_echo,
    record_text,
    report,
    running_card,
    shorten_end,
    status_row,
    target_of,
    warning_text,
    write,
)

if TYPE_CHECKING:
    from kiso.cli.setup import RunOptions, Setup

__all__ = ["Repl", "Screen", "run_interactive"]

RESUME = object()
"""Queued instead of a prompt: carry the (new) session's open run forward."""
TAIL = 3
"""How many of a running call's latest output lines its card shows."""


class Screen(Protocol):
    """Where the session is shown: the terminal UI, or plain lines for a pipe."""

    def width(self) -> int: ...

    async def show(self, item: RenderableType) -> None: ...

    def refresh(self) -> None: ...

    async def ask(self, panel: Panel) -> Option | None:
        """The chosen option (None: esc, stop); a denial's reason is in ``panel.reason``."""
        ...

    async def pick(self) -> str | None: ...

    def clear(self) -> None: ...

    def exit(self, code: int) -> None: ...

    async def run(self) -> int: ...


def run_interactive(
    *,
    session_id: str | None,
    model: str | None,
    mode: str | None,
    prompt: str | None = None,
    must_exist: bool = False,
    options: RunOptions | None = None,
) -> int:
    """Run the interactive session; the process exit code."""
    from kiso.cli.setup import open_session, prepare

    try:
        setup = prepare(model=model, mode=mode, options=options)
        session = open_session(setup, session_id, must_exist=must_exist)
    except KisoError as exc:
        print(f"kiso: {exc}", file=sys.stderr)
        return 1
    repl = Repl(setup, session, Policy.detect())
    try:
        return asyncio.run(repl.main(prompt))
    finally:
        repl.session.close()


class Repl:
    def __init__(self, setup: Setup, session: Session, policy: Policy) -> None:
        self.setup = setup
        self.session = session
        self.policy = policy
        self.printer = Printer(policy)
        self.text = StreamText()
        self.cards: dict[str, tuple[ToolCall, float]] = {}
        self.tails: dict[str, str] = {}  # call id -> the latest output of a running call
        self.running_since: float | None = None
        self.thinking = False
        self.last_tool: tuple[ToolCall, ExecutionFinished] | None = None
        self.last_outcome: Outcome | None = None
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.exiting: int | None = None
        self.meter = Meter()
        self.screen: Screen

    # ------------------------------------------------------------------ facts

    @property
    def running(self) -> bool:
        return self.running_since is not None

    @property
    def model(self) -> str:
        return self.setup.agent.adapter.model

    def window(self) -> int:
        profile = self.setup.resolved.profile
        if profile is not None and profile.context_window:
            return profile.context_window
        return lookup(self.model).context_window

    def update_meter(self) -> None:
        self.meter = meter(self.session.events, self.window())

    def status(self, width: int) -> str:
        return status_row(
            mode=self.session.mode,
            model=self.model,
            m=self.meter,
            width=width,
            floor=self.setup.agent.floor,
        )

    def working(self, width: int) -> str:
        if self.running_since is None:
            return ""
        secs = int(time.monotonic() - self.running_since)
        parts = [f"✦ {'thinking' if self.thinking else 'working'} {secs}s", "esc stop"]
        if self.queue.qsize():
            parts.append(f"{self.queue.qsize()} queued")
        return " · ".join(parts)[:width]

    def live_cards(self, width: int) -> list[str]:
        """The running calls, each with the last lines of the output it has reported so far."""
        now = time.monotonic()
        lines: list[str] = []
        for call_id, (call, began) in self.cards.items():
            lines.append(running_card(call, (now - began) * 1000, width))
            tail = [ln for ln in self.tails.get(call_id, "").splitlines() if ln.strip()][-TAIL:]
            for i, text in enumerate(tail):
                lines.append(shorten_end(("  └ " if i == 0 else "    ") + text, width))
        return lines

    def banner(self) -> Text:
        s = self.session
        where = "new session" if not s.events else f"{len(s.events)} events, {s.state.value}"
        return Text(
            f"kiso · session {s.id} ({where}) · {self.setup.resolved.describe()} · "
            f"{self.setup.workspace}\n? shows the keys · /help the commands",
            style="bold",
        )

    # ------------------------------------------------------------------ the main loop

    async def main(self, prompt: str | None) -> int:
        self.screen = Tui(self) if self.policy.ansi else Plain(self)
        self.update_meter()
        await self.screen.show(self.banner())
        if self.session.fold.open_run is not None:
            self.queue.put_nowait(RESUME)
        if prompt:
            self.queue.put_nowait(prompt)
        code = await self.screen.run()
        s = self.session
        await self.screen.show(Text(f"session {s.id} ({s.state.value}) · kiso resume {s.id}"))
        return code

    async def worker(self, *, wait: bool = True) -> None:
        """Take queued prompts one at a time; each runs to its end before the next starts."""
        while self.exiting is None and (wait or not self.queue.empty()):
            item = await self.queue.get()
            try:
                if item is RESUME:
                    await self.drive(self.session.resume())
                elif isinstance(item, str):
                    await self.run_prompt(item)
            except Exception as exc:  # a bug must not take the session down with it
                await self.screen.show(error_text(f"✗ internal error: {type(exc).__name__}: {exc}"))
        if self.exiting is not None:
            self.screen.exit(self.exiting)

    def submit(self, text: str) -> None:
        """A line from the input: a command now, a prompt when the current run is over."""
        line = text.strip()
        if not line:
            return
        if line.startswith("/"):
            task = asyncio.ensure_future(self.command(line))
            task.add_done_callback(report)
        else:
            self.queue.put_nowait(text)
            self.screen.refresh()

    def abort(self) -> None:
        if self.running:
            self.session.abort()

    def quit(self, code: int = 0) -> None:
        if self.running:
            self.exiting = code
            self.session.abort()
        else:
            self.screen.exit(code)

    def quit_code(self) -> int:
        """ctrl+d right after a run that ended in an error exits 1; otherwise 0."""
        outcome = self.last_outcome
        return 1 if outcome is not None and outcome.kind == "error" else 0

    async def run_prompt(self, text: str, *, echo: bool = True) -> None:
        if echo:
            await self.screen.show(prompt_echo(text))
        if self.session.fold.open_run is not None:
            await self.drive(self.session.resume())
            if self.session.fold.open_run is not None:
                await self.screen.show(
                    warning_text("the open run still waits for an answer; it was asked again")
                )
                return
        await self.drive(self.session.run(text))

    # ------------------------------------------------------------------ run events

    async def drive(self, events: AsyncIterator[stream.RunEvent]) -> None:
        self.running_since = time.monotonic()
        self.last_outcome = None
        ticker = asyncio.ensure_future(self._tick())
        try:
            async with contextlib.aclosing(events) as agen:  # type: ignore[type-var]
                async for ev in agen:
                    await self.handle(ev)
        except KisoError as exc:
            await self.screen.show(error_text(f"✗ {exc}"))
        finally:
            ticker.cancel()
            rest = self.text.flush()
            self.running_since = None
            self.thinking = False
            self.cards.clear()
            if rest:
                await self.screen.show(markdown(rest))
            self.update_meter()
            self.screen.refresh()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.screen.refresh()

    async def flush_text(self) -> None:
        rest = self.text.flush()
        if rest:
            await self.screen.show(markdown(rest))

    async def handle(self, ev: stream.RunEvent) -> None:
        show = self.screen.show
        ws = self.setup.workspace
        if isinstance(ev, stream.TextDelta):
            self.thinking = False
            for block in self.text.feed(ev.text):
                await show(markdown(block))
        elif isinstance(ev, stream.ThinkingDelta):
            self.thinking = True
        elif isinstance(ev, stream.Retry):
            await show(
                warning_text(f"retrying in {ev.delay:.1f}s (attempt {ev.attempt}): {ev.error}")
            )
        elif isinstance(ev, stream.ModelTurn):
            self.thinking = False
            await self.flush_text()
            self.update_meter()
        elif isinstance(ev, stream.Decision):
            await self._decision(ev)
        elif isinstance(ev, stream.ApprovalRequest):
            await self.flush_text()
            offer = ev.offer or self.session.offer(ev.call_id)  # the runtime decided it
            await show(call_view(ev.call, ws, warning=offer.warning))
            await self._approve(ev.call, approval_panel(ev.call, offer))
        elif isinstance(ev, stream.ToolStart):
            self.cards[ev.call.call_id] = (ev.call, time.monotonic())
        elif isinstance(ev, stream.ToolOutput):
            # a live tail: display only (the receipt in the log keeps the whole output)
            tail = self.tails.get(ev.call.call_id, "") + ev.text
            self.tails[ev.call.call_id] = tail[-4000:]
        elif isinstance(ev, stream.ToolEnd):
            self.cards.pop(ev.call.call_id, None)
            self.tails.pop(ev.call.call_id, None)
            self.last_tool = (ev.call, ev.event)
            await show(record_text(ev.call, ev.event, self.screen.width()))
        elif isinstance(ev, stream.UncertainPending):
            await self.flush_text()
            for u in ev.executions:
                if not u.auto_rerun and not await self._rule(u):
                    return
        elif isinstance(ev, stream.Ruling):
            r = ev.event
            said = f"{r.resolution} ({r.decided_by})"
            await show(Text(f"  ↻ {r.execution_id} was interrupted: {said}"))
        elif isinstance(ev, stream.Paused):
            await show(
                warning_text(
                    f"the run is paused ({ev.reason}): the next prompt, or "
                    f"`kiso resume {self.session.id}`, asks again"
                )
            )
        elif isinstance(ev, stream.Terminal):
            await self.flush_text()
            await self._ended(ev.outcome)
        self.screen.refresh()

    async def _decision(self, ev: stream.Decision) -> None:
        d = ev.event
        if d.decided_by == "user" or d.decision != "denied":
            return
        call = ev.call
        what = f"{call.name} {shorten_end(target_of(call), 60)}" if call else d.call_id
        await self.screen.show(Text(f"  ✗ {what} denied by {d.decided_by}: {d.reason or ''}"))

    async def _approve(self, call: ToolCall, panel: Panel) -> None:
        choice = await self.screen.ask(panel)
        session = self.session
        if choice is None:
            session.deny(call.call_id, "the user stopped the run")
            session.abort()
            await self.screen.show(Text("  ✗ stopped"))
        elif choice.action == "always":
            try:
                session.approve(call.call_id, always=True)
                rule = getattr(session.events[-1], "rule", None)
                await self.screen.show(Text(f"  ✓ approved · won't ask again: {rule}"))
            except KisoError as exc:
                session.approve(call.call_id)
                await self.screen.show(warning_text(f"  ✓ approved this once: {exc}"))
        elif choice.action == "no":
            why = panel.reason.strip()
            session.deny(call.call_id, why or None)
            await self.screen.show(Text(f"  ✗ denied{': ' + why if why else ''}"))
        else:
            session.approve(call.call_id)
            await self.screen.show(Text("  ✓ approved"))

    async def _rule(self, u: Uncertain) -> bool:
        call = ToolCall(u.call_id, u.name, u.input)
        heading = f"● interrupted execution: {u.name} ({u.execution_id})"
        await self.screen.show(call_view(call, self.setup.workspace, heading=heading))
        choice = await self.screen.ask(uncertain_panel(u))
        if choice is None:
            return False  # the run pauses, the question stays on disk
        self.session.resolve(u.execution_id, choice.action)
        await self.screen.show(Text(f"  ✓ {choice.label}"))
        return True

    async def _ended(self, outcome: Outcome) -> None:
        self.last_outcome = outcome
        self.update_meter()
        took = duration((time.monotonic() - (self.running_since or time.monotonic())) * 1000)
        if outcome.kind == "error":
            await self.screen.show(error_text(f"✗ {outcome.message} ({outcome.code})"))
            keyless = self.setup.resolved.profile is None and not self.setup.resolved.faux_script
            if outcome.code == "script_exhausted" and keyless:
                # The keyless demo is over: exit non-zero with the set-a-key message (by design).
                self.quit(1)
            return
        if outcome.kind == "aborted":
            await self.screen.show(Text(f"✦ aborted by {outcome.by} · took {took}"))
            return
        if outcome.kind != "completed":
            await self.screen.show(warning_text(f"the run ended: {outcome.kind}"))
        m = self.meter
        facts = [f"took {took}"]
        turns = self._run_turns()
        if any(t.usage.output is not None for t in turns):
            fresh = sum(t.usage.input or 0 for t in turns)
            out = sum(t.usage.output or 0 for t in turns)
            facts.append(f"in {fresh} out {out}")
        if m.cache_hit is not None:
            facts.append(f"cache {m.cache_hit}%")
        if m.ctx_left is not None:
            facts.append(f"ctx left ~{m.ctx_left}%")
        await self.screen.show(Text("✦ " + " · ".join(facts)))

    def _run_turns(self) -> list[Assistant]:
        """The model turns of the last run."""
        turns: list[Assistant] = []
        for e in self.session.events:
            if isinstance(e, RunStarted):
                turns = []
            elif isinstance(e, Assistant):
                turns.append(e)
        return turns

    # ------------------------------------------------------------------ commands

    async def command(self, line: str, *, echo: bool = True) -> None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        show = self.screen.show
        if echo:
            await show(prompt_echo(line))
        if name in ("/exit", "/quit"):
            self.quit(0)
        elif name == "/help":
            await show(help_view())
        elif name == "/mode":
            await self._mode(arg)
        elif name == "/model":
            if arg:
                await self._switch_model(arg)
            else:
                await show(self._models())
        elif name == "/status":
            await show(self._status())
        elif name == "/last":
            await show(self.last_view(full=True))
        elif name == "/clear":
            self.screen.clear()
        elif name == "/compact":
            await show(Text("compaction is not available yet; the context is kept whole"))
        elif name == "/resume":
            await self._resume()
        else:
            await show(error_text(f"unknown command {name}; /help lists them"))

    async def _mode(self, arg: str) -> None:
        if not arg:
            await self.screen.show(modes_view(self.session.mode))
            return
        try:
            self.session.set_mode(arg)  # the runtime records it (setting_changed)
        except KisoError as exc:
            await self.screen.show(error_text(str(exc)))
            return
        await self.screen.show(Text(f"mode: {arg} · {MODE_HELP[arg]}"))
        self.screen.refresh()

    async def _switch_model(self, name: str) -> None:
        """Switch the session's model for the turns that follow."""
        from kiso.runtime.models import build_adapter, resolve_model

        try:
            resolved = resolve_model(
                dataclasses.replace(self.setup.config, model=name), home=kiso_home()
            )
            adapter = build_adapter(resolved)
        except KisoError as exc:
            await self.screen.show(error_text(str(exc)))
            return
        agent = self.setup.agent
        agent.adapter = adapter
        agent.profile = resolved.profile.name if resolved.profile else None
        agent.strip_env = resolved.strip_env
        self.setup = dataclasses.replace(self.setup, resolved=resolved)
        self.session.record_setting("model", name)
        await self.screen.show(Text(f"model: {resolved.describe()} (for the turns that follow)"))
        self.screen.refresh()

    def _models(self) -> RenderableType:
        from kiso.runtime.models import resolve_model

        config = self.setup.config
        current = self.setup.resolved.profile
        lines = [f"model now: {self.setup.resolved.describe()}"]
        for name, profile in sorted(config.models.items()):
            try:
                resolve_model(dataclasses.replace(config, model=name), home=kiso_home())
                state = "available"
            except KisoError as exc:
                state = f"unavailable: {exc}"
            mark = "▸" if current is not None and current.name == name else " "
            lines.append(f"{mark} {name:<14} {profile.kind} {profile.model} · {state}")
        if not config.models:
            lines.append("no profiles in ~/.kiso/config.json (docs/providers.md shows the shape)")
        lines.append("/model NAME switches this session's model for the turns that follow")
        return Text("\n".join(lines))

    def _status(self) -> RenderableType:
        s, m = self.session, self.meter
        ctx = f"~{m.ctx_left}% left" if m.ctx_left is not None else "unknown"
        lines = [
            f"session    {s.id} ({s.state.value}, {len(s.events)} events)",
            f"workspace  {self.setup.workspace}",
            f"model      {self.setup.resolved.describe()}",
            f"mode       {s.mode}{'' if self.setup.agent.floor else ' · floor off'}",
            f"context    {ctx} of {self.window():,} tokens",
            f"rules      {self.setup.agent.rules.path}",
        ]
        if m.turn is not None:
            u = m.turn.usage
            lines.append(
                f"last turn  in {_n(u.input)} out {_n(u.output)} cache read {_n(u.cache_read)} "
                f"write {_n(u.cache_write)} · {m.turn.ms} ms"
            )
        return Text("\n".join(lines))

    def last_view(self, *, full: bool) -> RenderableType:
        if self.last_tool is None:
            return Text("no tool call yet")
        call, finished = self.last_tool
        return last_view(call, finished, self.screen.width(), full=full)

    async def _resume(self) -> None:
        from kiso.cli.setup import open_session

        if self.running:
            await self.screen.show(warning_text("a run is going: stop it (esc) first"))
            return
        chosen = await self.screen.pick()
        if chosen is None or chosen == self.session.id:
            return
        try:
            new = open_session(self.setup, chosen)
        except KisoError as exc:
            await self.screen.show(error_text(str(exc)))
            return
        old, self.session = self.session, new
        old.close()
        self.last_tool = None
        self.update_meter()
        await self.screen.show(self.banner())
        self.queue.put_nowait(RESUME)


def _n(count: int | None) -> str:
    return "?" if count is None else str(count)


# ---------------------------------------------------------------------------------------------
# a stdout that is not a terminal: plain lines, no escape codes


class Plain:
    """Reads lines from stdin and prints plain text; questions become numbered prompts."""

    def __init__(self, repl: Repl) -> None:
        self.repl = repl

    def width(self) -> int:
        return shutil.get_terminal_size((100, 24)).columns

    async def show(self, item: RenderableType) -> None:
        write(self.repl.printer.render(item, self.width()))

    def refresh(self) -> None:
        pass

    def clear(self) -> None:
        pass

    def exit(self, code: int) -> None:
        self.repl.exiting = code

    async def line(self, prompt: str) -> str | None:
        write(prompt)
        text = await asyncio.to_thread(sys.stdin.readline)
        return text.rstrip("\n") if text else None

    async def ask(self, panel: Panel) -> Option | None:
        rows = [f"  {i}. {o.label} {o.detail}".rstrip() for i, o in enumerate(panel.options, 1)]
        await self.show(Text("\n".join([panel.question, *rows])))
        while True:
            answer = await self.line(f"choose 1-{len(panel.options)}: ")
            if answer is None:
                return None
            option = panel.pick(int(answer) - 1) if answer.strip().isdigit() else None
            if option is not None:
                if option.action == "no":
                    panel.reason = await self.line("why (the model is told): ") or ""
                return option

    async def pick(self) -> str | None:
        await self.show(Text("the session picker needs a terminal; `kiso sessions` lists them"))
        return None

    async def run(self) -> int:
        repl = self.repl
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGINT, repl.abort)
        await repl.worker(wait=False)
        while repl.exiting is None:
            text = await self.line(PROMPT)
            if text is None:
                return repl.quit_code()
            if text.strip().startswith("/"):
                await repl.command(text.strip(), echo=False)  # the line is on screen already
            elif text.strip():
                await repl.run_prompt(text, echo=False)
        return repl.exiting
