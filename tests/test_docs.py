"""Docs that run: the README's Python example executes as written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_example_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    printed = out.getvalue().splitlines()
    assert printed[0] == "CallModel()"
    assert printed[1].startswith("[UserMessage(")


def test_every_adr_has_the_four_parts() -> None:
    adrs = sorted((ROOT / "docs" / "adr").glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert len(adrs) >= 4
    for adr in adrs:
        text = adr.read_text()
        for part in ("## Context", "## Decision", "## Consequences", "## When to overturn"):
            assert part in text, f"{adr.name} lacks {part}"
