"""The ask_user panel's pure parts: a question's rows, and what a pick or a typed line answers."""

from __future__ import annotations

from kiso.cli.ask_panel import answer_of, question_panel
from kiso.tools.ask_user import Answer, Option, Question

Q = Question(
    "Which database?",
    (Option("SQLite", "one file"), Option("PostgreSQL", "a server"), Option("none")),
    header="storage",
)
MULTI = Question(
    "Which checks?", (Option("lint"), Option("types"), Option("tests")), multi_select=True
)


def test_a_question_is_its_options_as_rows_with_a_typed_answer() -> None:
    panel = question_panel(Q, 2, 3)
    assert panel.question == "(2/3) [storage] Which database?"
    assert [o.label for o in panel.options] == ["SQLite", "PostgreSQL", "none"]
    assert panel.options[0].detail == "one file"
    assert panel.typed == "pick" and "esc declines" in panel.hint
    assert "check rows" in question_panel(MULTI).hint and "check rows" not in panel.hint
    assert question_panel(MULTI).multi and not panel.multi


def test_a_picked_row_answers_its_label() -> None:
    panel = question_panel(Q)
    assert answer_of(Q, panel.options[1]) == Answer(selected=("PostgreSQL",))


def test_a_typed_line_is_a_free_answer_and_numbers_pick_several_in_multi_select() -> None:
    panel = question_panel(MULTI)
    panel.reason = " 3, 1,3 "
    assert answer_of(MULTI, panel.typed_answer()) == Answer(selected=("tests", "lint"))  # type: ignore[arg-type]
    panel.reason = "9"
    assert answer_of(MULTI, panel.typed_answer()) == Answer(text="9")  # type: ignore[arg-type]
    single = question_panel(Q)
    single.reason = "DuckDB, embedded"
    assert answer_of(Q, single.typed_answer()) == Answer(text="DuckDB, embedded")  # type: ignore[arg-type]
    single.reason = "2"  # not multi-select: a number typed is just text
    assert answer_of(Q, single.typed_answer()) == Answer(text="2")  # type: ignore[arg-type]


def test_a_multi_select_panel_checks_rows_and_confirms_the_set() -> None:
    panel = question_panel(MULTI)
    assert answer_of(MULTI, panel.confirm()) == Answer(selected=("lint",))  # type: ignore[arg-type]
    panel.toggle(2)
    panel.toggle(0)
    panel.toggle(1)
    panel.toggle(1)  # unchecked again
    assert "[x] lint" in "".join(t for _, t in panel.fragments(80))
    assert answer_of(MULTI, panel.confirm()) == Answer(selected=("lint", "tests"))  # type: ignore[arg-type]
