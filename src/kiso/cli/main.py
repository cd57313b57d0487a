"""The ``kiso`` command.

Startup stays light: this module imports only click and the standard library at import time;
each command imports what it needs when it runs, and provider SDKs are never imported here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from kiso import __version__


class _KisoGroup(click.Group):
    """``kiso <sessionId>`` means ``kiso chat <sessionId>``: a first word that is not a command
    is a session id."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "chat", self.commands["chat"], args
        return super().resolve_command(ctx, args)


F = TypeVar("F", bound=Callable[..., object])
OUTPUT_FORMATS = click.Choice(["text", "json", "stream-json"])
RESOLUTIONS = click.Choice(["rerun", "skip", "applied"])


@click.group(
    cls=_KisoGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
)
@click.version_option(__version__, "-v", "--version", prog_name="kiso")
@click.option("-p", "--print", "prompt", metavar="PROMPT", help="Run one prompt with no UI.")
@click.option("--model", default=None, help="A profile name, or provider/model.")
@click.option("--mode", default=None, help="default, accept-edits, plan, dontAsk or bypass.")
@click.option(
    "--output-format",
    type=OUTPUT_FORMATS,
    default="text",
    show_default=True,
    help="Print mode: plain text, one JSON result, or one JSON event per line.",
)
@click.option(
    "--resolve",
    type=RESOLUTIONS,
    default=None,
    help="Headless runs: how to rule on uncertain executions (otherwise they stop the run).",
)
@click.pass_context
def cli(
    ctx: click.Context,
    *,
    prompt: str | None,
    model: str | None,
    mode: str | None,
    output_format: str,
    resolve: str | None,
) -> None:
    """kiso: a durable coding agent. Every approval, tool result and event is on disk before it
    is acted on, so a session that is interrupted, crashes or is killed resumes where it was.

    \b
    kiso [sessionId]               interactive session (`kiso chat` is the same)
    kiso -p "prompt" [sessionId]   one prompt, no UI; exit 0 only if the run completed
    kiso resume                    pick a session to continue
    kiso resume <id> [prompt]      continue a session (headless when stdin is not a terminal)
    kiso sessions [--all]          durable sessions and the state each resumes into
    kiso doctor <id>               repair a damaged log; nothing with a receipt runs again

    Sessions live in $KISO_HOME/projects (KISO_HOME defaults to ~/.kiso).
    """
    ctx.obj = {
        "prompt": prompt,
        "model": model,
        "mode": mode,
        "output_format": output_format,
        "resolve": resolve,
    }
    if ctx.invoked_subcommand is None:
        ctx.invoke(chat, session_id=None)


def _run_options(f: F) -> F:
    """The flags a subcommand takes too, so they work after a session id as well as before."""
    for option in reversed(
        (
            click.option(
                "--model", "model_here", default=None, help="A profile name, or provider/model."
            ),
            click.option("--mode", "mode_here", default=None, help="The approval mode."),
            click.option("--output-format", "format_here", type=OUTPUT_FORMATS, default=None),
            click.option("--resolve", "resolve_here", type=RESOLUTIONS, default=None),
        )
    ):
        f = option(f)
    return f


def _opts(ctx: click.Context) -> dict[str, object]:
    return dict(ctx.obj or {})


