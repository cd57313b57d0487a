"""The palette follows the terminal: kiso asks it for its background (OSC 11) on a terminal,
never with NO_COLOR, and KISO_THEME > the user config's theme > the answer > unknown."""

# The fixtures (ws, kiso_home, spawn) come from test_repl: their names are parameters here.
# ruff: noqa: F401, F811

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kiso.cli.theme import QUERY

from .test_repl import ENTER, PYTHON, Term, kiso_home, spawn, write_script, ws

ASK = (
    "import time; from kiso.cli.theme import query_background; t = time.monotonic(); "
    "got = query_background(0, 1, timeout={timeout}); "
    "print('ANSWER', got, round(time.monotonic() - t, 2))"
)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (b"\x1b]11;rgb:ffff/ffff/ffff\x07\x1b[?62;22c", "light"),
        (b"\x1b]11;rgb:1e1e/1e1e/2020\x1b\\\x1b[?64;1c", "dark"),
        (b"\x1b[?1;2c", "None"),  # answers the attributes only: no background, and no wait
    ],
)
def test_the_background_query_reads_the_terminals_answer(
    spawn: Callable[..., Term], reply: bytes, expected: str
) -> None:
    term = spawn(argv=[PYTHON, "-c", ASK.format(timeout=5.0)])
    term.wait(lambda: QUERY in term.raw, 10, "the query")
    term.child.send(reply)
    assert term.exit_status() == 0
    answer = next(ln for ln in term.text.splitlines() if ln.startswith("ANSWER")).split()
    assert answer[1] == expected
    assert float(answer[2]) < 4.0  # the attributes' answer ends the wait, not the limit


def test_a_terminal_that_says_nothing_costs_the_short_limit_only(
    spawn: Callable[..., Term],
) -> None:
    term = spawn(argv=[PYTHON, "-c", ASK.format(timeout=0.1)])
    assert term.exit_status() == 0
    answer = next(ln for ln in term.text.splitlines() if ln.startswith("ANSWER")).split()
    assert answer[1] == "None" and float(answer[2]) < 0.5


def theme_row(term: Term) -> str:
    term.send("/status" + ENTER)
    screen = term.wait_for("theme ")
    return next(ln for ln in screen.splitlines() if ln.startswith("theme "))


def test_the_session_asks_the_terminal_and_the_settings_outrank_it(
    spawn: Callable[..., Term], tmp_path: Path, kiso_home: Path
) -> None:
    script = write_script(tmp_path / "s.json", [{"text": "ok"}])
    term = spawn(script, sid="a")
    term.wait_for("▸ default")
    assert QUERY in term.raw  # asked on a terminal ...
    assert theme_row(term) == "theme      unknown"  # ... which (pyte) does not answer
    term.close()

    mono = spawn(script, sid="b", NO_COLOR="1")
    mono.wait_for("▸ default")
    assert QUERY not in mono.raw  # NO_COLOR: never asked
    mono.close()

    kiso_home.mkdir(exist_ok=True)
    (kiso_home / "config.json").write_text(json.dumps({"theme": "light"}))
    configured = spawn(script, sid="c")
    configured.wait_for("▸ default")
    assert theme_row(configured).startswith("theme      light (~/.kiso/config.json")
    assert QUERY not in configured.raw  # decided without asking
    configured.close()

    forced = spawn(script, sid="d", KISO_THEME="dark")
    forced.wait_for("▸ default")
    assert theme_row(forced) == "theme      dark (KISO_THEME)"
    forced.close()

    wrong = spawn(script, sid="e", KISO_THEME="blue")
    wrong.wait_for("must be dark or light")
    assert wrong.exit_status() == 1
