"""The session's lifetime as a person sees it: created by the first prompt (not before), its
earlier conversation shown when it is resumed, ↑ history kept per workspace across sessions, a
queued prompt taken back with ↑, and a running turn redirected with alt+⏎ / ctrl+⏎."""

# The fixtures (ws, kiso_home, spawn) come from test_repl: their names are parameters here.
# ruff: noqa: F401, F811

from __future__ import annotations

import re
import stat
from collections.abc import Callable
from pathlib import Path

from kiso.cli.panels import history_path
from kiso.cli.render import PROMPT
from kiso.kernel import JsonlSessionStore, RunEnded, RunStarted, User
from kiso.providers import FauxAdapter
from kiso.runtime import Agent
from kiso.tools import builtin_tools

from .test_repl import (
    ENTER,
    ENTRY,
    KISO,
    PYTHON,
    Term,
    events,
    has_chat,
    kiso_home,
    shell,
    spawn,
    write_script,
    ws,
)

CTRL_D = "\x04"


def input_line(term: Term) -> str:
    """The input row: the last row that starts with the prompt's mark."""
    rows = [r.rstrip() for r in term.screen.display if r.startswith(PROMPT.strip())]
    return rows[-1] if rows else ""


def squash_lines(text: str) -> str:
    """The screen with rich's line wrapping undone (rows joined by a space, runs of spaces
    made one)."""
    return " ".join(" ".join(row.split()) for row in text.splitlines())


def new_session_argv() -> list[str]:
    """``kiso`` with no session id: a new session."""
    if has_chat():
        return [str(KISO), "chat"]
    return [PYTHON, "-c", ENTRY.format(sid=None, mode=None)]


def test_quitting_before_the_first_prompt_leaves_no_session(
    spawn: Callable[..., Term], tmp_path: Path, kiso_home: Path
) -> None:
    script = write_script(tmp_path / "s.json", [{"text": "Hello."}])
    for argv in (None, new_session_argv()):
        term = spawn(script, sid="unsent", argv=argv)
        term.wait_for("▸ default")
        assert "saved when the first prompt is sent" in squash_lines(term.text)
        term.send("/status" + ENTER)
        term.wait(lambda t=term: "history /" in squash_lines(t.text), 5, "/status's last row")
        status = squash_lines(term.text)
        assert "(new: saved when the first prompt is sent)" in status
        assert re.search(r"system the system prompt is ~[\d,]+ tokens", status), status
        assert "cost cost unknown: faux:s.json has no dated price in the registry" in status
        term.send("/mode plan" + ENTER)
        term.wait_for("mode: plan")
        term.send(CTRL_D)
        assert term.exit_status() == 0
        assert "nothing was sent, so no session was saved" in term.text
    assert list(kiso_home.rglob("*.jsonl")) == []
    assert JsonlSessionStore(kiso_home).list() == []  # the picker has nothing to offer

    term = spawn(script, sid="sent")
    term.wait_for("▸ default")
    term.send("hi" + ENTER)
    term.wait_for("Hello.")
    term.send(CTRL_D)
    assert term.exit_status() == 0
    assert [r.id for r in JsonlSessionStore(kiso_home).list()] == ["sent"]


def _conversation(home: Path, ws: Path) -> None:
    """Session ``old``: four runs, the third with a shell command."""
    turns = [
        {"text": "Answer one."},
        {"text": "Answer two."},
        shell("printf 'alpha\\nbeta\\n'"),
        {"text": "Ran it."},
        {"text": "A haiku:\nline one\nline two\nline three"},
    ]
    agent = Agent(
        adapter=FauxAdapter(turns),
        tools=builtin_tools(),
        store=JsonlSessionStore(home),
        workspace=ws,
        mode="bypass",
    )
    with agent.session("old") as s:
        for prompt in ("first question", "second question", "run something", "a haiku"):
            list(s.run_sync(prompt))


