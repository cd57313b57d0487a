"""The interactive session: ``kiso [sessionId]``, ``kiso chat``, ``kiso resume <id> [prompt]``.

An inline prompt_toolkit application sits at the bottom of the terminal: the live part of the turn
(the paragraph still streaming, the tool calls still running, the question being asked), the
input, and the status row. Everything finished is printed above it, into the terminal's own
scrollback, rendered by rich. The session is recovery-first: an open run is carried to its end
before anything new starts.

A new session is created when its first prompt is sent, not before: quitting before that leaves
no session behind (settings changed before it are recorded when it is created). An existing
session opens at once, and shows the last few turns of its conversation from its log.

:class:`Repl` turns run events into what is shown and asked, and runs the slash commands; a
:class:`Screen` shows it: :class:`kiso.cli.panels.Tui` on a terminal, :class:`Plain` (plain lines,
numbered questions, no escape code) when stdout is not one. docs/interactive.md is the reference
for every key and command.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

from rich.console import Group, RenderableType
from rich.text import Text

from kiso.kernel import (
    Assistant,
    ExecutionFinished,
    JsonlSessionStore,
    KisoError,
    Outcome,
    RunStarted,
    SessionNotFoundError,
    ToolCall,
    Uncertain,
    Usage,
    ascii_int,
    billed,
    kiso_home,
    new_id,
)
from kiso.providers.registry import cost, lookup
from kiso.runtime import Session, release, stream
from kiso.runtime.approvals import check_mode
from kiso.runtime.command_hooks import route_reports
from kiso.runtime.context import Ledger, ledger
from kiso.runtime.prompt import estimate_tokens
from kiso.runtime.session import check_prompt_fits
from kiso.runtime.skills import find_skill, skill_turn, skills_prompt
from kiso.tools.tasks import TASKS_TOOL, current_tasks, render_tasks

from .panels import (
    NARROWER,
    Option,
    Panel,
    Tui,
    approval_panel,
    call_view,
    history_path,
    uncertain_panel,
)
from .picker import model_args, profile_rows, switch_model
from .records import (
    duration,
    last_view,
    record_text,
    running_card,
    target_of,
    transcript,
)
from .render import (
    MODE_HELP,
    PROMPT,
    Policy,
    Printer,
    StreamText,
    error_text,
    help_view,
    markdown,
    modes_view,
    prompt_echo,
    report,
    shorten_end,
    warning_text,
    write,
)
from .rules_view import rules_rows
from .status import (
    Meter,
    Streamed,
    meter,
    money,
    sandbox_line,
    spend,
    status_row,
    working_row,
)
from .theme import UNKNOWN, Palette, choose_theme, query_background

if TYPE_CHECKING:
    from kiso.cli.ask_panel import LateAsker
    from kiso.cli.setup import RunOptions, Setup

__all__ = ["Repl", "Screen", "run_interactive"]

RESUME = object()
"""Queued instead of a prompt: carry the (new) session's open run forward."""
RECENT_RUNS = 3
"""How many of its last runs a resumed session shows from its log."""


class Screen(Protocol):
    """Where the session is shown: the terminal UI, or plain lines for a pipe."""

    def width(self) -> int: ...

    async def show(self, item: RenderableType) -> None: ...

    def refresh(self) -> None: ...

    async def ask(self, panel: Panel) -> Option | None:
        """The chosen option (None: esc, stop); a typed answer is in ``panel.reason``."""
        ...

    async def pick(self) -> str | None: ...

    def copy(self, text: str) -> bool:
        """Put ``text`` on the clipboard; False when this screen cannot."""
        ...

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
    from kiso.cli.ask_panel import LateAsker
    from kiso.cli.setup import close_setup, open_session, prepare
    from kiso.cli.trust import ask_on_terminal

    policy = Policy.detect()
    asker = LateAsker()  # ask_user puts its questions on the screen, once there is one
    setup: Setup | None = None
    try:
        setup = prepare(
            model=model,
            mode=mode,
            options=options,
            ask_trust=ask_on_terminal,
            asker=asker,
        )
        session = None
        if must_exist or (session_id is not None and _exists(setup, session_id)):
            session = open_session(setup, session_id, must_exist=must_exist)
        palette = choose_theme(
            configured=setup.config.theme, environ=os.environ, ask=_terminal_asker(policy)
        )
    except KisoError as exc:
        if setup is not None:
            close_setup(setup)
        print(f"kiso: {exc}", file=sys.stderr)
        return 1
    repl = Repl(setup, session, policy, session_id=session_id, palette=palette)
    repl.asker = asker
    try:
        return asyncio.run(repl.main(prompt))
    finally:
        if repl.session is not None:
            repl.session.close()
        close_setup(repl.setup)


