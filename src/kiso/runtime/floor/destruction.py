"""What the floor reports when asked for every destructive command, whatever its target."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["IRREVERSIBLE", "KINDS", "Destruction"]

KINDS = (
    "rm",
    "rm -r",
    "find -delete",
    "find -exec rm",
    "git clean -f",
    "git reset --hard",
    "git checkout --",
    "git checkout -f",
    "git restore",
    "git switch -f",
    "unreadable",
)
"""Every ``Destruction.kind``. ``unreadable``: text the floor could not read far enough to rule
a destructive command out (shells nested too deeply, a line too long and garbled, an internal
failure)."""

IRREVERSIBLE = frozenset(
    {
        "rm -r",
        "find -delete",
        "find -exec rm",
        "git clean -f",
        "git reset --hard",
        "git checkout --",
        "unreadable",
    }
)
"""The kinds that carry the one yellow line: recursive ``rm``, ``find -delete``/``-exec rm``,
``git checkout --``, ``git reset --hard``, ``git clean -f`` (and what could not be read)."""


@dataclass(frozen=True, slots=True)
class Destruction:
    """One destructive simple command, wherever it is in the line and whatever it aims at."""

    kind: str
    """One of :data:`KINDS`: ``"rm -r"``, ``"git reset --hard"``..."""
    command: str
    """The simple command as written (for ``find -exec``, the ``find``)."""
    targets: tuple[str, ...]
    """What it deletes or discards, as written (``rm``'s operands, ``find``'s starting points,
    ``git``'s paths); empty when that is the whole working tree. ``<xargs input>`` stands for the
    names ``xargs`` reads."""
    irreversible: bool
    """One of the deletes the approval warns about (:data:`IRREVERSIBLE`)."""
    warning: str
    """One line for a person, naming what goes: ``rm deletes build, dist and everything
    inside``."""