def test_resuming_shows_the_last_turns_and_ctrl_r_the_whole_transcript(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    _conversation(kiso_home, ws)
    script = write_script(tmp_path / "s.json", [{"text": "unused"}])
    term = spawn(script, sid="old")
    term.wait_for("▸ bypass")
    screen = term.wait_for("line three")
    assert "… 1 earlier turn · ctrl+r shows them all" in screen
    assert "first question" not in screen and "Answer one." not in screen
    assert f"{PROMPT}second question" in screen and "Answer two." in screen
    assert f"{PROMPT}run something" in screen and "Ran it." in screen
    lines = screen.splitlines()
    at = lines.index("  shell printf 'alpha\\nbeta\\n'")  # the settled record, with its tail
    assert lines[at + 1 : at + 3] == ["  └ alpha", "    beta"]
    assert lines[at + 3].startswith("    exit 0 · 2 lines · ")
    poem = lines.index("A haiku:")
    assert lines[poem + 1 : poem + 4] == ["line one", "line two", "line three"]  # not joined
    term.send("\x12")  # ctrl+r
    screen = term.wait_for("── end of transcript")
    assert f"{PROMPT}first question" in screen and "Answer one." in screen
    term.send(CTRL_D)
    assert term.exit_status() == 0


def test_history_is_kept_per_workspace_across_sessions(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    script = write_script(tmp_path / "s.json", [{"text": "Noted."}] * 3)
    term = spawn(script, sid="h1")
    term.wait_for("▸ default")
    term.send("remember this line" + ENTER)
    term.wait_for("Noted.")
    term.send(CTRL_D)
    assert term.exit_status() == 0
    path = history_path(kiso_home, ws)
    assert "+remember this line\n" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    term = spawn(script, sid="h2")  # another session, the same workspace
    term.wait_for("▸ default")
    term.send("\x1b[A")  # ↑
    term.wait(lambda: input_line(term) == PROMPT + "remember this line", 5, "the old prompt")
    term.send("\x03")
    term.send(CTRL_D)
    assert term.exit_status() == 0

    other = tmp_path / "other"
    other.mkdir()
    term = Term(
        new_session_argv(), cwd=other, home=kiso_home, script=script
    )  # another workspace: its own history
    try:
        term.wait_for("▸ default")
        term.send("\x1b[A")
        term.settle()
        assert input_line(term) == PROMPT.strip()
    finally:
        term.close()


def test_up_on_an_empty_input_takes_the_last_queued_prompt_back(
    spawn: Callable[..., Term], tmp_path: Path, kiso_home: Path
) -> None:
    slow = {"text": "A slow answer, " * 20 + "done.", "delay_ms": 3000}
    script = write_script(tmp_path / "s.json", [slow, {"text": "never asked"}])
    term = spawn(script, sid="q")
    term.wait_for("▸ default")
    term.send("first" + ENTER)
    term.wait_for("✦ working")
    term.send("second thing" + ENTER)
    term.wait_for(f"queued {PROMPT}second thing")
    assert "1 queued" in term.text
    term.send("\x1b[A")  # ↑ on the empty input: the queued prompt comes back to be edited
    term.wait(lambda: input_line(term) == PROMPT + "second thing", 5, "the popped prompt")
    assert f"queued {PROMPT}second thing" not in term.text
    term.wait_for("done.", timeout=10)
    term.settle(quiet=1.0)
    runs = [e for e in events(kiso_home, "q") if isinstance(e, RunStarted)]
    assert len(runs) == 1  # it was taken back, not sent
    assert input_line(term) == PROMPT + "second thing"
    term.send("\x03" + CTRL_D)
    assert term.exit_status() == 0


def test_alt_enter_and_ctrl_enter_redirect_the_running_turn(
    spawn: Callable[..., Term], tmp_path: Path, kiso_home: Path
) -> None:
    script = write_script(
        tmp_path / "s.json",
        [shell("sleep 30"), {"text": "Redirected."}, shell("sleep 31"), {"text": "Again."}],
    )
    term = spawn(script, sid="r", mode="bypass")
    term.wait_for("▸ bypass")
    term.send("wait" + ENTER)
    term.wait_for("● shell sleep 30")
    term.send("do this instead" + "\x1b\r")  # alt+enter
    term.wait_for("↪ redirect")
    term.wait_for("Redirected.", timeout=10)  # well before the sleep would have ended
    term.send("again" + ENTER)
    term.wait_for("● shell sleep 31")
    term.send("and this" + "\x1b[13;5u")  # ctrl+enter, as a CSI u terminal sends it
    term.wait_for("Again.", timeout=10)
    term.send(CTRL_D)
    assert term.exit_status() == 0
    log = events(kiso_home, "r")
    ends = [e.outcome.kind for e in log if isinstance(e, RunEnded)]
    assert ends == ["aborted", "completed", "aborted", "completed"]
    prompts = [e.text for e in log if isinstance(e, User)]
    assert prompts == ["wait", "do this instead", "again", "and this"]


def test_the_banner_shows_the_setup_notices_as_warnings(
    spawn: Callable[..., Term], tmp_path: Path, ws: Path, kiso_home: Path
) -> None:
    import os
    import subprocess

    (ws / ".kiso").mkdir()
    (ws / ".kiso" / "config.json").write_text('{"mode": "bypass"}')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KISO_", "OPENAI", "ANTHR"))}
    trusted = subprocess.run(
        [str(KISO), "trust"],
        cwd=ws,
        env={**env, "KISO_HOME": str(kiso_home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert trusted.returncode == 0, trusted.stderr
    term = spawn(write_script(tmp_path / "s.json", [{"text": "ok"}]), sid="n")
    term.wait_for("▸ bypass")
    assert "⚠ mode bypass comes from the project config" in squash_lines(term.text)
    yellow = rb"\x1b\[33m\xe2\x9a\xa0 mode bypass comes from the project config"
    assert re.search(yellow, bytes(term.raw)), bytes(term.raw)[-3000:]
    banner = term.text.index("⚠ mode bypass")
    assert banner < term.text.index(PROMPT.strip())  # before the first prompt
