"""The ``kyronix`` command. Its subcommands (serve, executer, keys, agents) come with their
issues."""

from __future__ import annotations

import click

from kiso import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-v", "--version", prog_name="kyronix")
def cli() -> None:
    """Kyronix: an agent platform built on the kiso durable runtime."""


def main() -> None:
    cli(prog_name="kyronix")
