"""Interactive settings are durable facts, and the keyless demo ends with a non-zero exit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiso.kernel import SettingChanged

from .test_repl import Term, chat, events


@pytest.fixture
def term_factory(tmp_path: Path) -> Iterator[list[Term]]:
    started: list[Term] = []
    yield started
    for term in started:
        term.close()


def test_mode_and_model_switches_are_recorded_and_used(
    tmp_path: Path, term_factory: list[Term]
) -> None:
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "one"}, {"text": "two"}]}))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"turns": [{"text": "from the other model"}] * 3}))
    profile = {"kind": "openai-compat", "model": "m", "baseUrl": "http://127.0.0.1:9/v1"}
    (home / "config.json").write_text(json.dumps({"models": {"gw": profile}}))
    term = Term(chat("m1"), cwd=ws, home=home, script=script)
    term_factory.append(term)
    term.wait_for("▸ ")
    term.send("/mode plan\r")
    term.wait_for("mode: plan")
    term.send("/model nope\r")
    term.wait_for("no model profile named 'nope'")
    term.send("/model gw\r")
    term.wait_for("model: gw")
    term.send("\x04")
    assert term.exit_status() == 0
    changes = [e for e in events(home, "m1") if isinstance(e, SettingChanged)]
    assert [(c.key, c.value, c.run) for c in changes] == [
        ("mode", "plan", None),
        ("model", "gw", None),
    ]


def test_the_keyless_demo_ends_the_session_with_a_set_a_key_message(
    tmp_path: Path, term_factory: list[Term]
) -> None:
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    term = Term(chat("k1"), cwd=ws, home=home, script=None)
    term_factory.append(term)
    term.wait_for("▸ ")
    term.send("hello\r")
    term.wait_for("Run this command?", timeout=15)  # the demo's shell call asks first
    term.send("3")
    term.wait_for("why?", timeout=5)
    term.send("\r")
    text = term.wait_for("Set an API key", timeout=15)
    assert "script_exhausted" in text
    assert term.exit_status() == 1
