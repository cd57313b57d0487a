"""``ask_user``: the model puts 1-4 multiple-choice questions to the person at the terminal.

Each question has 2-4 options (``label``, optional ``description``), may allow several
(``multiSelect``), and always accepts a typed answer of the person's own instead. The answers are
the tool's result, so they are recorded in the session's log like any other result: an answered
question is never asked again, across ``kill -9`` too, because its receipt holds the answers.

Asking is behind :class:`Asker` (an async ``ask(questions) -> answers | None``; None means the
person declined, with Esc), given when the tool is built: :func:`ask_user_tool`. The interactive
CLI passes its panel (:mod:`kiso.cli.ask_panel`); a headless or piped session loads no
``ask_user`` at all (:func:`interactive_tools` is only called when someone is there), so no
prompt is spent on a question nobody could answer.

Resume: the tool is declared ``effects="read"`` and ``idempotent=True``. Asking has no effect on
the world, so it needs no approval panel in any mode (``plan`` included; a ``before_tool`` deny
still wins), and an execution a crash left without its receipt (kiso killed while the question
was on screen) is re-run — the question is asked again — ruled ``policy:idempotent``. Concurrent
calls in one turn are asked one after the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kiso.tools.base import Tool, ToolContext, ToolResult, define_tool

__all__ = [
    "ASK_USER_SCHEMA",
    "Answer",
    "Asker",
    "Option",
    "Question",
    "QuestionError",
    "answers_text",
    "ask_user_tool",
    "declined_text",
    "interactive_tools",
    "parse_questions",
]

MAX_QUESTIONS = 4
MIN_OPTIONS, MAX_OPTIONS = 2, 4
HEADER_CAP = 12


@dataclass(frozen=True, slots=True)
class Option:
    label: str
    description: str = ""


@dataclass(frozen=True, slots=True)
class Question:
    question: str
    options: tuple[Option, ...]
    header: str = ""
    """A short tag (at most 12 characters) a panel may show above the question."""
    multi_select: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """One question's answer: the chosen options' labels, and/or a typed answer."""

    selected: tuple[str, ...] = ()
    text: str | None = None


class Asker(Protocol):
    """Puts questions to a person. One answer per question, in order; None: declined (Esc)."""

    async def ask(self, questions: Sequence[Question]) -> Sequence[Answer] | None: ...


class QuestionError(ValueError):
    """The model's questions are malformed; the message says which and how."""


_OPTION = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "minLength": 1, "maxLength": 80},
        "description": {"type": "string", "maxLength": 300},
    },
    "required": ["label"],
    "additionalProperties": False,
}
ASK_USER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "questions": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_QUESTIONS,
            "items": {
                "type": "object",
                "properties": {
                    "question": {"type": "string", "minLength": 1, "maxLength": 500},
                    "header": {"type": "string", "maxLength": HEADER_CAP},
                    "multiSelect": {"type": "boolean"},
                    "options": {
                        "type": "array",
                        "minItems": MIN_OPTIONS,
                        "maxItems": MAX_OPTIONS,
                        "items": _OPTION,
                    },
                },
                "required": ["question", "options"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["questions"],
    "additionalProperties": False,
}


def parse_questions(args: dict[str, Any]) -> tuple[Question, ...]:
    """The questions in the tool's input, or :class:`QuestionError` naming what is wrong."""
    raw = args.get("questions")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_QUESTIONS:
        raise QuestionError(f"questions: give 1 to {MAX_QUESTIONS} questions")
    out: list[Question] = []
    for i, q in enumerate(raw, start=1):
        where = f"questions[{i}]"
        if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not q["question"]:
            raise QuestionError(f"{where}: needs a non-empty 'question'")
        options = q.get("options")
        if not isinstance(options, list) or not MIN_OPTIONS <= len(options) <= MAX_OPTIONS:
            raise QuestionError(f"{where}.options: give {MIN_OPTIONS} to {MAX_OPTIONS} options")
        parsed: list[Option] = []
        for j, o in enumerate(options, start=1):
            if not isinstance(o, dict) or not isinstance(o.get("label"), str) or not o["label"]:
                raise QuestionError(f"{where}.options[{j}]: needs a non-empty 'label'")
            parsed.append(Option(o["label"], str(o.get("description") or "")))
        labels = [o.label for o in parsed]
        if len(set(labels)) != len(labels):
            raise QuestionError(f"{where}.options: labels must differ (got {labels})")
        header = str(q.get("header") or "")
        if len(header) > HEADER_CAP:
            raise QuestionError(f"{where}.header: at most {HEADER_CAP} characters")
        out.append(Question(q["question"], tuple(parsed), header, bool(q.get("multiSelect"))))
    return tuple(out)


def answers_text(questions: Sequence[Question], answers: Sequence[Answer]) -> str:
    """The result the model reads: each question and what the person answered."""
    lines = ["The user answered:"]
    for i, (q, a) in enumerate(zip(questions, answers, strict=True), start=1):
        parts = []
        if a.selected:
            parts.append(", ".join(a.selected))
        if a.text:
            parts.append(f"(typed) {a.text}")
        lines.append(f"{i}. {q.question}")
        lines.append(f"   -> {'; '.join(parts) if parts else '(no option chosen)'}")
    return "\n".join(lines)


def declined_text(questions: Sequence[Question]) -> str:
    """The result when the person declined (Esc): what was asked, options included."""
    lines = [
        "The user declined to answer (pressed Esc). Do not ask the same questions again; go on "
        "with your best judgement, or say what you need in plain text. They were:"
    ]
    for i, q in enumerate(questions, start=1):
        labels = " | ".join(o.label for o in q.options)
        lines.append(f"{i}. {q.question} [{labels}]")
    return "\n".join(lines)


def _check(questions: Sequence[Question], answers: Sequence[Answer]) -> str | None:
    if len(answers) != len(questions):
        return f"the asker returned {len(answers)} answers for {len(questions)} questions"
    for i, (q, a) in enumerate(zip(questions, answers, strict=True), start=1):
        known = {o.label for o in q.options}
        if any(label not in known for label in a.selected):
            return f"answer {i} picks an option that question {i} does not offer"
        if len(a.selected) > 1 and not q.multi_select:
            return f"answer {i} picks several options of a single-choice question"
    return None


def ask_user_tool(asker: Asker) -> Tool:
    """The ``ask_user`` tool, asking through ``asker``."""
    lock = asyncio.Lock()

    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            questions = parse_questions(args)
        except QuestionError as exc:
            return ToolResult(str(exc), is_error=True, error_kind="invalid_input")
        async with lock:  # one panel at a time
            answers = await asker.ask(questions)
        if answers is None:
            return ToolResult(declined_text(questions))
        wrong = _check(questions, answers)
        if wrong is not None:
            return ToolResult(
                f"kiso could not read the answers ({wrong}); ask again",
                is_error=True,
                error_kind="fatal",
            )
        return ToolResult(answers_text(questions, answers))

    return define_tool(
        "ask_user",
        "Ask the user 1-4 multiple-choice questions (2-4 options each; they may also type their "
        "own answer) when a decision is theirs to make and you cannot find it out yourself. The "
        "result holds their answers; never ask again what they answered.",
        ASK_USER_SCHEMA,
        execute,
        effects="read",
        idempotent=True,
    )


def interactive_tools(asker: Asker) -> list[Tool]:
    """The tools only an interactive session loads (a person is there to answer)."""
    return [ask_user_tool(asker)]
