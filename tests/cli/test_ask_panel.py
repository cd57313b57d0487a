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
    assert "several" in question_panel(MULTI).hint and "several" not in panel.hint


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
