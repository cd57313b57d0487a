"""Headless runs: ``kiso -p "prompt" [sessionId]`` and ``kiso resume <id> [prompt]`` off a terminal.

One turn, no UI, an exit code a script can trust: 0 only when the run completed. The session is
recovery-first: an open run is carried to its end before a new prompt starts. The session is
opened headless, so the runtime denies what would ask (``decided_by: "headless"``, the model told
which modes would allow it), and an uncertain execution stops the run with the list and the
command to rule on it, unless ``--resolve rerun|skip|applied`` rules. The session continues in
the mode its log recorded unless ``--mode``/``KISO_MODE`` says otherwise; the header names it.

``--output-format``: ``text`` (the final answer alone on stdout, once the run is over; the header,
what the model said before its tool calls, tool names, denials and notes on stderr), ``json`` (one
result object), ``stream-json`` (the runtime's JSON form of every run event, one per line — see
docs/runtime.md — then the result). The result carries the session id, the outcome (and Claude
Code's ``subtype``: ``success``, ``error_max_turns``, ``error_max_budget_usd``,
``error_during_execution``), the answer, the provider's token counts, the cost (``cost`` and
``total_cost_usd``; null when the model has no dated price), the model turns (``turns`` and
``num_turns``) and the denied calls (``permission_denials``).

SIGTERM and SIGHUP stop the run as an abort does (:mod:`kiso.cli.stop`): the running command's
processes are ended, the run is recorded ``aborted`` by the signal, and the exit code is 143 or 129.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from kiso.kernel import (
    ApprovalDecided,
    Assistant,
    Event,
    KisoError,
    Outcome,
    Ruling,
    RunStarted,
    billed,
    parse_ruling,
)
from kiso.runtime import STREAM_VERSION, Session, stream
from kiso.runtime.session import PromptTooLargeError, check_prompt_fits

if TYPE_CHECKING:
    from kiso.cli.attach import Expansion
    from kiso.cli.setup import RunOptions, Setup
    from kiso.cli.stop import Stop

__all__ = ["fail", "run_headless"]


@dataclass(frozen=True, slots=True)
class PromptInput:
    r"""A headless prompt: what was typed on the command line, whose ``@path``\ s and image paths
    are attached, and what came on stdin, sent as it is (piped text is data, and anyone may have
    written it: a ``@~/.ssh/id_rsa`` in a piped diff must not pull the key into the prompt)."""

    typed: str
    piped: str | None = None


def run_headless(
    prompt: str | PromptInput | None,
    *,
    session_id: str | None,
    model: str | None,
    mode: str | None,
    output_format: str = "text",
    resolve: str | None = None,
    must_exist: bool = False,
    options: RunOptions | None = None,
) -> int:
    from kiso.cli.setup import close_setup, open_session, prepare

    began = time.monotonic()
    out = _Output(output_format)
    out.limits = (
        (options.max_turns, options.max_budget_usd) if options is not None else (None, None)
    )
    setup = None
    try:
        setup = prepare(model=model, mode=mode, options=options)
        given = PromptInput(prompt) if isinstance(prompt, str) else prompt
        sent = _attached(given, setup) if given is not None else None
        ruling = parse_ruling(resolve) if resolve is not None else None
        if sent is not None:
            check_prompt_fits(sent.prompt, setup.agent)  # before a session file exists
        with (
            open_session(setup, session_id, headless=True, must_exist=must_exist) as session,
            _stopping(session) as stop,
        ):
            out.on_closed = lambda: session.abort("output closed")
            out.note(f"session {session.id} · {setup.resolved.describe()} · mode {session.mode}")
            for line in sent.notes if sent is not None else ():
                out.note(line)
            for notice in setup.notices:  # e.g. that the mode comes from a project config
                out.note(notice)
            first = len(session.events)
            outcome: Outcome | None = None
            blocked = False
            for index in range(2):
                if index == 1 and (prompt is None or blocked or stop.signum is not None):
                    break
                stage = (
                    session.resume_sync()
                    if index == 0
                    else session.run_sync(sent.prompt if sent is not None else "")
                )
                with contextlib.closing(stage):  # an error mid-run still closes its loop
                    for ev in stage:
                        if stop.signum is not None:  # a stop that came before the run began
                            session.abort(stop.by)
                        out.event(ev)
                        if isinstance(ev, stream.Decision) and ev.event.decided_by == "headless":
                            name = ev.call.name if ev.call is not None else ev.event.call_id
                            out.note(f"denied {name}: {ev.event.reason}")
                        elif isinstance(ev, stream.UncertainPending):
                            _uncertain(out, session, ev, ruling)
                        elif isinstance(ev, stream.Paused):
                            blocked = True
                        elif isinstance(ev, stream.Terminal):
                            outcome = ev.outcome
            code = _exit_code(prompt, outcome, blocked) if stop.code is None else stop.code
            if stop.signum is not None:
                out.note(
                    f"kiso: stopped by {stop.by}; the run was recorded aborted, and "
                    f"`kiso resume {session.id}` continues it"
                )
            out.result(session, session.events[first:], outcome, code, began)
    except PromptTooLargeError as exc:  # refused before anything was recorded: a usage error
        out.fail(str(exc))
        return 2
    except KisoError as exc:
        out.fail(str(exc))
        return 1
    finally:
        if setup is not None:
            close_setup(setup)
    return code


@contextlib.contextmanager
def _stopping(session: Session) -> Iterator[Stop]:
    """SIGTERM and SIGHUP stop the run as an abort does (kiso.cli.stop), while the session is
    open; the exit code is then 128 + the signal's number."""
    from kiso.cli.stop import Stop

    def on_stop(signum: int) -> None:
        # Off the signal handler: it may have interrupted this thread anywhere.
        by = signal.Signals(signum).name
        threading.Thread(target=session.abort, args=(by,), daemon=True).start()

    stop = Stop(on_stop).install()
    try:
        yield stop
    finally:
        stop.restore()
        stop.done()


