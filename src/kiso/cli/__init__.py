"""The ``kiso`` command. :func:`main` answers ``--version`` and ``--help`` before importing click
or anything else, so the commands people type most often start as fast as Python does."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    args = sys.argv[1:]
    if args in (["--version"], ["-v"]):
        from kiso._version import __version__

        sys.stdout.write(f"kiso, version {__version__}\n")
        return
    if args in (["--help"], ["-h"]):
        from kiso.cli.help import HELP

        sys.stdout.write(HELP)
        return
    from kiso.cli.main import main as full

    full()
