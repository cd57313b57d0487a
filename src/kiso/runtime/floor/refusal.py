"""What the floor says when it says no."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Refusal"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A destructive command the floor will not let run."""

    reason: str
    """One sentence for the model and the human: what was refused and why."""
    command: str
    """The simple command (as text) that was refused."""
    target: str
    """The offending argument as written."""