def fail(output_format: str, message: str) -> int:
    """Report a headless run that could not start, as :func:`run_headless` would; exit code 1."""
    _Output(output_format).fail(message)
    return 1


def _exit_code(prompt: str | PromptInput | None, outcome: Outcome | None, blocked: bool) -> int:
    """0 when the run completed, or when there was nothing to resume and no prompt; else 1."""
    if blocked:
        return 1
    if outcome is None:
        return 0 if prompt is None else 1
    return 0 if outcome.kind == "completed" else 1


def _uncertain(
    out: _Output, session: Session, ev: stream.UncertainPending, ruling: Ruling | None
) -> None:
    pending = [u for u in ev.executions if not u.auto_rerun]
    if ruling is not None:
        for u in pending:
            session.resolve(u.execution_id, ruling)
        return
    names = ", ".join(f"{u.name} ({u.execution_id})" for u in pending)
    running = [u.execution_id for u in pending if u.execution_id in ev.running]
    still = (
        f" Processes of {', '.join(running)} may still be running; a ruling waits for them."
        if running
        else ""
    )
    out.note(
        f"uncertain executions need a ruling: {names}. They started and never reported, so "
        f"they may or may not have applied.{still} Rule with: "
        f"kiso resume {session.id} --resolve rerun|skip|applied"
    )


