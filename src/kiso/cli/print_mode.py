"""``kiso -p "prompt"``: one turn, no terminal UI, an exit code a script can trust.

The model is chosen by the usual precedence (``--model``, ``KISO_MODEL``, project config, user
config, the environment's keys, the keyless script). The session is recovery-first: an open run is
carried to its end before the new prompt starts. Nobody is there to answer a question, so an
approval that would ask is denied (say ``--mode accept-edits`` or ``--mode bypass`` to allow), and
an uncertain execution stops the run with a message. Exit 0 only when the run completed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from kiso.kernel import Event, KisoError, kiso_home


def run_print(prompt: str, *, model: str | None, mode: str | None, session_id: str | None) -> int:
    from kiso.runtime import Agent, stream
    from kiso.runtime.config import load_config
    from kiso.runtime.models import build_adapter, resolve_model
    from kiso.tools import builtin_tools

    workspace = os.getcwd()
    home = kiso_home()
    try:
        config = load_config(home, Path(workspace), model=model, mode=mode)
        resolved = resolve_model(config, home=home)
        agent = Agent(
            adapter=build_adapter(resolved),
            tools=builtin_tools(),
            workspace=workspace,
            mode=config.mode,
            floor=config.floor,
            profile=resolved.profile.name if resolved.profile else None,
            strip_env=resolved.strip_env,
        )
        with agent.session(session_id) as session:
            click.echo(f"session {session.id} · {resolved.describe()}", err=True)
            outcome = None
            for stage in ("resume", "run"):
                events = session.resume_sync() if stage == "resume" else session.run_sync(prompt)
                for ev in events:
                    if isinstance(ev, stream.TextDelta):
                        click.echo(ev.text, nl=False)
                    elif isinstance(ev, stream.ModelTurn):
                        if ev.event.text:
                            click.echo()
                    elif isinstance(ev, stream.ApprovalRequest):
                        session.deny(
                            ev.call_id,
                            "print mode cannot ask for approval; rerun with --mode accept-edits "
                            "or --mode bypass, or use the interactive session",
                        )
                        click.echo(
                            f"[denied {ev.call.name}: nobody to ask in print mode]", err=True
                        )
                    elif isinstance(ev, stream.ToolStart):
                        click.echo(f"[{ev.call.name}]", err=True)
                    elif isinstance(ev, stream.UncertainPending):
                        names = ", ".join(f"{u.name} ({u.execution_id})" for u in ev.executions)
                        click.echo(
                            f"uncertain executions need a ruling: {names}; run `kiso resume "
                            f"{session.id}` interactively",
                            err=True,
                        )
                    elif isinstance(ev, stream.Terminal):
                        outcome = ev.outcome
                if stage == "resume" and session.state.value in ("uncertain", "awaiting_approval"):
                    return 1
            click.echo(_spend(session.events), err=True)
    except KisoError as exc:
        click.echo(f"kiso: {exc}", err=True)
        return 1
    if outcome is None or outcome.kind != "completed":
        detail = "paused" if outcome is None else (outcome.message or outcome.kind)
        click.echo(f"kiso: the run did not complete: {detail}", err=True)
        return 1
    return 0


def main_print(prompt: str, model: str | None, mode: str | None, session_id: str | None) -> None:
    sys.exit(run_print(prompt, model=model, mode=mode, session_id=session_id))


def _spend(events: Sequence[Event]) -> str:
    """Tokens and cost of the last run, from the provider's own counts; cost unknown unless the
    registry has a dated price for the model."""
    from kiso.kernel import Assistant, RunStarted
    from kiso.providers.registry import cost

    evs = list(events)
    start = max((i for i, e in enumerate(evs) if isinstance(e, RunStarted)), default=0)
    turns = [e for e in evs[start:] if isinstance(e, Assistant)]
    tokens_in = sum(t.usage.input or 0 for t in turns)
    tokens_out = sum(t.usage.output or 0 for t in turns)
    costs = [cost(t.model, t.usage) for t in turns]
    spent = "unknown" if not turns or None in costs else f"${sum(c or 0 for c in costs):.4f}"
    return f"{len(turns)} model turns · in {tokens_in} out {tokens_out} tokens · cost {spent}"
