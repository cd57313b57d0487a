"""What the bottom of the terminal shows while a turn is live: the running shell's card with a
live tail of its output (then its settled record, which keeps the tail), the streaming paragraph
with the input and the status row still in place, and the working row's live token count."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kiso.cli.render import PROMPT

from .test_repl import Term, chat, status_line


def test_a_running_shell_shows_its_latest_output_live_and_keeps_its_tail(tmp_path: Path) -> None:
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    command = "for i in 1 2 3; do echo tick$i; sleep 0.5; done"
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    {"tool_calls": [{"name": "shell", "input": {"command": command}}]},
                    {"text": "counted"},
                ]
            }
        )
    )
    term = Term(chat("t1", mode="bypass"), cwd=ws, home=home, script=script)
    try:
        term.wait_for("▸ ")
        term.send("count\r")
        live = term.wait_for("└ tick1", timeout=10)
        assert "exit 0" not in live  # still running: the tail is live, not the final record
        assert re.search(r"^    \d+\.\ds · esc stops · alt\+⏎ redirects$", live, re.MULTILINE)
        done = term.wait_for("exit 0 · 3 lines", timeout=15)
        lines = done.splitlines()
        at = next(i for i, ln in enumerate(lines) if ln.startswith(f"  shell {command}"))
        assert lines[at + 1 : at + 4] == ["  └ tick1", "    tick2", "    tick3"]
        assert re.fullmatch(r"    exit 0 · 3 lines · \d+\.\ds", lines[at + 4])
        term.wait_for("counted")
        assert "esc stops" not in term.text  # the live card is gone; only its record stays
    finally:
        term.close()


def test_while_text_streams_the_input_and_the_status_row_stay_on_screen(tmp_path: Path) -> None:
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    words = " ".join(f"word{i:03d}" for i in range(600))  # one paragraph of ~48 rows
    script = tmp_path / "script.json"
    turn = {"text": words + " THE-END.", "delay_ms": 6000}
    script.write_text(json.dumps({"turns": [turn]}))
    term = Term(chat("st"), cwd=ws, home=home, script=script, cols=100, rows=24)
    try:
        term.wait_for("▸ default")
        term.send("talk\r")
        term.wait_for("word400", timeout=15)  # the newest words are on screen as they arrive
        screen = term.screen.display
        assert "THE-END" not in term.text  # ... long before the paragraph ends
        assert any(row.startswith("▸ default") for row in screen), term.text
        assert any(row.rstrip() == PROMPT.strip() for row in screen), term.text  # the input
        working = next(row for row in screen if row.startswith("✦ working"))
        assert re.search(r"↓ ~\d+ tokens · \d+ tok/s · esc stop · alt\+⏎ redirect", working)
        paragraph = [row.split() for row in screen if row.startswith("word")]
        assert len(paragraph) >= 5
        for tokens in paragraph[:-1]:  # broken between words, never inside one
            assert all(re.fullmatch(r"word\d{3}", t) for t in tokens), term.text
        term.wait_for("THE-END.", timeout=15)
        term.wait(lambda: "ctx left" in status_line(term), 5, "the status row")
    finally:
        term.close()
