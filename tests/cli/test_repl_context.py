"""``/context`` and ``/compact`` in a real terminal: the rent ledger by part, and a summary on
demand that lands in the log as one ``compacted`` record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiso.kernel import Compacted, replay

from .test_repl import Term, chat, events

SUMMARY = "## Goal\nlist the files\n## Current work\nlisted them\n## Next steps\nnone"


@pytest.fixture
def terms() -> Iterator[list[Term]]:
    started: list[Term] = []
    yield started
    for term in started:
        term.close()


def test_context_shows_the_ledger_and_compact_writes_one_summary(
    tmp_path: Path, terms: list[Term]
) -> None:
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    (ws / "a.txt").write_text("alpha\n" * 200)
    turns = [
        {"tool_calls": [{"name": "read_file", "input": {"path": "a.txt"}}]},
        {"text": "read it", "usage": {"input": 3000, "output": 20}},
        {"text": "after the summary"},
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": turns, "summaries": [{"text": SUMMARY}]}))
    term = Term(chat("cx"), cwd=ws, home=home, script=script, KISO_CONTEXT_WINDOW="10000")
    terms.append(term)
    term.wait_for("▸ default")
    term.send("/context\r")
    term.wait_for("no request yet")
    term.send("read a.txt\r")
    term.wait_for("read it")
    term.wait_for("ctx left ~70%")  # the provider's 3,020 tokens of a 10,000-token window
    term.send("/context\r")
    term.wait_for("the provider's count of the last request")
    for part in ("system prompt", "tool schemas", "summary", "messages", "tool results"):
        assert part in term.text
    term.send("/compact the file names\r")
    term.wait_for("compacted (manual)")
    term.send("and now?\r")
    term.wait_for("after the summary")
    term.send("\x04")
    assert term.exit_status() == 0
    log = events(home, "cx")
    (c,) = [e for e in log if isinstance(e, Compacted)]
    assert c.trigger == "manual" and c.summary.startswith(SUMMARY)
    first = replay(log).messages[0]
    assert first.role == "user" and SUMMARY in first.content[0].text  # type: ignore[union-attr]
