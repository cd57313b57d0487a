"""The keys of the ``?`` sheet, each pressed in a real PTY: copy (OSC 52), the transcript, undo
and redo, word motion and deletion, $EDITOR, the sheet itself, and a panel's typed answer and
its "narrower versions" option."""

# The fixtures (ws, kiso_home, spawn) come from test_repl: their names are parameters here.
# ruff: noqa: F401, F811

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from pathlib import Path

from kiso.cli.panels import NARROWER
from kiso.cli.render import KEYS, PROMPT
from kiso.kernel import ApprovalDecided

from .test_repl import (
    ENTER,
    Term,
    events,
    kiso_home,
    shell,
    spawn,
    write_script,
    ws,
)
from .test_repl_session import input_line

CTRL_D = "\x04"


def typed(term: Term, text: str) -> None:
    """Wait until the input row reads ``text``."""
    term.wait(lambda: input_line(term) == (PROMPT + text).rstrip(), 5, f"the input {text!r}")


def test_ctrl_x_copies_the_last_answer_through_the_terminal(
    spawn: Callable[..., Term], tmp_path: Path
) -> None:
    answer = "Copy me.\n\nA second paragraph."
    script = write_script(tmp_path / "s.json", [{"text": answer}])
    term = spawn(script)
    term.wait_for("▸ default")
    term.send("\x18")  # ctrl+x before any answer
    term.wait_for("no answer to copy yet")
    term.send("say it" + ENTER)
    term.wait_for("A second paragraph.")
    term.send("\x18")
    term.wait_for("copied the last answer (3 lines")
    osc = b"\x1b]52;c;" + base64.b64encode(answer.encode()) + b"\x07"
    assert osc in term.raw
    term.send(CTRL_D)
    assert term.exit_status() == 0


def test_undo_redo_word_motion_and_word_deletion_in_the_input(
    spawn: Callable[..., Term], tmp_path: Path
) -> None:
    term = spawn(write_script(tmp_path / "s.json", [{"text": "ok"}]))
    term.wait_for("▸ default")
    term.send("alpha beta gamma")
    typed(term, "alpha beta gamma")
    term.send("\x1a")  # ctrl+z undoes (it used to insert a literal ^Z)
    term.wait(lambda: input_line(term) != PROMPT + "alpha beta gamma", 5, "the undo")
    undone = input_line(term)
    assert "^Z" not in undone and (PROMPT + "alpha beta gamma").startswith(undone)
    term.send("\x19")  # ctrl+y redoes
    typed(term, "alpha beta gamma")
    term.send("\x1b[1;3D")  # alt+← to the start of "gamma"
    term.send("1")
    typed(term, "alpha beta 1gamma")
    term.send("\x1b[1;5D" * 3)  # ctrl+← three times: to "1gamma", "beta", then "alpha"
    term.send("2")
    typed(term, "2alpha beta 1gamma")
    term.send("\x1b[1;5C")  # ctrl+→ past "2alpha"
    term.send("3")
    typed(term, "2alpha3 beta 1gamma")
    term.send("\x1b[1;3C")  # alt+→ past " beta"
    term.send("4")
    typed(term, "2alpha3 beta4 1gamma")
    term.send("\x1b\x7f")  # alt+⌫ deletes the word before the cursor
    typed(term, "2alpha3  1gamma")
    term.send("\x01\x1bd")  # ctrl+a, then alt+d deletes the word after it
    typed(term, "  1gamma")
    term.send("\x03")  # ctrl+c clears the line
    typed(term, "")
    term.send("one\x1b[13;2utwo\x1b[27;2;13~three\nfour")  # shift+⏎ (CSI u, xterm), ctrl+j
    term.wait(lambda: "  four" in term.text, 5, "four lines in the input")
    rows = [r.rstrip() for r in term.screen.display]
    at = rows.index(PROMPT + "one")
    assert rows[at + 1 : at + 4] == ["  two", "  three", "  four"]
    term.send("\x03" + CTRL_D)
    assert term.exit_status() == 0


def test_ctrl_g_edits_the_input_in_the_editor(spawn: Callable[..., Term], tmp_path: Path) -> None:
    editor = tmp_path / "editor.sh"
    editor.write_text('#!/bin/sh\nprintf \'%s and more from the editor\' "$(cat "$1")" > "$1"\n')
    editor.chmod(0o755)
    script = write_script(tmp_path / "s.json", [{"text": "Edited text received."}])
    term = spawn(script, EDITOR=str(editor), VISUAL=str(editor))
    term.wait_for("▸ default")
    term.send("draft")
    typed(term, "draft")
    term.send("\x07")  # ctrl+g
    typed(term, "draft and more from the editor")
    term.send(ENTER)
    term.wait_for("Edited text received.")
    term.send(CTRL_D)
    assert term.exit_status() == 0


def test_the_sheet_lists_the_keys(spawn: Callable[..., Term], tmp_path: Path) -> None:
    term = spawn(write_script(tmp_path / "s.json", [{"text": "ok"}]))
    term.wait_for("▸ default")
    term.send("?")
    screen = term.wait_for("panels: ↑↓ move")
    for row in KEYS.splitlines():
        assert row in screen
    for key in ("alt+⏎ / ctrl+⏎ redirect", "queue pop", "ctrl+r transcript", "ctrl+x copy"):
        assert key in KEYS
    assert "ctrl+v" not in KEYS  # no clipboard image reader: not listed, since it does not work
    term.send(CTRL_D)
    assert term.exit_status() == 0


def test_t_in_the_approval_panel_types_the_reason_of_a_denial(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    script = write_script(tmp_path / "s.json", [shell("touch made.txt"), {"text": "Understood."}])
    term = spawn(script)
    term.wait_for("▸ default")
    term.send("make it" + ENTER)
    screen = term.wait_for("Run this command?")
    assert "t types" in screen
    term.send("t")
    term.wait_for("why?")
    term.send("not in this folder" + ENTER)
    term.wait_for("Understood.")
    assert "✗ denied: not in this folder" in term.text
    assert not (ws / "made.txt").exists()
    decided = [e for e in events(kiso_home, "s") if isinstance(e, ApprovalDecided)]
    assert [(d.decision, d.reason) for d in decided] == [("denied", "not in this folder")]


def test_narrower_versions_asks_the_model_once_by_denying_with_that_request(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    narrower = "1. rm build/cache only\n2. rm build/*.o only"
    script = write_script(tmp_path / "s.json", [shell("rm -rf build"), {"text": narrower}])
    (ws / "build").mkdir()
    term = spawn(script)
    term.wait_for("▸ default")
    term.send("clean" + ENTER)
    screen = term.wait_for("Run this command?")
    assert "4. No, ask for narrower versions" in screen
    term.send("4")
    term.wait_for("the model is asked for narrower versions")
    term.wait_for("rm build/*.o only")
    assert (ws / "build").exists()
    decided = [e for e in events(kiso_home, "s") if isinstance(e, ApprovalDecided)]
    assert [(d.decision, d.reason) for d in decided] == [("denied", NARROWER)]
    assert os.path.isdir(ws / "build")