class _Output:
    """What print mode writes. A reader that goes away (a closed pipe) stops the run: the
    runtime records it ``aborted`` (``by: "output closed"``) rather than leave it open."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.closed = False
        self.on_closed: Callable[[], None] = lambda: None
        self.held: str | None = None
        """text: the last answer-like turn's text, printed on stderr if a later turn follows."""
        self.watch = _reader_watch() if kind != "stream-json" else None
        """text and json write stdout only at the end: a poller notices a reader gone before."""
        self.limits: tuple[int | None, float | None] = (None, None)
        """``--max-turns`` and ``--max-budget-usd``, to say which limit ended a run."""

    def _gone(self) -> None:
        self.closed = True
        # Nothing more can reach the reader; keep the interpreter's last flush quiet too.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        self.on_closed()

    def _write(self, write: Callable[[], None]) -> None:
        if self.closed:
            return
        try:
            write()
        except BrokenPipeError:
            self._gone()

    def _check_reader(self) -> None:
        if self.closed or self.watch is None:
            return
        try:
            ready = self.watch.poll(0)
        except OSError:
            return
        if any(mask & (select.POLLERR | select.POLLHUP) for _, mask in ready):
            self._gone()

    def _line(self, obj: dict[str, Any]) -> None:
        def write() -> None:
            sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
            sys.stdout.flush()

        self._write(write)

    def _echo(self, text: str, *, nl: bool = True, err: bool = False) -> None:
        if err:  # stderr is for notes: a closed stderr is not the reader going away
            with contextlib.suppress(OSError):
                click.echo(text, nl=nl, err=True)
            return
        self._write(lambda: click.echo(text, nl=nl))

    def note(self, text: str) -> None:
        if self.kind == "stream-json":
            self._line({"type": "note", "v": STREAM_VERSION, "text": text})
        else:
            self._echo(text, err=True)

    def event(self, ev: stream.RunEvent) -> None:
        if self.closed:  # gone before this run began (at the header): stop it at this step
            self.on_closed()
            return
        if self.kind == "stream-json":
            self._line(ev.to_json())
            return
        self._check_reader()
        if self.kind == "text":
            if isinstance(ev, stream.ModelTurn) and ev.event.text:
                if self.held is not None:  # a turn followed: that text was not the last word
                    self._echo(self.held, err=True)
                    self.held = None
                if ev.calls:  # what the model says before its tool calls is commentary
                    self._echo(ev.event.text, err=True)
                else:
                    self.held = ev.event.text
            elif isinstance(ev, stream.ToolStart):
                self._echo(f"[{ev.call.name}]", err=True)
            elif isinstance(ev, stream.ToolEnd) and ev.event.is_error:
                said = ev.event.content.strip().splitlines()
                first = said[0] if said else "(no message)"
                self._echo(f"[{ev.call.name}] failed: {first}", err=True)
            elif (
                isinstance(ev, stream.Decision)
                and ev.event.decision == "denied"
                and ev.event.decided_by != "headless"  # those get their own note
            ):
                name = ev.call.name if ev.call is not None else ev.event.call_id
                self._echo(f"denied {name} ({ev.event.decided_by}): {ev.event.reason}", err=True)
            elif isinstance(ev, stream.Compaction) or (
                isinstance(ev, stream.CompactionFailed) and ev.counted
            ):
                self._echo(ev.describe(), err=True)
            elif isinstance(ev, stream.Terminal) and ev.outcome.kind != "completed":
                why = _why(ev.outcome, self.limits)
                self._echo(f"kiso: the run did not complete: {why}", err=True)

    def result(
        self,
        session: Session,
        events: Any,
        outcome: Outcome | None,
        code: int,
        began: float,
    ) -> None:
        summary = _summary(list(events))
        if self.kind == "text":
            answer = summary["answer"]
            if self.held is not None and self.held != answer:
                self._echo(self.held, err=True)
            if answer:  # the final answer, and only it, is stdout: what the json result says
                self._echo(answer)
            self._echo(summary["line"], err=True)
            return
        result = {
            "type": "result",
            "v": STREAM_VERSION,
            "session_id": session.id,
            "outcome": outcome.to_json() if outcome else None,
            "is_error": code != 0,
            "result": summary["answer"],
            "subtype": _subtype(outcome),
            "usage": summary["usage"],
            "cost": summary["cost"],
            "total_cost_usd": summary["cost"],
            "turns": summary["turns"],
            "num_turns": summary["turns"],
            "duration_ms": int((time.monotonic() - began) * 1000),
            "state": session.state.value,
            "permission_denials": summary["denials"],
        }
        self._line(result)

    def fail(self, message: str) -> None:
        if self.kind == "text":
            self._echo(f"kiso: {message}", err=True)
        else:
            self._line({"type": "result", "v": STREAM_VERSION, "is_error": True, "error": message})


