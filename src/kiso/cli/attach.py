"""Attachments in a prompt: ``@path`` brings a file's text, a path to an image brings the image.

(Stub: being written.)
"""

from __future__ import annotations

from pathlib import Path

from kiso.kernel.values import UserBlock

__all__ = ["expand_prompt"]


def expand_prompt(text: str, workspace: Path, *, vision: bool = True) -> str | list[UserBlock]:
    """The prompt as the model gets it: ``text`` alone when it attaches nothing."""
    return text
