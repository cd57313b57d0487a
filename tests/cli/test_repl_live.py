"""The running shell's card shows a live tail of its output, then settles into one record."""

from __future__ import annotations

import json
from pathlib import Path

from .test_repl import Term, chat


def test_a_running_shell_shows_its_latest_output_live(tmp_path: Path) -> None:
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
        done = term.wait_for("exit 0", timeout=15)
        assert "└ tick" not in done  # the card settled into its one-line record
        term.wait_for("counted")
    finally:
        term.close()