def _exists(setup: Setup, session_id: str) -> bool:
    """Is there a log for ``session_id``? (A malformed id is an error, said at once.)"""
    store = setup.agent.store
    try:
        if isinstance(store, JsonlSessionStore):
            store.path_of(session_id)
        else:
            store.load(session_id)
    except SessionNotFoundError:
        return False
    return True


def _terminal_asker(policy: Policy) -> Callable[[], str | None] | None:
    """How to ask the terminal for its background, or None when it may not be asked (a pipe on
    either side, or NO_COLOR)."""
    try:
        tty = sys.stdin.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not (policy.color and tty):
        return None
    return lambda: query_background(sys.stdin.fileno(), sys.stdout.fileno())


class Repl:
    def __init__(
        self,
        setup: Setup,
        session: Session | None,
        policy: Policy,
        *,
        session_id: str | None = None,
        palette: Palette = UNKNOWN,
    ) -> None:
        self.setup = setup
        self.asker: LateAsker | None = None
        """Where ask_user's questions go (its screen is set when the session's UI starts)."""
        self.session = session
        """None until the first prompt creates it (an existing session is opened at once)."""
        self.session_id = session.id if session is not None else (session_id or new_id())
        self.pending: list[tuple[str, str]] = []
        """Settings changed before the session existed: recorded when it is created."""
        self.policy = policy
        self.printer = Printer(policy, palette)
        self.text = StreamText()
        self.cards: dict[str, tuple[ToolCall, float]] = {}
        self.tails: dict[str, str] = {}  # call id -> the latest output of a running call
        self.running_since: float | None = None
        self.thinking = False
        self.streamed = Streamed()
        self.last_tool: tuple[ToolCall, ExecutionFinished] | None = None
        self.last_outcome: Outcome | None = None
        self.queue: deque[object] = deque()
        self.wake = asyncio.Event()
        self.exiting: int | None = None
        self.meter = Meter()
        self.hook_notes: list[str] = []
        """What the config's command hooks said out loud (failures), shown above the prompt."""
        route_reports(setup.agent.hooks.hooks, self.hook_notes.append)
        self.screen: Screen

    # ------------------------------------------------------------------ facts

    @property
    def running(self) -> bool:
        return self.running_since is not None

    @property
    def model(self) -> str:
        return self.setup.agent.adapter.model

    @property
    def mode(self) -> str:
        if self.session is not None:
            return self.session.mode
        modes = [v for k, v in self.pending if k == "mode"]
        return modes[-1] if modes else self.setup.agent.mode

    def window(self) -> int:
        return self.setup.agent.window.tokens

    def ledger(self) -> Ledger | None:
        """The rent of the next request by part (``/context``), from the runtime's numbers."""
        s = self.session
        if s is None:
            return None
        appends = dict(self.setup.extensions.appends())
        index = skills_prompt(self.setup.skills)
        if index:
            appends["skills index"] = index
        return ledger(
            events=s.events,
            messages=s.fold.messages,
            anchors=s.fold.anchors,
            system=s.system_prompt,
            specs=self.setup.agent.tool_specs(),
            window=self.setup.agent.window.current(),
            appends=appends,
        )

    def update_meter(self) -> None:
        rent = self.ledger()
        used = rent.total if rent is not None and rent.measured else None
        self.meter = meter(self.session.events if self.session else (), self.window(), used=used)

    def cost(self) -> str:
        return spend(self.session.events if self.session else (), self.model)

    def status(self, width: int) -> str:
        return status_row(
            mode=self.mode,
            model=self.model,
            m=self.meter,
            width=width,
            floor=self.setup.agent.floor,
            cost=self.cost(),
        )

    def working(self, width: int) -> str:
        if self.running_since is None:
            return ""
        return working_row(
            thinking=self.thinking,
            seconds=int(time.monotonic() - self.running_since),
            streamed=self.streamed,
            queued=len(self.queued()),
            ctx_left=self.meter.ctx_left,
            width=width,
        )

    def live_cards(self, width: int) -> list[str]:
        """The running calls, each with the last lines of the output it has reported so far."""
        now = time.monotonic()
        lines: list[str] = []
        for call_id, (call, began) in self.cards.items():
            lines += running_card(call, (now - began) * 1000, self.tails.get(call_id, ""), width)
        return lines

    def banner(self, *, first: bool = False) -> RenderableType:
        """The session's heading; the ``first`` one of the process also carries the one-line
        notice of a newer kiso, when this start's release check knows of one."""
        s = self.session
        if s is None:
            where = "new: saved when the first prompt is sent"
        elif not s.events:
            where = "new session"
        else:
            where = f"{len(s.events)} events, {s.state.value}"
        head = Text(
            f"kiso · session {self.session_id} ({where})\n"
            f"{self.setup.resolved.describe()} · {self.setup.workspace}\n"
            "? shows the keys · /help the commands",
            style="bold",
        )
        lines: list[RenderableType] = [head]
        lines += [warning_text(f"⚠ {n}") for n in self.setup.notices]
        news = release.notice() if first else None
        if news is not None:
            lines.append(Text(news))
        return Group(*lines)

    def recent(self) -> RenderableType | None:
        """The last few turns of an existing session's conversation, from its log."""
        if self.session is None or not self.session.events:
            return None
        shown = transcript(self.session.events, self.screen.width(), runs=RECENT_RUNS)
        return Group(*shown) if shown else None

    def transcript(self) -> RenderableType:
        """The whole conversation so far (ctrl+r, /transcript)."""
        if self.session is None or not self.session.events:
            return Text("nothing said yet: the transcript starts with the first prompt")
        shown = transcript(self.session.events, self.screen.width())
        rule = Text("── transcript " + "─" * max(self.screen.width() - 15, 0))
        return Group(rule, *shown, Text("── end of transcript"))

    def last_answer(self) -> str | None:
        """The text the model answered the last prompt with."""
        if self.session is None:
            return None
        parts = [e.text for e in self._run_turns() if e.text.strip()]
        return "\n\n".join(p.strip("\n") for p in parts) or None

    # ------------------------------------------------------------------ the session, once needed

    async def open(self) -> Session | None:
        """The session, created now if this is its first prompt (settings changed before are
        recorded first); None (and the reason shown) when it cannot be created."""
        if self.session is not None:
            return self.session
        from kiso.cli.setup import open_session

        try:
            session = open_session(self.setup, self.session_id)
            for key, value in self.pending:
                session.record_setting(key, value)
        except KisoError as exc:
            await self.screen.show(error_text(f"✗ the session was not created: {exc}"))
            return None
        self.session, self.pending = session, []
        return session

    # ------------------------------------------------------------------ the main loop

    async def main(self, prompt: str | None) -> int:
        self.screen = Tui(self) if self.policy.ansi else Plain(self)
        if self.asker is not None:
            self.asker.screen = self.screen
        self.update_meter()
        await self.screen.show(self.banner(first=True))
        recent = self.recent()
        if recent is not None:
            await self.screen.show(recent)
        if self.session is not None and self.session.fold.open_run is not None:
            self.enqueue(RESUME)
        if prompt:
            self.enqueue(prompt)
        from .stop import Stop

        loop = asyncio.get_running_loop()

        def on_stop(signum: int) -> None:
            # In the signal handler, before the loop reads the terminal's end of input: the run
            # is told at once who stopped it; the rest is done on the loop.
            if self.running and self.session is not None:
                self.session.abort(signal.Signals(signum).name)
            loop.call_soon_threadsafe(self.stop, signum)

        stop = Stop(on_stop).install()  # SIGTERM, SIGHUP: stop the run as esc does, then exit
        try:
            code = await self.screen.run()
        finally:
            stop.restore()
            stop.done()
        if stop.code is not None:
            code = stop.code
        s = self.session
        if s is None:
            await self.screen.show(Text("nothing was sent, so no session was saved"))
        else:
            await self.screen.show(Text(f"session {s.id} ({s.state.value}) · kiso resume {s.id}"))
        return code

    def enqueue(self, item: object, *, first: bool = False) -> None:
        if first:
            self.queue.appendleft(item)
        else:
            self.queue.append(item)
        self.wake.set()

    def queued(self) -> list[str]:
        """The prompts waiting for the current run to end, oldest first."""
        return [item for item in self.queue if isinstance(item, str)]

    def pop_queued(self) -> str | None:
        """Take the last queued prompt back (↑ on an empty input), or None."""
        for i in range(len(self.queue) - 1, -1, -1):
            item = self.queue[i]
            if isinstance(item, str):
                del self.queue[i]
                return item
        return None

    async def worker(self, *, wait: bool = True) -> None:
        """Take queued prompts one at a time; each runs to its end before the next starts."""
        while self.exiting is None:
            if not self.queue:
                if not wait:
                    break
                self.wake.clear()
                await self.wake.wait()
                continue
            item = self.queue.popleft()
            try:
                if item is RESUME and self.session is not None:
                    await self.drive(self.session.resume())
                elif isinstance(item, str):
                    await self.run_prompt(item)
            except Exception as exc:  # a bug must not take the session down with it
                await self.screen.show(error_text(f"✗ internal error: {type(exc).__name__}: {exc}"))
        if self.exiting is not None:
            self.screen.exit(self.exiting)

    def submit(self, text: str, *, redirect: bool = False) -> None:
        """A line from the input: a command now, a prompt when the current run is over.

        ``redirect`` (alt+⏎, ctrl+⏎) while a run is going: the run is stopped where it is (as esc
        stops it: the streaming turn is dropped, a running tool is cancelled, the run ends
        ``aborted``) and the text goes first in the queue, so it is the next prompt the model
        reads, with everything the stopped run committed before it.
        """
        line = text.strip()
        if not line:
            return
        if line.startswith("/"):
            task = asyncio.ensure_future(self.command(line))
            task.add_done_callback(report)
            return
        if redirect and self.running and self.session is not None:
            self.enqueue(text, first=True)
            self.session.abort()
            note = Text("  ↪ redirect: the run stops here and your message goes next")
            asyncio.ensure_future(self.screen.show(note)).add_done_callback(report)
        else:
            self.enqueue(text)
        self.screen.refresh()

    def abort(self) -> None:
        if self.running and self.session is not None:
            self.session.abort()

    def stop(self, signum: int) -> None:
        """SIGTERM or SIGHUP (kiso.cli.stop): the run stops as esc stops it, recorded aborted
        by the signal's name, then kiso exits 128 + the signal's number."""
        from .stop import exit_code, hard

        code = exit_code(signum)
        if self.running and self.session is not None:
            self.exiting = code
            self.session.abort(signal.Signals(signum).name)
            answer = getattr(self.screen, "answer", None)  # a question on screen: nobody answers
            if isinstance(answer, asyncio.Future) and not answer.done():
                answer.set_result(None)
        elif isinstance(self.screen, Plain):
            hard(signum)  # idle, reading stdin in a thread that cannot be interrupted
        else:
            self.screen.exit(code)

    def quit(self, code: int = 0) -> None:
        if self.running and self.session is not None:
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
        from kiso.cli.attach import AttachmentError, expand
        from kiso.providers.registry import supports_images

        try:
            vision = supports_images(self.model)
            sent = expand(text, self.setup.workspace, vision=vision, model=self.model)
        except AttachmentError as exc:
            await self.screen.show(warning_text(str(exc)))
            return
        for line in sent.notes:
            await self.screen.show(Text(line, style="dim"))
        try:
            check_prompt_fits(sent.prompt, self.setup.agent)  # before a session is created
        except KisoError as exc:
            await self.screen.show(error_text(f"✗ {exc}"))
            return
        session = await self.open()
        if session is None:
            return
        if session.fold.open_run is not None:
            await self.drive(session.resume())
            if session.fold.open_run is not None:
                await self.screen.show(
                    warning_text("the open run still waits for an answer; it was asked again")
                )
                return
        await self.drive(session.run(sent.prompt))

    # ------------------------------------------------------------------ run events

    async def drive(self, events: AsyncIterator[stream.RunEvent]) -> None:
        self.running_since = time.monotonic()
        self.last_outcome = None
        self.streamed = Streamed()
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
            await self.show_hook_notes()  # a run_end hook's, after the run's last event
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

    async def show_hook_notes(self) -> None:
        while self.hook_notes:
            await self.screen.show(warning_text(f"⚠ {self.hook_notes.pop(0)}"))

    async def handle(self, ev: stream.RunEvent) -> None:
        await self.show_hook_notes()
        show = self.screen.show
        ws = self.setup.workspace
        assert self.session is not None
        if isinstance(ev, stream.TextDelta):
            self.thinking = False
            self.streamed.delta(ev.text, time.monotonic())
            for block in self.text.feed(ev.text):
                await show(markdown(block))
        elif isinstance(ev, stream.ThinkingDelta):
            self.thinking = True
            self.streamed.delta(ev.text, time.monotonic())
        elif isinstance(ev, stream.Compaction):
            await self.flush_text()
            await show(Text(ev.describe(), style="dim"))
            self.update_meter()
        elif isinstance(ev, stream.CompactionFailed):
            if ev.counted or ev.failures == 0:
                await show(warning_text(ev.describe()))
        elif isinstance(ev, stream.Retry):
            await show(
                warning_text(f"retrying in {ev.delay:.1f}s (attempt {ev.attempt}): {ev.error}")
            )
        elif isinstance(ev, stream.ModelTurn):
            self.thinking = False
            self.streamed.turn(ev.event.usage.output)
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
            if ev.call.name == TASKS_TOOL and self.session is not None:
                tasks = current_tasks(self.session.events)
                if tasks:
                    await show(render_tasks(tasks))  # the checklist, as it now stands
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
        assert session is not None
        if choice is None:
            session.deny(call.call_id, "the user stopped the run")
            session.abort()
            await self.screen.show(Text("  ✗ stopped"))
        elif choice.action in ("always", "everywhere"):
            everywhere = choice.action == "everywhere"
            try:
                session.approve(call.call_id, always=True, every_project=everywhere)
                rule = getattr(session.events[-1], "rule", None)
                where = "every project" if everywhere else "this project"
                await self.screen.show(Text(f"  ✓ approved · won't ask again in {where}: {rule}"))
            except KisoError as exc:
                session.approve(call.call_id)
                await self.screen.show(warning_text(f"  ✓ approved this once: {exc}"))
        elif choice.action == "no":
            why = panel.reason.strip()
            session.deny(call.call_id, why or None)
            await self.screen.show(Text(f"  ✗ denied{': ' + why if why else ''}"))
        elif choice.action == "narrower":
            session.deny(call.call_id, NARROWER)
            await self.screen.show(Text("  ✗ not run · the model is asked for narrower versions"))
        else:
            session.approve(call.call_id)
            await self.screen.show(Text("  ✓ approved"))

    async def _rule(self, u: Uncertain) -> bool:
        assert self.session is not None
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
        paid = self._run_paid()
        if any(usage.output is not None for _, usage in paid):
            fresh = sum(usage.input or 0 for _, usage in paid)
            out = sum(usage.output or 0 for _, usage in paid)
            facts.append(f"fresh {fresh} out {out}")
        priced = [cost(used, usage) for used, usage in paid]
        if paid and all(p is not None for p in priced):
            facts.append(money(sum(p or 0.0 for p in priced)))
        if m.cache_hit is not None:
            facts.append(f"cache {m.cache_hit}%")
        if m.ctx_left is not None:
            facts.append(f"ctx left ~{m.ctx_left}%")
        await self.screen.show(Text("✦ " + " · ".join(facts)))

    def _run_paid(self) -> list[tuple[str, Usage]]:
        """The model requests of the last run: its turns and the summaries of its compactions."""
        paid: list[tuple[str, Usage]] = []
        for e in self.session.events if self.session else ():
            if isinstance(e, RunStarted):
                paid = []
            else:
                paid += billed((e,))
        return paid

    def _run_turns(self) -> list[Assistant]:
        """The model turns of the last run."""
        turns: list[Assistant] = []
        for e in self.session.events if self.session else ():
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
                await self._switch_model(*model_args(arg))
            else:
                await self._pick_model()
        elif name == "/status":
            await show(self._status())
        elif name == "/last":
            await show(self.last_view(full=True))
        elif name == "/transcript":
            await show(self.transcript())
        elif name == "/copy":
            await self.copy_last_answer()
        elif name == "/clear":
            self.screen.clear()
        elif name == "/compact":
            await self._compact(arg)
        elif name == "/context":
            await show(self._context())
        elif name == "/resume":
            await self._resume()
        elif name == "/reload":
            await self._reload()
        elif name == "/mcp":
            await show(self._mcp())
        elif name == "/skills":
            await show(self._skills())
        elif name == "/tasks":
            await show(self._tasks())
        elif (skill := find_skill(self.setup.skills, name[1:])) is not None:
            self.enqueue(skill_turn(skill, arg))  # an ordinary user turn, recorded as such
        else:
            await show(error_text(f"unknown command {name}; /help lists them"))

    async def _compact(self, focus: str) -> None:
        """``/compact [focus]``: a summary now, as one durable ``compacted`` record."""
        if self.running:
            await self.screen.show(
                error_text("a turn is running: /compact once it is done (esc stops it)")
            )
            return
        if self.session is None:
            await self.screen.show(Text("nothing to compact yet: the session has no history"))
            return
        try:
            events = self.session.compact(focus.strip() or None)
        except KisoError as exc:
            await self.screen.show(error_text(f"✗ {exc}"))
            return
        await self.screen.show(Text("compacting: asking the model for a summary…", style="dim"))
        await self.drive(events)

    def _context(self) -> RenderableType:
        rent = self.ledger()
        if rent is None:
            window = self.setup.agent.window.current()
            return Text(f"no request yet · window {window.describe()}")
        return Text("\n".join(["the next request, by part (tokens):", *rent.rows()]))

    def _rent_lines(self) -> list[str]:
        """What the skills' index and the MCP tools' schemas cost every request."""
        out = []
        if self.setup.skills:
            index = skills_prompt(self.setup.skills)
            out.append(
                f"skills     {len(self.setup.skills)} · rent {len(index):,} chars "
                f"~{estimate_tokens(index):,} tokens (the index in the system prompt)"
            )
        mcp = [t for t in self.setup.agent.tools.values() if t.name.startswith("mcp__")]
        if mcp:
            schemas = sum(len(json.dumps(t.parameters)) + len(t.description) for t in mcp)
            out.append(
                f"mcp        {len(mcp)} tools · rent {schemas:,} chars ~{schemas // 4:,} tokens "
                f"(their schemas)"
            )
        return out

    def _mcp(self) -> RenderableType:
        if self.setup.mcp is None:
            return Text(
                "no MCP servers: add them to ~/.kiso/mcp.json (or a trusted project's "
                ".kiso/mcp.json); docs/mcp.md"
            )
        from kiso.mcp import describe_mcp

        return Text("\n".join(describe_mcp(self.setup.mcp)))

    def _skills(self) -> RenderableType:
        if not self.setup.skills:
            return Text(
                "no skills: put <name>/SKILL.md under ~/.kiso/skills (or a trusted project's "
                ".kiso/skills); docs/skills.md"
            )
        rows = [f"/{s.name:<20} {s.description}  ({s.source})" for s in self.setup.skills]
        return Text("\n".join(["skills (/<name> [args] runs one):", *rows]))

    def _tasks(self) -> RenderableType:
        tasks = current_tasks(self.session.events) if self.session is not None else []
        if not tasks:
            return Text(
                "no tasks yet"
                if self.setup.config.tasks
                else 'tasks are off: "tasks": true in the config'
            )
        view: RenderableType = render_tasks(tasks)
        return view

    async def copy_last_answer(self) -> None:
        """ctrl+x, /copy: the last answer onto the clipboard, through the terminal (OSC 52)."""
        text = self.last_answer()
        if text is None:
            await self.screen.show(Text("no answer to copy yet"))
        elif not self.screen.copy(text):
            await self.screen.show(warning_text("copying needs a terminal (OSC 52)"))
        else:
            lines = text.count("\n") + 1
            await self.screen.show(
                Text(
                    f"  ⧉ copied the last answer ({lines} line{'s' if lines != 1 else ''}, "
                    f"{len(text)} characters) · through the terminal (OSC 52), if it allows that"
                )
            )

    async def _mode(self, arg: str) -> None:
        if not arg:
            await self.screen.show(modes_view(self.mode))
            return
        try:
            if self.session is not None:
                self.session.set_mode(arg)  # the runtime records it (setting_changed)
            else:
                check_mode(arg)
                self.pending.append(("mode", arg))  # recorded when the session is created
        except KisoError as exc:
            await self.screen.show(error_text(str(exc)))
            return
        await self.screen.show(Text(f"mode: {arg} · {MODE_HELP[arg]}"))
        self.screen.refresh()

    async def _switch_model(self, name: str, effort: str | None = None) -> None:
        """Switch the session's model (and its effort level) for the turns that follow."""
        from kiso.runtime.models import build_adapter

        try:
            resolved, config = switch_model(self.setup.config, name, effort, kiso_home())
            adapter = build_adapter(resolved)
        except KisoError as exc:
            await self.screen.show(error_text(str(exc)))
            return
        agent = self.setup.agent
        agent.adapter = adapter
        agent.profile = resolved.profile.name if resolved.profile else None
        agent.strip_env = resolved.strip_env
        self.setup = dataclasses.replace(self.setup, resolved=resolved, config=config)
        settings = [("model", name), *([("effort", effort)] if effort else [])]
        if self.session is not None:
            for key, value in settings:
                self.session.record_setting(key, value)
        else:
            self.pending += settings
        level = f" · effort {effort}" if effort else ""
        await self.screen.show(
            Text(f"model: {resolved.describe()}{level} (for the turns that follow)")
        )
        self.update_meter()
        self.screen.refresh()

    async def _pick_model(self) -> None:
        """``/model``: pick a profile, then its effort level (``t`` types ``NAME [EFFORT]``)."""
        found = profile_rows(self.setup.config, self.setup.resolved, kiso_home())
        rows = [
            Option(
                r.name,
                "pick",
                r.detail,
                r.available,
                f"{r.name} is {r.detail.split(' · ')[-2]}",
                r.profile or "",
            )
            for r in found
        ]
        current = next((i for i, r in enumerate(found) if r.in_use), 0)
        panel = Panel(
            f"Model for the turns that follow (now {self.setup.resolved.describe()})",
            rows,
            selected=current,
            typed="pick",
            ask="model [effort]: ",
            hint="↑↓ move · ⏎ picks · digits act on their row · t types provider/model · esc "
            "keeps this one",
        )
        if not self.setup.config.models:
            panel.note = "no profiles in ~/.kiso/config.json (docs/providers.md shows the shape)"
        choice = await self.screen.ask(panel)
        if choice is None:
            return
        if choice.label == "typed":
            name, effort = model_args(panel.reason)
            if name:
                await self._switch_model(name, effort)
            return
        if not choice.value:
            await self.screen.show(Text(f"model: {self.setup.resolved.describe()} (unchanged)"))
            return
        profile = self.setup.config.models[choice.value]
        levels = lookup(profile.model).efforts
        effort = None
        if levels:
            options = [Option(level, "pick", value=level) for level in levels]
            options.append(Option("the model's default", "pick", value=""))
            chosen = profile.effort or ""
            start = next((i for i, o in enumerate(options) if o.value == chosen), 0)
            asked = await self.screen.ask(
                Panel(f"Effort for {choice.value} ({profile.model})?", options, selected=start)
            )
            if asked is None:
                return
            effort = asked.value or None
        await self._switch_model(choice.value, effort)

    def _status(self) -> RenderableType:
        from .status import pass_env_line

        s, m = self.session, self.meter
        ctx = f"~{m.ctx_left}% left" if m.ctx_left is not None else "unknown"
        if s is None:
            session = f"{self.session_id} (new: saved when the first prompt is sent)"
        else:
            session = f"{s.id} ({s.state.value}, {len(s.events)} events)"
        profile = self.setup.resolved.profile
        effort = f" · effort {profile.effort}" if profile is not None and profile.effort else ""
        info = lookup(self.model)
        spent = self.cost()
        if info.price is not None:
            spent += f" this session · list prices as of {info.as_of} ({info.source})"
        elif spent != "cost unknown":
            spent += f" this session · {self.model} has no dated price"
        else:
            spent += f": {self.model} has no dated price in the registry"
        system = getattr(s, "system_prompt", None) if s is not None else None
        if not isinstance(system, str):
            system = self.setup.agent.system_prompt
        prompt = f"~{estimate_tokens(system):,} tokens" if system else "none"
        lines = [
            f"session    {session}",
            f"workspace  {self.setup.workspace}",
            f"model      {self.setup.resolved.describe()}{effort}",
            f"mode       {self.mode}{'' if self.setup.agent.floor else ' · floor off'}",
            f"sandbox    {sandbox_line(self.setup.agent.sandbox, self.setup.config.sandbox)}",
            f"context    {ctx} of {self.window():,} tokens",
            f"system     the system prompt is {prompt}",
            f"cost       {spent}",
            f"theme      {self.printer.palette.describe()}",
            *rules_rows(self.setup.agent.rules, self.setup.workspace),
            f"history    {history_path(kiso_home(), self.setup.workspace)}",
            pass_env_line(self.setup.agent.pass_env),
        ]
        rows = self.setup.extensions.status_lines()
        lines += [f"extension  {row}" for row in rows] or ["extension  none loaded"]
        lines += self._rent_lines()
        if m.turn is not None:
            u = m.turn.usage
            lines.append(
                f"last turn  in {_n(u.input)} out {_n(u.output)} cache read {_n(u.cache_read)} "
                f"write {_n(u.cache_write)} · {m.turn.ms} ms"
            )
        return Text("\n".join(lines))

    async def _reload(self) -> None:
        """``/reload``: build the extensions and the config again and swap them into the live
        session; refused while a run is going, and a load that fails keeps the old set."""
        from kiso.cli.setup import prepare
        from kiso.kernel.replay import SYSTEM_PROMPT_KEY
        from kiso.runtime.extensions import ExtensionLoadError

        if self.running:
            await self.screen.show(warning_text("a run is going: /reload when it has ended"))
            return
        old = self.setup
        model, mode = old.flags
        try:
            new = prepare(
                model=model,
                mode=mode,
                workspace=old.workspace,
                options=old.options,
                asker=self.asker,
            )
        except (ExtensionLoadError, KisoError) as exc:
            await self.screen.show(
                error_text(f"✗ /reload: nothing changed, the old set is kept: {exc}")
            )
            return
        agent, before = new.agent, old.agent
        agent.adapter, agent.profile, agent.strip_env = (
            before.adapter,
            before.profile,
            before.strip_env,
        )  # the model in use stays (a /model switch is the session's own setting)
        self.setup = dataclasses.replace(new, resolved=old.resolved)
        route_reports(agent.hooks.hooks, self.hook_notes.append)
        if old.mcp is not None:  # the new set's servers are running: stop the old ones
            await asyncio.to_thread(old.mcp.close)
        if self.session is not None:
            s = self.session
            recorded = s.system_prompt
            s.agent = agent
            if recorded == before.system_prompt and agent.system_prompt not in (None, recorded):
                s.record_setting(SYSTEM_PROMPT_KEY, agent.system_prompt)
        names = ", ".join(f"{x.name} ({x.layer})" for x in new.extensions.loaded) or "none"
        await self.screen.show(Text(f"reloaded · extensions: {names}"))
        for notice in new.notices:
            await self.screen.show(warning_text(f"⚠ {notice}"))
        self.screen.refresh()

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
        if chosen is None or chosen == self.session_id:
            return
        try:
            new = open_session(self.setup, chosen)
        except KisoError as exc:
            await self.screen.show(error_text(str(exc)))
            return
        old, self.session = self.session, new
        self.session_id, self.pending = new.id, []
        if old is not None:
            old.close()
        self.last_tool = None
        self.update_meter()
        await self.screen.show(self.banner())
        recent = self.recent()
        if recent is not None:
            await self.screen.show(recent)
        self.enqueue(RESUME)


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

    def copy(self, text: str) -> bool:
        return False  # a pipe carries zero escape codes

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
            number = ascii_int(answer.strip())
            option = panel.pick(number - 1) if number is not None else None
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
