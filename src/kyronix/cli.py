"""The ``kyronix`` command: ``kyronix exec`` runs a KML plan locally; ``kyronix receipts prune``
forgets old receipts. The server's subcommands (serve, keys, agents) come with its issue."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from kiso import __version__

_RECEIPTS = click.option(
    "--receipts",
    type=click.Path(dir_okay=False),
    default=None,
    help="The receipt store (default: $KYRONIX_HOME/receipts.sqlite3).",
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
    uncertain: bool,
    resolutions: tuple[str, ...],
) -> None:
    """Run the tools of a KML plan (a file, or - for standard input) and print the results as
    JSON. Exit status: 0 when every tool succeeded, 1 when one failed, 2 when the plan could not
    be read (missing, unreadable, not UTF-8) or parsed (then nothing ran)."""
    from kiso.kernel.errors import UsageError
    from kiso.kernel.execution import Ruling, parse_ruling
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
            permissions=permissions, receipts=receipts, continue_on_denial=go_on, pass_env=pass_env
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
                for eid, ruling in rulings:
                    executer.resolve(eid, ruling, base)
                    click.echo(f"{eid}: {ruling.value}", err=True)
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


from kyronix.server.cli import add_commands  # noqa: E402

add_commands(cli)


def main() -> None:
    cli(prog_name="kyronix")
