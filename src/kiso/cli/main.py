"""The ``kiso`` command.

Startup stays light: this module imports only click and the standard library at import time;
each command imports what it needs when it runs, and provider SDKs are never imported here.
"""

from __future__ import annotations

import json
import os
import sys
import time

import click

from kiso import __version__


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    invoke_without_command=True,
)
@click.version_option(__version__, "-v", "--version", prog_name="kiso")
@click.option("-p", "--print", "prompt", metavar="PROMPT", help="Run one prompt, print the answer.")
@click.option("--model", default=None, help="A profile name, or provider/model.")
@click.option("--mode", default=None, help="default, accept-edits, plan, dontAsk or bypass.")
@click.option("--session", "session_id", default=None, help="Continue this session (print mode).")
@click.pass_context
def cli(
    ctx: click.Context,
    prompt: str | None,
    model: str | None,
    mode: str | None,
    session_id: str | None,
) -> None:
    """kiso: a durable runtime for AI agents.

    Every approval, tool result and event is written to disk as it happens, so an agent that is
    interrupted, crashes or is killed resumes from its committed prefix.

    Sessions live in $KISO_HOME/projects (KISO_HOME defaults to ~/.kiso).
    """
    if ctx.invoked_subcommand is not None:
        return
    if prompt is not None:
        from kiso.cli.print_mode import main_print

        main_print(prompt, model, mode, session_id)
    click.echo(ctx.get_help())


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
