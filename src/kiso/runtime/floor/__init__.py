"""The catastrophe floor: refuse shell commands that would destroy what cannot be recovered.

:func:`check_command` reads a shell command line and returns a :class:`Refusal` when some simple
command in it is destructive *and* aims at something that cannot be recovered; otherwise ``None``.
It runs in every approval mode, ``bypass`` included, so it only ever says no.

:func:`destructive_commands` walks the same parse, through the same wrappers and shells, and
returns every destructive simple command in the line whatever it aims at, each a
:class:`Destruction` (its kind, its targets, whether it is an irreversible delete, and one line
naming what goes). It is what decides what an approval may offer (:mod:`kiso.runtime.offers`):
every command the floor refuses is among them.

What it guarantees, for the command line as written:

* Every simple command anywhere in the parse tree is checked: lists, pipelines, subshells,
  groups, ``$( )`` and backticks, process substitution, ``if``/``while``/``for``/``case``
  bodies and function bodies. Wrappers are seen through (``sudo``, ``doas``, ``env``,
  ``nice``, ``nohup``, ``time``, ``timeout``, ``command``, ``builtin``, ``exec``, ``busybox``,
  ``xargs``, ``find -exec``), and ``sh -c``/``bash -c``/``eval`` strings and here-documents fed
  to a shell are parsed in turn.
* The destructive commands are ``rm`` (recursive or not), ``git clean -f``,
  ``git reset --hard``, ``git checkout`` of paths or with ``-f``, ``git restore``,
  ``git switch -f``, and a ``find -delete`` or ``find -exec rm`` that selects nothing (so
  deletes everything under its starting points). The git ones are refused when run in the
  workspace, or above it, or somewhere unknown.
* The unrecoverable targets are ``/``; the system directories and anything in them (temporary
  directories excepted); the home directory and its ancestors; ``~/.ssh``, ``~/.gnupg``,
  ``~/.aws``, ``~/.config``, ``~/.kiso``; the workspace root and its ancestors; the workspace's
  ``.git``. A wildcard is refused when its expansion could reach any of those or everything in
  one of them (``rm -rf *`` at the workspace root), and so is a target that starts with a value
  known only when the command runs (``$DIR``, ``$(pwd)``). ``~``, ``$HOME`` and ``${HOME}`` are
  the home directory, ``$TMPDIR`` a temporary directory.
* ``cd`` is followed through the command line: ``cd /tmp/x && rm -rf *`` is allowed, while
  ``cd /tmp/x; rm -rf *`` is not (if the ``cd`` fails, ``rm`` runs where the line started).
* Input the parser cannot fully read is also scanned token by token, conservatively, and no
  input makes :func:`check_command` raise.

What it does not do: the floor reads the command line; it is not a sandbox. It does not look at
the file system (no symlinks, no existence checks), does not know what a script file, a function
or an alias does, does not follow other variables (even ones set earlier on the same line), and
does not read other interpreters (``python -c``, ``perl -e``, ``su -c``). A determined program
can always destroy files; the floor stops the plausible accident.
"""

from __future__ import annotations

from pathlib import Path

from kiso.runtime.floor.checker import Checker
from kiso.runtime.floor.destruction import IRREVERSIBLE, KINDS, Destruction
from kiso.runtime.floor.places import Places as _Places  # tests patch `floor._Places.of`
from kiso.runtime.floor.places import join
from kiso.runtime.floor.refusal import Refusal

__all__ = [
    "IRREVERSIBLE",
    "KINDS",
    "Destruction",
    "Refusal",
    "check_command",
    "destructive_commands",
]


def check_command(
    command: str, *, workspace: Path, home: Path, cwd: Path | None = None
) -> Refusal | None:
    """Return why ``command`` must not run, or ``None`` if the floor has no objection.

    ``workspace`` and ``home`` should be absolute; ``cwd`` (default: the workspace) is where the
    command starts, and may be relative to the workspace. Pure: nothing is read from the file
    system or the environment. Never raises: should the floor itself fail, it refuses.
    """
    try:
        return _checker(command, workspace, home).script(
            command, _start(workspace, home, cwd), None
        )
    except Exception:  # the floor must answer; failing closed is the safe answer
        return Refusal(
            reason="the command could not be analysed by the safety floor, so it was refused",
            command=command,
            target="",
        )


def destructive_commands(
    command: str, *, workspace: Path, home: Path, cwd: Path | None = None
) -> tuple[Destruction, ...]:
    """Every destructive simple command in ``command``, whatever it aims at, in order.

    ``rm`` (``"rm"``, or ``"rm -r"`` when recursive), ``find -delete``, ``find -exec rm``,
    ``git clean -f``, ``git reset --hard``, ``git checkout --`` (of paths), ``git checkout -f``,
    ``git restore``, ``git switch -f``: anywhere the floor looks (lists, pipelines, subshells,
    ``$( )``, ``sh -c``, ``eval``, here-documents fed to a shell, ``xargs``, ``find -exec``,
    ``sudo``/``env``/... wrappers). Mentioning is not running: ``echo rm -rf x`` has none. Text
    the parser cannot read is scanned token by token, so whatever might be one is reported; what
    cannot be read at all (shells nested too deeply) is one ``"unreadable"`` destruction. Every
    command :func:`check_command` refuses has at least one. Pure, and never raises: should the
    walk itself fail, the answer is one ``"unreadable"`` destruction.
    """
    try:
        checker = _checker(command, workspace, home, collect=True)
        checker.script(command, _start(workspace, home, cwd), None)
        return tuple(checker.found)
    except Exception:  # as the floor does: an answer that cannot be had is the cautious one
        warning = "the command could not be analysed: it may delete anything"
        return (Destruction("unreadable", command, (), True, warning),)


def _checker(command: str, workspace: Path, home: Path, *, collect: bool = False) -> Checker:
    options = command.lower().replace("_", "")
    dots = any(o in options for o in ("dotglob", "globdots", "globignore"))
    return Checker(_Places.of(workspace, home), dots, collect=collect)


def _start(workspace: Path, home: Path, cwd: Path | None) -> frozenset[str]:
    places = _Places.of(workspace, home)
    return frozenset({places.workspace if cwd is None else join(places.workspace, str(cwd))})