@cli.command()
@click.argument("session_id", required=False)
@click.option("-p", "--print", "prompt_here", metavar="PROMPT", help="Run one prompt with no UI.")
@_run_options
@click.pass_context
def chat(
    ctx: click.Context,
    *,
    session_id: str | None,
    prompt_here: str | None = None,
    model_here: str | None = None,
    mode_here: str | None = None,
    format_here: str | None = None,
    resolve_here: str | None = None,
) -> None:
    """The interactive session (or print mode with -p)."""
    opts = _opts(ctx)
    prompt = prompt_here if prompt_here is not None else _str(opts.get("prompt"))
    model = model_here or _str(opts.get("model"))
    mode = mode_here or _str(opts.get("mode"))
    _check_usage(session_id, mode)
    if prompt is not None:
        from kiso.cli.print_mode import run_headless

        sys.exit(
            run_headless(
                prompt,
                session_id=session_id,
                model=model,
                mode=mode,
                output_format=format_here or str(opts.get("output_format") or "text"),
                resolve=resolve_here or _str(opts.get("resolve")),
            )
        )
    if not sys.stdin.isatty():
        raise click.UsageError(
            'the interactive session needs a terminal; use `kiso -p "prompt"` for one '
            "prompt without a terminal"
        )
    from kiso.cli.repl import run_interactive

    sys.exit(run_interactive(session_id=session_id, model=model, mode=mode, prompt=None))


@cli.command()
@click.argument("session_id", required=False)
@click.argument("prompt", required=False)
@_run_options
@click.pass_context
def resume(
    ctx: click.Context,
    *,
    session_id: str | None,
    prompt: str | None,
    model_here: str | None,
    mode_here: str | None,
    format_here: str | None,
    resolve_here: str | None,
) -> None:
    """Continue a session: with no id, pick one; headless when stdin is not a terminal."""
    opts = _opts(ctx)
    model = model_here or _str(opts.get("model"))
    mode = mode_here or _str(opts.get("mode"))
    output_format = format_here or str(opts.get("output_format") or "text")
    resolution = resolve_here or _str(opts.get("resolve"))
    _check_usage(session_id, mode)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    if session_id is None:
        if not interactive:
            raise click.UsageError(
                "kiso resume needs a session id when not on a terminal; `kiso sessions` lists them"
            )
        from kiso.cli.picker import pick_session
        from kiso.kernel import JsonlSessionStore

        session_id = pick_session(JsonlSessionStore(), Path(os.getcwd()))
        if session_id is None:
            return
    if interactive:
        from kiso.cli.repl import run_interactive

        sys.exit(
            run_interactive(
                session_id=session_id, model=model, mode=mode, prompt=prompt, must_exist=True
            )
        )
    from kiso.cli.print_mode import run_headless

    sys.exit(
        run_headless(
            prompt,
            session_id=session_id,
            model=model,
            mode=mode,
            output_format=output_format,
            resolve=resolution,
            must_exist=True,
        )
    )


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _check_usage(session_id: str | None, mode: str | None) -> None:
    """A malformed session id or an unknown --mode is a usage error (exit 2), said in one line."""
    from kiso.kernel import UsageError
    from kiso.kernel.ids import check_session_id
    from kiso.runtime.approvals import check_mode

    try:
        if session_id is not None:
            check_session_id(session_id)
        if mode is not None:
            check_mode(mode)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None


@cli.command()
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    default=None,
    help="KISO_HOME for the demo session (default: a new temporary folder).",
)
def demo(home: str | None) -> None:
    """Run a durable session, kill it with SIGKILL mid-tool-call, and recover it.

    Needs no key and no network: the model's turns are scripted. Nothing outside the temporary
    folders it prints is touched.
    """
    from kiso.cli.demo import run_demo

    sys.exit(run_demo(home))


@cli.command()
@click.option("--all", "scope", flag_value="all", help="Sessions of every workspace.")
@click.option(
    "--current",
    "scope",
    flag_value="current",
    default=True,
    help="Sessions that started in this directory (the default).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, for scripts.")
