"""The ``kyronix`` command: ``kyronix exec`` runs a KML plan locally; ``kyronix executer`` serves
the server's WebSocket tunnel as a daemon (``kyronix executer resolve`` rules on what it left
uncertain); ``kyronix receipts prune`` forgets old receipts. The server's subcommands (serve,
projects, keys, credits) are added by :mod:`kyronix.server.cli`."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from kiso import __version__

if TYPE_CHECKING:
    from kiso.kernel.execution import Ruling
    from kyronix.executer import KyronixExecuter

_RECEIPTS = click.option(
    "--receipts",
    type=click.Path(dir_okay=False),
    default=None,
    help="The receipt store (default: $KYRONIX_HOME/receipts.sqlite3).",
)
_SANDBOX = click.option(
    "--sandbox",
    "sandbox",
    type=click.Choice(["workspace-write", "read-only", "off"]),
    default="workspace-write",
    show_default=True,
    help="The OS sandbox terminal commands run in (bubblewrap; docs/sandbox.md).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-v", "--version", prog_name="kyronix")
def cli() -> None:
    """Kyronix: an agent platform built on the kiso durable runtime."""


@cli.command("exec", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("plan", required=False, metavar="PLAN.kml")
@click.option(
    "--base",
    "base",
    type=click.Path(file_okay=False, dir_okay=True, exists=True),
    default=".",
    show_default=True,
    help="The directory every path is resolved in (nothing outside it is touched).",
)
@click.option("--root", is_flag=True, help="Allow every tool (ROOT_POLICIES) instead of SAFE.")
@click.option(
    "--allow",
    "allowed",
    multiple=True,
    metavar="ACTION",
    help="Also allow an action, e.g. tool:terminal, tool:http_request, net:private. Repeatable.",
)
@click.option(
    "--continue",
    "go_on",
    is_flag=True,
    help="Run the rest of the plan after a denied or uncertain tool.",
)
@_RECEIPTS
@click.option(
    "--pass-env",
    "pass_env",
    multiple=True,
    metavar="NAME",
    help=(
        "Pass this environment variable to the terminal even though its name or value looks "
        "like a credential (they are removed by default). Repeatable."
    ),
)
@_SANDBOX
@click.option(
    "--uncertain",
    is_flag=True,
    help=(
        "List executions that started and never finished (state uncertain) or are still "
        "running (state running, with the pid), and exit."
    ),
)
@click.option(
    "--resolve",
    "resolutions",
    multiple=True,
    metavar="ID=rerun|skipped|applied",
    help=(
        "Settle an uncertain execution after checking what happened, and exit "
        "(skip is accepted for skipped). Repeatable."
    ),
)
def exec_command(
    *,
    plan: str | None,
    base: str,
    root: bool,
    allowed: tuple[str, ...],
    go_on: bool,
    receipts: str | None,
    pass_env: tuple[str, ...],
    sandbox: str,
    uncertain: bool,
    resolutions: tuple[str, ...],
) -> None:
    """Run the tools of a KML plan (a file, or - for standard input) and print the results as
    JSON. Exit status: 0 when every tool succeeded, 1 when one failed, 2 when the plan could not
    be read (missing, unreadable, not UTF-8) or parsed (then nothing ran)."""
    from kiso.kernel.errors import UsageError
    from kiso.kernel.execution import parse_ruling
    from kyronix.executer import (
        ROOT_POLICIES,
        SAFE_POLICIES,
        KmlError,
        KyronixError,
        KyronixExecuter,
        PermissionManager,
        allow,
    )

    policies = ROOT_POLICIES if root else SAFE_POLICIES
    for action in allowed:
        if ":" not in action:
            raise click.UsageError(
                f"--allow takes an action such as tool:terminal or net:private, got {action!r}"
            )
    rulings: list[tuple[str, Ruling]] = []
    for item in resolutions:
        eid, _, how = item.partition("=")
        try:
            ruling = parse_ruling(how)
        except UsageError:
            ruling = None
        if ruling is None or not eid:
            raise click.UsageError(
                f"--resolve takes ID=rerun, ID=skipped (or ID=skip) or ID=applied, got {item!r}"
            )
        rulings.append((eid, ruling))
    permissions = PermissionManager((*policies, *(allow(a) for a in allowed)))
    try:
        executer = KyronixExecuter(
            permissions=permissions,
            receipts=receipts,
            continue_on_denial=go_on,
            pass_env=pass_env,
            sandbox=sandbox,
        )
    except KyronixError as exc:
        raise click.ClickException(str(exc)) from None
    with executer:
        try:
            if uncertain:
                listed = [
                    *(("running", r) for r in executer.running_executions(base)),
                    *(("uncertain", r) for r in executer.uncertain_executions(base)),
                ]
                listed.sort(key=lambda item: item[1].started_at)
                _print(
                    [
                        {
                            "executionId": r.execution_id,
                            "tool": r.tool,
                            "state": state,
                            "startedAt": r.started_at,
                            "pid": r.pid,
                            "host": r.host,
                        }
                        for state, r in listed
                    ]
                )
                return
            if rulings:
                _apply_rulings(executer, rulings, base)
                return
            if plan is None:
                raise click.UsageError("give the KML plan to run (a file, or - for standard input)")
            text = _read_plan(plan)
            try:
                results = executer.execute_sync(text, base)
            except KmlError as exc:
                click.echo(
                    f"kyronix exec: {plan} is not valid KML {exc}; nothing was run", err=True
                )
                sys.exit(2)
        except KyronixError as exc:  # a user's error, said in one sentence: no traceback
            raise click.ClickException(str(exc)) from None
    _print(results)
    if not all(r["result"]["success"] for r in results):
        sys.exit(1)


def _apply_rulings(
    executer: KyronixExecuter, rulings: Sequence[tuple[str, Ruling]], base: str
) -> None:
    """Settle uncertain executions (``kyronix exec --resolve``, ``kyronix executer resolve``),
    saying each one on stderr; a :class:`~kyronix.errors.KyronixError` goes to the caller."""
    for eid, ruling in rulings:
        executer.resolve(eid, ruling, base)
        click.echo(f"{eid}: {ruling.value}", err=True)


def _read_plan(plan: str) -> str:
    """The plan's text; exit status 2 (nothing ran) when it cannot be read as UTF-8 text."""
    try:
        data = sys.stdin.buffer.read() if plan == "-" else Path(plan).read_bytes()
    except OSError as exc:
        what = "standard input" if plan == "-" else plan
        _plan_error(f"cannot read the plan {what}: {exc.strerror or exc}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        what = "on standard input" if plan == "-" else plan
        _plan_error(
            f"the plan {what} is not UTF-8 text (byte {exc.start} is not valid UTF-8); "
            f"save it as UTF-8"
        )


def _plan_error(message: str) -> NoReturn:
    click.echo(f"kyronix exec: {message}; nothing was run", err=True)
    sys.exit(2)


def _print(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


@cli.group("receipts", context_settings={"help_option_names": ["-h", "--help"]})
def receipts_group() -> None:
    """The executer's receipt store: what already ran, so nothing runs twice."""


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or several: ``1d12h``) in seconds."""
    spec = text.strip().lower()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(spec):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not spec or pos != len(spec):
        raise click.BadParameter(
            f"{text!r} is not a duration; write it as 30d, 12h, 90m, 45s or 2w", param_hint="AGE"
        )
    return total


@receipts_group.command("prune", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="AGE",
    help="Forget receipts that settled longer ago than this: 30d, 12h, 90m, 45s, 2w.",
)
@_RECEIPTS
@click.option(
    "--base",
    "base",
    type=click.Path(file_okay=False, dir_okay=True, exists=True),
    default=None,
    help="Only the receipts of this base directory (default: every base in the store).",
)
def prune_command(*, older_than: str, receipts: str | None, base: str | None) -> None:
    """Forget finished (and ruled-on) receipts older than AGE, and say how many. An id that is
    forgotten runs again if a plan sends it again; executions that never finished are kept
    until a person rules on them."""
    from kyronix.executer import KyronixError, KyronixExecuter

    seconds = parse_duration(older_than)
    try:
        with KyronixExecuter(receipts=receipts) as executer:
            removed = executer.prune_receipts(seconds, base)
    except KyronixError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"pruned {removed} receipt{'s' if removed != 1 else ''} older than {older_than}")


_BASE = click.option(
    "--base",
    "base",
    type=click.Path(file_okay=False, dir_okay=True, exists=True),
    default=".",
    show_default=True,
    help="The directory every path is resolved in (nothing outside it is touched).",
)


@cli.group(
    "executer",
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("--ws", "ws_url", metavar="URL", help="The server's tunnel: ws://HOST:8080/ws.")
@_BASE
@click.option("--root", is_flag=True, help="Allow every tool (ROOT_POLICIES) instead of SAFE.")
@click.option(
    "--allow",
    "allowed",
    multiple=True,
    metavar="ACTION",
    help="Also allow an action, e.g. tool:terminal, tool:http_request, net:private. Repeatable.",
)
@click.option(
    "--api-key",
    "api_key",
    metavar="KEY",
    default=None,
    help="The project's API key (kyr_...; default: $KYRONIX_API_KEY).",
)
@click.option(
    "--executer-id",
    "executer_id",
    metavar="ID",
    default="default",
    show_default=True,
    help="This executer's name in the project (runtimes may address it by it).",
)
@_RECEIPTS
@click.option(
    "--pass-env",
    "pass_env",
    multiple=True,
    metavar="NAME",
    help="Pass this environment variable to the terminal though it looks like a credential.",
)
@_SANDBOX
@click.pass_context
def executer_group(
    ctx: click.Context,
    *,
    ws_url: str | None,
    base: str,
    root: bool,
    allowed: tuple[str, ...],
    api_key: str | None,
    executer_id: str,
    receipts: str | None,
    pass_env: tuple[str, ...],
    sandbox: str,
) -> None:
    """Serve the server's WebSocket tunnel: run the KML requests it relays in --base, under the
    policies (SAFE unless --root / --allow), with receipts so nothing runs twice. Reconnects by
    itself; SIGTERM or Ctrl-C lets the running requests finish, then exits with status 0 (a
    second one stops at once, status 1). `kyronix executer resolve` rules on what a killed
    executer left uncertain."""
    if ctx.invoked_subcommand is not None:
        return
    if not ws_url:
        raise click.UsageError("give the server's tunnel URL with --ws ws://HOST:8080/ws")
    from kyronix.executer import (
        ROOT_POLICIES,
        SAFE_POLICIES,
        KyronixError,
        KyronixExecuter,
        KyronixUsageError,
        PermissionManager,
        TunnelEvent,
        allow,
    )

    for action in allowed:
        if ":" not in action:
            raise click.UsageError(
                f"--allow takes an action such as tool:terminal or net:private, got {action!r}"
            )
    policies = ROOT_POLICIES if root else SAFE_POLICIES

    def say(event: TunnelEvent) -> None:
        click.echo(event.message, err=True)

    try:
        executer = KyronixExecuter(
            ws_url,
            PermissionManager((*policies, *(allow(a) for a in allowed))),
            api_key=api_key,
            executer_id=executer_id,
            base_path=base,
            receipts=receipts,
            pass_env=pass_env,
            on_tunnel_event=say,
            sandbox=sandbox,
        )
    except KyronixUsageError as exc:
        raise click.UsageError(str(exc)) from None
    except KyronixError as exc:
        raise click.ClickException(str(exc)) from None
    _say_sandbox(sandbox)
    try:
        _serve_daemon(executer)
    except KyronixError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        executer.close()


def _say_sandbox(mode: str) -> None:
    """One line on stderr when terminal commands will not be contained as expected."""
    from kiso.tools.sandbox import probe

    if mode == "off":
        click.echo(
            "kyronix: --sandbox off: terminal commands run with this user's access", err=True
        )
    elif (why := probe()) is not None:
        click.echo(
            f"kyronix: terminal commands will fail: {why} (or start with --sandbox off)", err=True
        )


def _serve_daemon(executer: KyronixExecuter) -> None:
    """Serve until SIGTERM / SIGINT: the first lets running requests finish, a second exits."""
    import asyncio
    import signal

    async def main() -> None:
        loop = asyncio.get_running_loop()
        signals = 0

        def stop(name: str) -> None:
            nonlocal signals
            signals += 1
            tunnel = executer.tunnel
            if signals > 1 or tunnel is None:
                running = tunnel.running_requests if tunnel is not None else []
                click.echo(
                    f"{name} again: stopped at once; interrupted: {', '.join(running) or 'none'} "
                    f"(a tool with effects that was running is uncertain until resolved)",
                    err=True,
                )
                os._exit(1)
            click.echo(f"{name}: stopping", err=True)
            tunnel.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig.name)
        try:
            await executer.serve_forever()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await executer.aclose()

    asyncio.run(main())


@executer_group.command("resolve", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("execution_id", metavar="ID")
@click.argument("ruling", metavar="rerun|skipped|applied")
@_BASE
@_RECEIPTS
def executer_resolve_command(
    *, execution_id: str, ruling: str, base: str, receipts: str | None
) -> None:
    """Rule on an uncertain execution after checking what really happened: rerun lets the next
    request run it, skipped / applied (skip is accepted) record that outcome as its result.
    The same as `kyronix exec --resolve ID=RULING`."""
    from kiso.kernel.errors import UsageError
    from kiso.kernel.execution import parse_ruling
    from kyronix.executer import KyronixError, KyronixExecuter

    try:
        how = parse_ruling(ruling)
    except UsageError:
        how = None
    if how is None:
        raise click.UsageError(f"the ruling is rerun, skipped (or skip) or applied, got {ruling!r}")
    try:
        with KyronixExecuter(receipts=receipts) as executer:
            _apply_rulings(executer, [(execution_id, how)], base)
    except KyronixError as exc:
        raise click.ClickException(str(exc)) from None


from kyronix.server.cli import add_commands  # noqa: E402

add_commands(cli)


def main() -> None:
    cli(prog_name="kyronix")
