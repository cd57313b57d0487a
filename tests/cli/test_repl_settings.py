"""Interactive settings are durable facts (recorded once the session exists), /model picks
profiles and effort levels, and the keyless demo ends with a non-zero exit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiso.kernel import RunStarted, SettingChanged

from .test_repl import ESC, Term, chat, events


@pytest.fixture
def term_factory(tmp_path: Path) -> Iterator[list[Term]]:
    started: list[Term] = []
    yield started
    for term in started:
        term.close()


def test_settings_before_the_first_prompt_are_recorded_when_it_creates_the_session(
    tmp_path: Path, term_factory: list[Term]
) -> None:
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "one"}, {"text": "two"}]}))
    profile = {"kind": "openai-compat", "model": "m", "baseUrl": "http://127.0.0.1:9/v1"}
    (home / "config.json").write_text(json.dumps({"models": {"gw": profile}}))
    term = Term(chat("m1"), cwd=ws, home=home, script=script)
    term_factory.append(term)
    term.wait_for("▸ default")
    assert "saved when the first prompt is sent" in term.text
    term.send("/mode plan\r")
    term.wait_for("mode: plan")
    term.wait_for("▸ plan")  # the status row says the mode before the session exists
    assert not list(home.rglob("m1.jsonl"))
    term.send("hello\r")
    term.wait_for("one")
    term.send("/model nope\r")
    term.wait_for("no model profile named 'nope'")
    term.send("/model gw\r")
    term.wait_for("model: gw")
    term.send("\x04")
    assert term.exit_status() == 0
    log = events(home, "m1")
    changes = [e for e in log if isinstance(e, SettingChanged) and e.key in ("mode", "model")]
    assert [(c.key, c.value, c.run) for c in changes] == [
        ("mode", "plan", None),
        ("model", "gw", None),
    ]
    first_run = next(e for e in log if isinstance(e, RunStarted))
    assert log.index(changes[0]) < log.index(first_run) and first_run.mode == "plan"


def test_model_opens_a_picker_of_profiles_with_their_keys_and_effort_levels(
    tmp_path: Path, term_factory: list[Term]
) -> None:
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    home.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "one"}]}))
    models = {
        "gw": {
            "kind": "openai-compat",
            "model": "gpt-5",
            "apiKeyEnv": "GW_KEY",
            "baseUrl": "http://127.0.0.1:9/v1",
        },
        "nokey": {
            "kind": "openai-compat",
            "model": "deepseek-chat",
            "apiKeyEnv": "NOT_SET_ANYWHERE",
            "baseUrl": "http://127.0.0.1:9/v1",
        },
    }
    (home / "config.json").write_text(json.dumps({"models": models}))
    secret = "sk-test-SECRET-4242"
    term = Term(chat("p1"), cwd=ws, home=home, script=script, GW_KEY=secret)
    term_factory.append(term)
    term.wait_for("▸ default")
    term.send("/model\r")
    screen = term.wait_for("Model for the turns that follow")
    squashed = "".join(screen.split())
    assert "1.faux" in squashed and "inuse" in squashed  # the model in use, though no profile
    assert "2.gwopenai-compatgpt-5·available·effortminimal/low/medium/high" in squashed
    assert "3.nokeyopenai-compatdeepseek-chat·unavailable:" in squashed
    assert "NOT_SET_ANYWHERE" in squashed and "noeffortlevels" in squashed
    term.send("3")  # an unavailable profile cannot be picked: it says why
    term.wait_for("nokey is unavailable")
    term.send("2")
    term.wait_for("Effort for gw (gpt-5)?")
    term.send("2")  # low
    term.wait_for("model: gw (openai-compat gpt-5, key: env:GW_KEY) · effort low")
    term.send("/model gw extreme\r")
    term.wait_for("has no effort level 'extreme'; its levels: minimal, low, medium, high")
    term.send("/model nokey\r")
    term.wait_for("NOT_SET_ANYWHERE")
    term.send("/model\r")
    term.wait_for("effort minimal/low/medium/high (set: low)")
    term.send("t")  # type a free answer: a profile (or provider/model) and an effort
    term.wait_for("model [effort]:")
    term.send("gw high\r")
    term.wait_for("· effort high (for the turns that follow)")
    term.send("/model\r")
    term.wait_for("(set: high)")
    term.send(ESC)
    term.wait(lambda: "Model for the turns" not in term.text.splitlines()[-1], 5, "the panel")
    term.send("/status\r")
    term.wait_for("effort high")
    assert secret not in term.raw.decode("utf-8", "replace")  # a key is never shown
    term.send("\x04")
    assert term.exit_status() == 0


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