def sessions(scope: str, as_json: bool) -> None:
    """List durable sessions with the state each would resume into.

    States: completed, ended (error, aborted, max_turns, budget), interrupted (a run is open),
    uncertain (an execution may or may not have applied: a human rules first), awaiting_approval
    (a question nobody answered), empty (no run yet), corrupt (the log does not load).
    """
    from kiso.kernel import JsonlSessionStore, StoreError

    store = JsonlSessionStore()
    try:
        rows = store.list(None if scope == "all" else os.getcwd())
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        for row in rows:
            click.echo(json.dumps(row.to_json(), ensure_ascii=False))
        return
    if not sys.stdout.isatty():  # stable, script-friendly: tab-separated, no relative ages
        for row in rows:
            updated = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row.updated / 1000))
            title = " ".join(row.title.split())
            click.echo(f"{row.id}\t{row.state.value}\t{updated}\t{row.workspace}\t{title}")
            if row.error:
                click.echo(f"{row.id}: {row.error}", err=True)
        if not rows:
            click.echo(
                f"no sessions {'anywhere' if scope == 'all' else 'in this directory'}", err=True
            )
        return
    if not rows:
        where = "anywhere" if scope == "all" else "in this directory"
        hint = "" if scope == "all" else " (`kiso sessions --all` lists every workspace)"
        click.echo(f"no sessions {where}{hint}")
        return
    now = time.time() * 1000
    width = max(len(r.id) for r in rows)
    for row in rows:
        line = (
            f"{row.id:<{width}}  {row.state.value:<17}  {_age(now - row.updated):>4}  "
            f"{row.title or '(no prompt yet)'}"
        )
        if scope == "all":
            line += f"  [{row.workspace or '?'}]"
        if row.error:
            line += f"\n  {row.error}"
        click.echo(line)


@cli.command()
@click.argument("session_id")
def doctor(session_id: str) -> None:
    """Repair a damaged session log without running again anything that has a receipt.

    Keeps the damaged log as <id>.jsonl.damaged-<time>, writes a log that loads in its place
    and says what it did: lines dropped, executions kept as finished, calls left for a human to
    rule on. Holds the session's writer lock while it works. Exit 0 when repaired or when there
    was nothing to repair, 1 when it could not repair.
    """
    from kiso.kernel import JsonlSessionStore, KisoError, UsageError
    from kiso.kernel.doctor import RepairStatus, repair_session

    try:
        result = repair_session(JsonlSessionStore(), session_id)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    except KisoError as exc:
        click.echo(f"kiso doctor: {exc}", err=True)
        sys.exit(1)
    refused = result.status is RepairStatus.REFUSED
    for line in result.report():
        click.echo(line, err=refused)
    sys.exit(1 if refused else 0)


@cli.command()
@click.argument("path", required=False, type=click.Path(file_okay=False))
@click.option("--revoke", is_flag=True, help="Forget the trust given to this project.")
def trust(path: str | None, revoke: bool) -> None:
    """Trust (or, with --revoke, stop trusting) a project's .kiso/ directory.

    A project's .kiso/ (config.json, and later extensions, skills and mcp.json) is code that came
    with the repository. kiso applies nothing in it until you trust it: this lists what is there
    and records your verdict with the files' digest under $KISO_HOME; a change to any file asks
    again. PATH defaults to the current directory.
    """
    from kiso.cli.trust import trust_command

    sys.exit(trust_command(path, revoke=revoke))


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("provider")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def login(provider: str, extra: tuple[str, ...]) -> None:
    """Store an API key for PROVIDER (anthropic, openai, deepseek, zai) in ~/.kiso/auth.json.

    The key is read hidden from the terminal, or from stdin when piped; never from the command
    line. It is only ever sent to that provider's own API.
    """
    from kiso.cli import login as impl

    impl.login(provider, extra)


@cli.command()
@click.argument("provider")
def logout(provider: str) -> None:
    """Remove the stored key for PROVIDER."""
    from kiso.cli import login as impl

    impl.logout(provider)


@cli.command()
def auth() -> None:
    """Show stored credentials (masked) and which key variables are set."""
    from kiso.cli import login as impl

    impl.show()


def _age(ms: float) -> str:
    seconds = max(ms, 0) / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def main() -> None:
    cli(prog_name="kiso")


if __name__ == "__main__":
    main()
