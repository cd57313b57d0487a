"""The pure parts of what the interactive session shows: word wrapping, markdown line breaks,
tool records, the working row and its token count, the spend, the transcript, OSC 52, the
palette; and the approval panel at 60 columns."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiso.cli.panels import approval_panel
from kiso.cli.records import copy_sequence, outcome_of, record_text, transcript
from kiso.cli.render import PROMPT, Policy, Printer, markdown, wrap
from kiso.cli.status import Meter, Streamed, spend, status_row, working_row
from kiso.cli.theme import UNKNOWN, choose_theme, from_colorfgbg, palette, parse_background
from kiso.kernel import (
    ApprovalDecided,
    Assistant,
    ExecutionFinished,
    Outcome,
    RunEnded,
    RunStarted,
    TextBlock,
    ToolCall,
    Usage,
    UsageError,
    User,
)
from kiso.kernel.events import ModelRef
from kiso.runtime.offers import Offer

PLAIN = Printer(Policy(ansi=False, color=False))


def rendered(item: Any, width: int = 80) -> str:
    return PLAIN.render(item, width)


# --------------------------------------------------------------------------- wrapping


def test_wrap_breaks_between_words_and_cuts_only_a_word_longer_than_a_line() -> None:
    text = "the quick brown fox jumps over the lazy dog"
    assert wrap(text, 15) == ["the quick brown", "fox jumps over", "the lazy dog"]
    assert wrap("  indented line that wraps", 12, hang=2) == [
        "  indented",
        "  line that",
        "  wraps",
    ]
    assert wrap("a " + "x" * 25, 10) == ["a", "xxxxxxxxxx", "xxxxxxxxxx", "xxxxx"]
    assert wrap("one\n\ntwo", 10) == ["one", "", "two"]
    assert wrap("宽字符宽字符宽字符", 6) == ["宽字符", "宽字符", "宽字符"]  # by cells, not chars


@given(st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=12), min_size=1, max_size=40))
def test_wrap_never_splits_a_word_that_fits(words: list[str]) -> None:
    lines = wrap(" ".join(words), 12)
    assert all(len(line) <= 12 for line in lines)
    assert " ".join(lines).split() == words  # every word whole, in order


def test_the_approval_panel_wraps_between_words_at_60_columns() -> None:
    from kiso.runtime.rules import Rule

    command = "pytest tests/very/long/path/to/a/test_module.py --maxfail=1 -q"
    call = ToolCall("c", "shell", {"command": command})
    panel = approval_panel(call, Offer(Rule("shell", command), None, None))
    text = "".join(t for _, t in panel.fragments(60))
    rows = text.split("\n")
    assert all(len(r) <= 60 for r in rows), rows
    always = next(i for i, r in enumerate(rows) if "2. Yes, and don't ask again" in r)
    assert rows[always + 1].startswith("     ")  # the hanging indent under the label
    words = " ".join(rows).split()
    assert "`shell:" in words and "--maxfail=1" in words  # no word cut in two
    assert any("4. No, ask for narrower versions" in r for r in rows)
    assert "t types" in text


# --------------------------------------------------------------------------- markdown


def test_settled_markdown_keeps_single_line_breaks() -> None:
    haiku = "An old silent pond\nA frog jumps into the pond—\nsplash! Silence again."
    out = rendered(markdown("Here:\n\n" + haiku + "\n\n**bold** and `code`"), 80)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines == [
        "Here:",
        "An old silent pond",
        "A frog jumps into the pond—",
        "splash! Silence again.",
        "bold and code",
    ]


def test_settled_markdown_wraps_between_words() -> None:
    out = rendered(markdown(" ".join(f"w{i:02d}x" for i in range(40))), 30)
    for line in out.splitlines():
        for token in line.split():
            assert len(token) == 4 and token.startswith("w"), line


# --------------------------------------------------------------------------- tool records


def finished(content: str, ms: int = 0, **kw: Any) -> ExecutionFinished:
    fields: dict[str, Any] = {"ok": True, "is_error": False, **kw}
    return ExecutionFinished(
        run="r", execution_id="e", call_id="c", content=content, ms=ms, **fields
    )


@pytest.mark.parametrize(
    ("text", "lines"),
    [("".join(f"line {i}\n" for i in range(7)), 7), ("a\nb\nc", 3), ("", 0), ("one\n", 1)],
)
def test_a_read_file_record_counts_the_files_lines(text: str, lines: int) -> None:
    numbered = [f"{i + 1:>6}\t{ln}" for i, ln in enumerate(text.splitlines())]
    count = len(numbered)
    footer = "[empty file: 0 lines]" if not count else f"[lines 1-{count} of {count} (end of file)]"
    content = "\n".join([*numbered, footer, "[rev:0123456789abcdef]"])
    call = ToolCall("c", "read_file", {"path": "suite.sh"})
    assert outcome_of(call, finished(content)) == ("ok", False, lines)
    noun = "line" if lines == 1 else "lines"
    assert (
        record_text(call, finished(content), 100).plain
        == f"  read_file suite.sh · ok · {lines} {noun} · 0.0s"
    )


def test_a_partial_read_says_which_lines_it_showed() -> None:
    numbered = [f"{i:>6}\tx" for i in range(1, 201)]
    content = "\n".join([*numbered, "[lines 1-200 of 950; continue with offset=201]", "[rev:ab]"])
    call = ToolCall("c", "read_file", {"path": "big.txt"})
    assert outcome_of(call, finished(content)) == ("lines 1-200 of 950", False, 200)


def test_the_real_read_file_tool_and_the_record_agree(tmp_path: Path) -> None:
    from kiso.tools import builtin_tools
    from kiso.tools.base import ToolContext

    tool = next(t for t in builtin_tools() if t.name == "read_file")
    call = ToolCall("c", "read_file", {"path": "f.txt"})
    seven = "".join(f"{i}\n" for i in range(7))
    for text, lines in ((seven, 7), (seven.rstrip("\n"), 7), ("", 0), ("\n\n", 2)):
        (tmp_path / "f.txt").write_text(text)
        ctx = ToolContext(workspace=tmp_path, execution_id="s:1")
        result = asyncio.run(tool.run({"path": "f.txt"}, ctx))
        assert outcome_of(call, finished(result.content))[2] == lines, result.content


def test_a_shell_record_keeps_the_tail_of_its_output_as_in_the_document() -> None:
    call = ToolCall("c", "shell", {"command": './suite.sh; echo "exit=$?"'})
    out = (
        "packages/core      ok  184 tests\npackages/runtime   ok  221 tests\n"
        "packages/tui       ok  120 tests\nexit=0\nexit 0"
    )
    assert record_text(call, finished(out, 2600), 100).plain.split("\n") == [
        '  shell ./suite.sh; echo "exit=$?"',
        "  └ packages/core      ok  184 tests",
        "    packages/runtime   ok  221 tests",
        "    packages/tui       ok  120 tests",
        "    exit=0",
        "    exit 0 · 4 lines · 2.6s",
    ]
    many = "".join(f"row {i}\n" for i in range(10)) + "exit 1"
    rows = record_text(call, finished(many, 100, is_error=True), 100).plain.split("\n")
    assert rows[1] == "  └ … 6 earlier lines · ctrl+o expands"
    assert rows[2:6] == ["    row 6", "    row 7", "    row 8", "    row 9"]
    assert rows[6] == "    exit 1 · 10 lines · 0.1s"


# --------------------------------------------------------------------------- the working row


def test_the_working_row_counts_streamed_tokens_and_the_decode_rate() -> None:
    s = Streamed()
    assert working_row(
        thinking=False, seconds=0, streamed=s, queued=0, ctx_left=100, width=120
    ) == ("✦ working 0s · esc stop · alt+⏎ redirect · ctx left ~100%")
    for i in range(10):
        s.delta("abcd" * 10, now=100.0 + i * 0.1)  # 100 estimated tokens over 0.9 s
    tokens, approximate = s.tokens()
    assert (tokens, approximate) == (100, True)
    row = working_row(thinking=False, seconds=19, streamed=s, queued=0, ctx_left=98, width=120)
    assert (
        row == "✦ working 19s ↓ ~100 tokens · 111 tok/s · esc stop · alt+⏎ redirect · ctx left ~98%"
    )
    s.turn(94)  # the provider's count replaces the estimate
    assert s.tokens() == (94, False)
    row = working_row(thinking=False, seconds=19, streamed=s, queued=0, ctx_left=98, width=120)
    assert (
        row == "✦ working 19s ↓ 94 tokens · 104 tok/s · esc stop · alt+⏎ redirect · ctx left ~98%"
    )
    s.delta("abcd", now=200.0)
    assert s.tokens() == (95, True)
    narrow = working_row(thinking=True, seconds=3, streamed=s, queued=2, ctx_left=98, width=70)
    assert narrow == "✦ thinking 3s ↓ ~95 tokens · 104 tok/s · 2 queued · ctx left ~98%"


def test_the_status_row_carries_the_spend_and_never_cuts_it() -> None:
    m = Meter(ctx_left=42, cache_hit=97, tok_s=186.4)
    row = status_row(mode="bypass", model="deepseek-v3-terminus", m=m, width=70, cost="$0.0123")
    assert row.endswith("ctx left ~42% · cache 97% · 186 tok/s · $0.0123") and len(row) <= 70


def turn(model: str, **usage: int) -> Assistant:
    return Assistant(
        run="r",
        blocks=(TextBlock("hi"),),
        stop="end_turn",
        usage=Usage(**usage),
        model=model,
        ms=10,
    )


def test_the_spend_is_priced_from_the_registry_and_unknown_only_without_a_price() -> None:
    priced = [turn("gpt-4o", input=1_000_000, output=100_000)]  # $2.50 + $1.00
    assert spend(priced, "gpt-4o") == "$3.50"
    assert spend([turn("gpt-4o-mini", input=1000, output=100)], "gpt-4o-mini") == "$0.0002"
    assert spend([], "gpt-4o") == "$0.00"
    assert spend([turn("faux:s.json", input=10, output=5)], "faux:s.json") == "cost unknown"
    assert spend([], "deepseek-flash") == "cost unknown"  # a row with no dated price
    mixed = [*priced, turn("gpt-4o", input=10)]  # a turn whose output count is missing
    assert spend(mixed, "gpt-4o") == "≥$3.50"
    assert spend(priced, "faux:s.json") == "$3.50"  # after a switch: what was priced stays


# --------------------------------------------------------------------------- the transcript


DONE = Outcome("completed")


def test_the_transcript_shows_prompts_answers_records_and_denials() -> None:
    call = ToolCall("k1", "shell", {"command": "rm -rf x"})
    ref = ModelRef("faux", "faux", None)
    log = []
    for n in range(4):
        log += [
            RunStarted(run=f"r{n}", trigger="user", model=ref, mode="default"),
            User(run=f"r{n}", content=f"prompt {n}"),
            Assistant(run=f"r{n}", blocks=(TextBlock(f"answer {n}"), call), stop="tool_use",
                      usage=Usage(), model="faux", ms=1),
            ApprovalDecided(run=f"r{n}", call_id="k1", decision="denied", decided_by="user",
                            reason="no", input_sha256="0" * 64),
            RunEnded(run=f"r{n}", outcome=Outcome.aborted("user") if n == 3 else DONE),
        ]  # fmt: skip
    text = rendered(*transcript(log, 80, runs=2)[:1])
    assert text.strip() == "… 2 earlier turns · ctrl+r shows them all"
    whole = "".join(rendered(r) for r in transcript(log, 80, runs=2))
    assert "prompt 1" not in whole and PROMPT + "prompt 2" in whole and "answer 3" in whole
    assert "✗ shell rm -rf x denied by user: no" in whole and "✦ aborted by user" in whole
    everything = "".join(rendered(r) for r in transcript(log, 80))
    assert PROMPT + "prompt 0" in everything and "answer 0" in everything


def test_copy_sequence_is_osc_52() -> None:
    assert copy_sequence("hé") == "\x1b]52;c;" + base64.b64encode("hé".encode()).decode() + "\x07"
    wrapped = copy_sequence("x", tmux=True)
    assert wrapped.startswith("\x1bPtmux;\x1b\x1b]52;c;") and wrapped.endswith("\x1b\\")


# --------------------------------------------------------------------------- the palette


def test_the_background_answer_is_parsed_and_classified() -> None:
    assert parse_background(b"\x1b]11;rgb:ffff/ffff/ffff\x07") == (1.0, 1.0, 1.0)
    assert parse_background(b"\x1b]11;rgb:1e/1e/1e\x1b\\") == pytest.approx(
        (0.1176, 0.1176, 0.1176), abs=1e-3
    )
    assert parse_background(b"garbage") is None
    assert from_colorfgbg("15;0") == "dark" and from_colorfgbg("0;15") == "light"
    assert from_colorfgbg("0;default;15") == "light" and from_colorfgbg(None) is None


def test_the_theme_precedence_is_env_then_config_then_terminal_then_unknown() -> None:
    asked: list[bool] = []

    def ask() -> str | None:
        asked.append(True)
        return "light"

    env = {"KISO_THEME": "dark"}
    assert choose_theme(configured="light", environ=env, ask=ask).describe() == "dark (KISO_THEME)"
    chosen = choose_theme(configured="light", environ={}, ask=ask)
    assert chosen.name == "light" and "config.json" in chosen.source
    assert asked == []  # decided without asking the terminal
    assert choose_theme(configured=None, environ={}, ask=ask).name == "light" and asked
    assert choose_theme(configured=None, environ={}, ask=lambda: None) is UNKNOWN
    assert choose_theme(configured=None, environ={}, ask=None) is UNKNOWN
    assert choose_theme(configured=None, environ={"COLORFGBG": "15;0"}, ask=None).name == "dark"
    with pytest.raises(UsageError, match="KISO_THEME='blue': must be dark or light"):
        choose_theme(configured=None, environ={"KISO_THEME": "blue"}, ask=None)


def test_the_palette_picks_the_shades_and_no_color_drops_them() -> None:
    from rich.text import Text

    from kiso.cli.render import ERROR

    dark = Printer(Policy(ansi=True, color=True), palette("dark", "test"))
    light = Printer(Policy(ansi=True, color=True), palette("light", "test"))
    mono = Printer(Policy(ansi=True, color=False), palette("dark", "test"))
    item = Text("boom", style=ERROR)
    assert "\x1b[91m" in dark.render(item, 40)  # bright red on a dark background
    assert "\x1b[31m" in light.render(item, 40)
    assert "\x1b[3" not in mono.render(item, 40) and "\x1b[9" not in mono.render(item, 40)
