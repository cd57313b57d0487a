"""``kiso trust [PATH] [--revoke]`` and the terminal prompt of the project trust gate.

The gate itself (the scan, the digest, the verdicts in ``$KISO_HOME/trust.json``) is
:mod:`kiso.runtime.trust`; this module is the two ways a person answers it:

* :func:`ask_on_terminal`: the interactive session's question, asked on the terminal before the
  UI starts: the files, then ``Trust and apply them? [y/N]``. Anything but yes refuses (and the
  refusal is recorded: kiso asks again only when the files change); end of input or ctrl+c
  answers nothing this time.
* :func:`trust_command`: running ``kiso trust`` is itself the explicit act, so it lists the files
  and trusts them without a question; ``--revoke`` records a refusal instead, after which kiso
  runs there without the project's ``.kiso/`` (headless runs too) until its files change.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from kiso.kernel import KisoError, kiso_home
from kiso.runtime.command_hooks import describe_hooks
from kiso.runtime.trust import Snapshot, Status, TrustCheck, TrustStore, check

__all__ = ["ask_on_terminal", "describe", "trust_command"]

_SHOW_LIMIT = 4096
_SHOWN = ("config.json", "mcp.json")
"""These files, up to ``_SHOW_LIMIT`` bytes, are shown whole under their names in the question."""
_WARNING = (
    "Files in a project's .kiso/ came with the repository. A profile there can send\n"
    "your API key to any server; a mode there can run every call without asking."
)


def describe(snapshot: Snapshot, *, show_config: bool = True) -> list[str]:
    """The listing a person reviews: each entry with its size, small config files shown whole."""
    lines = [f"{snapshot.root}:"]
    for entry in snapshot.entries:
        lines.append(f"  {entry.describe()}")
        raw = snapshot.contents.get(entry.path)
        if show_config and raw is not None and len(raw) <= _SHOW_LIMIT and entry.path in _SHOWN:
            text = raw.decode("utf-8", "replace")
            lines += [f"  │ {_printable(line)}" for line in text.splitlines()]
        if entry.path == "config.json" and raw is not None:  # commands it would run, always said
            lines += [f"  ! runs the hook {_printable(h)}" for h in describe_hooks(raw)]
    return lines


def _printable(line: str) -> str:
    """No escape sequence from a file reaches the terminal."""
    return "".join(ch if ch.isprintable() or ch == "\t" else repr(ch)[1:-1] for ch in line)


@contextlib.contextmanager
def _terminal() -> Iterator[tuple[TextIO, TextIO]]:
    """The controlling terminal for the question, else stdin and stderr."""
    try:
        tty = open("/dev/tty", "r+", encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError:
        yield sys.stdin, sys.stderr
        return
    try:
        yield tty, tty
    finally:
        tty.close()


def ask_on_terminal(c: TrustCheck) -> bool | None:
    """Ask whether to trust the project's ``.kiso/``: True for y/yes, False for anything else,
    None when there is no answer (end of input, ctrl+c)."""
    head = (
        "has changed since you "
        + ("trusted" if c.previous and c.previous.trusted else "refused")
        + f" it on {c.previous.at}"
        if c.status is Status.CHANGED and c.previous is not None
        else "has not been reviewed"
    )
    lines = [f"kiso: this project's .kiso/ {head}.", _WARNING, ""]
    if c.status is Status.CHANGED:
        lines += [f"  {change}" for change in c.changes()] + [""]
    lines += describe(c.snapshot)
    lines += ["", "Nothing in it applies unless you trust it (`kiso trust --revoke` undoes it)."]
    with _terminal() as (reader, writer):
        try:
            writer.write("\n".join(lines) + "\nTrust and apply these files? [y/N] ")
            writer.flush()
            answer = reader.readline()
        except (KeyboardInterrupt, OSError):
            with contextlib.suppress(OSError):
                writer.write("\n")
                writer.flush()
            return None
    if not answer:  # end of input
        return None
    return answer.strip().lower() in ("y", "yes")


def trust_command(path: str | None, *, revoke: bool) -> int:
    """``kiso trust [PATH] [--revoke]``: the exit code (0 done, 1 could not)."""
    target = Path(os.path.realpath(path or os.getcwd()))
    if not target.is_dir():
        print(f"kiso trust: {target} is not a directory", file=sys.stderr)
        return 1
    home = kiso_home()
    store = TrustStore(home)
    try:
        c = check(target, home, store=store)
        if c.status is Status.NOTHING:
            dropped = revoke and store.forget(c.snapshot.project)
            print(
                f"nothing to trust: {c.snapshot.root} holds no files"
                + ("; the old verdict was forgotten" if dropped else "")
            )
            return 0
        for line in describe(c.snapshot, show_config=False):
            print(line)
        if revoke:
            verdict = store.record(c.snapshot, trusted=False)
            print(
                f"refused {verdict.digest}: kiso applies nothing in {c.snapshot.root}, and does "
                f"not ask again until its files change; `kiso trust` applies it"
            )
            return 0
        if c.status is Status.TRUSTED:
            assert c.previous is not None
            print(f"already trusted since {c.previous.at} ({c.previous.digest})")
            return 0
        verdict = store.record(c.snapshot, trusted=True)
    except KisoError as exc:
        print(f"kiso trust: {exc}", file=sys.stderr)
        return 1
    print(
        f"trusted {verdict.digest}: kiso applies these files in {c.snapshot.project} until one "
        f"of them changes (recorded in {store.path}; `kiso trust --revoke` undoes it)"
    )
    return 0