def _reader_watch() -> select.poll | None:
    """A poller on stdout when it is a pipe or a socket, whose reader can go away."""
    if not hasattr(select, "poll"):
        return None
    try:
        fd = sys.stdout.fileno()
        if not (stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode)):
            return None
        watch = select.poll()
        watch.register(fd, 0)  # POLLERR and POLLHUP are reported whatever is asked for
    except (OSError, ValueError, AttributeError):
        return None
    return watch


def _why(outcome: Outcome, limits: tuple[int | None, float | None] = (None, None)) -> str:
    turns, budget = limits
    if outcome.kind == "max_turns":
        said = f"--max-turns {turns}" if turns is not None else "the default limit, 50"
        return f"max_turns: it reached its limit of model turns ({said})"
    if outcome.kind == "budget":
        said = f" (--max-budget-usd {budget:g})" if budget is not None else ""
        return f"budget: its cost reached the budget{said}"
    return outcome.message or outcome.kind


_SUBTYPES = {
    "completed": "success",
    "max_turns": "error_max_turns",
    "budget": "error_max_budget_usd",
}


def _subtype(outcome: Outcome | None) -> str:
    """Claude Code's ``subtype``: ``success``, ``error_max_turns``, ``error_max_budget_usd``,
    else ``error_during_execution`` (an error, an abort, or no run ended)."""
    if outcome is None:
        return "error_during_execution"
    return _SUBTYPES.get(outcome.kind, "error_during_execution")


def _summary(events: list[Event]) -> dict[str, Any]:
    """Tokens and cost of what this command ran, from the provider's own counts."""
    from kiso.providers.registry import cost

    turns = [e for e in events if isinstance(e, Assistant)]
    paid = list(billed(events))  # the turns, and the summaries of any compaction
    totals: dict[str, int | None] = {}
    for name in ("input", "output", "cache_read", "cache_write"):
        values = [getattr(usage, name) for _, usage in paid]
        totals[name] = (
            sum(v for v in values if v is not None) if any(v is not None for v in values) else None
        )
    costs = [cost(model, usage) for model, usage in paid]
    spent = None if not paid or None in costs else round(sum(c or 0 for c in costs), 6)
    runs = sum(isinstance(e, RunStarted) for e in events)
    line = (
        f"{len(turns)} model turns · in {totals['input'] or 0} out {totals['output'] or 0} "
        f"tokens · cost {'unknown' if spent is None else f'${spent:.4f}'}"
    )
    answer = next((t.text for t in reversed(turns) if t.text), "")
    calls = {c.call_id: c for t in turns for c in t.calls}
    denials = [
        {
            "tool_name": calls[e.call_id].name if e.call_id in calls else None,
            "tool_use_id": e.call_id,
            "tool_input": calls[e.call_id].input if e.call_id in calls else None,
            "decided_by": e.decided_by,
        }
        for e in events
        if isinstance(e, ApprovalDecided) and e.decision == "denied"
    ]
    return {
        "usage": totals,
        "cost": spent,
        "turns": len(turns),
        "runs": runs,
        "line": line,
        "answer": answer,
        "denials": denials,
    }


def _attached(given: PromptInput, setup: Setup) -> Expansion:
    """The typed prompt with its ``@path`` files and image paths attached (docs/attachments.md),
    then the piped text as it came."""
    from kiso.cli.attach import Expansion, expand
    from kiso.kernel import TextBlock
    from kiso.providers.registry import supports_images

    name = setup.agent.adapter.model
    typed = given.typed
    if typed.strip():
        sent = expand(typed, setup.workspace, vision=supports_images(name), model=name)
    else:
        sent = Expansion(typed)
    if given.piped is None:
        return sent
    rest = f"\n\n{given.piped}" if typed else given.piped
    if isinstance(sent.prompt, str):
        return Expansion(sent.prompt + rest, sent.notes)
    return Expansion([*sent.prompt, TextBlock(rest)], sent.notes)
