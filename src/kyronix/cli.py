"""The ``kyronix`` command: ``kyronix exec`` runs a KML plan locally. The server's subcommands
(serve, keys, agents) come with its issue."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from kiso import __version__


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
@click.option(
    "--receipts",
    type=click.Path(dir_okay=False),
    default=None,
    help="The receipt store (default: $KYRONIX_HOME/receipts.sqlite3).",
)
@click.option(
    "--uncertain", is_flag=True, help="List executions that started and never finished, and exit."
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
    uncertain: bool,
    resolutions: tuple[str, ...],
) -> None:
    """Run the tools of a KML plan (a file, or - for standard input) and print the results as
    JSON. Exit status: 0 when every tool succeeded, 1 when one failed, 2 when the plan could not
    be read or parsed (then nothing ran)."""
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
            permissions=permissions, receipts=receipts, continue_on_denial=go_on
        )
    except KyronixError as exc:
        raise click.ClickException(str(exc)) from None
    with executer:
        try:
            if uncertain:
                _print(
                    [
                        {
                            "executionId": r.execution_id,
                            "tool": r.tool,
                            "startedAt": r.started_at,
                            "pid": r.pid,
                            "host": r.host,
                        }
                        for r in executer.uncertain_executions(base)
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
    if plan == "-":
        try:
            return sys.stdin.read()
        except UnicodeDecodeError:
            raise click.ClickException("the plan on standard input is not UTF-8 text") from None
    try:
        return Path(plan).read_text(encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot read the plan {plan}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise click.ClickException(f"the plan {plan} is not UTF-8 text") from None


def _print(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def main() -> None:
    cli(prog_name="kyronix")
