"""The interactive session's answer to ``ask_user``: each question in the panel, one at a time.

A question's options are rows (digits pick, arrows and enter too; in a multi-select question digits
and space check rows and enter confirms them; typed row numbers such as ``1,3`` work too); ``t``
types a free answer; esc declines, and the
model is told the person declined. Nothing here is recorded: the answers are the tool's result, so
they are in the log with its receipt (:mod:`kiso.tools.ask_user`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from kiso.tools.ask_user import Answer, Question

from .panels import Option, Panel


class PanelScreen(Protocol):
    """What puts a panel to a person: the interactive session's screen (either kind)."""

    async def ask(self, panel: Panel) -> Option | None: ...


__all__ = ["LateAsker", "PanelScreen", "TuiAsker", "answer_of", "question_panel"]

_NUMBERS = re.compile(r"\s*\d+(\s*,\s*\d+)*\s*")


class TuiAsker:
    """An :class:`~kiso.tools.ask_user.Asker` on the interactive session's panel."""

    def __init__(self, tui: PanelScreen) -> None:
        self.tui = tui

    async def ask(self, questions: Sequence[Question]) -> Sequence[Answer] | None:
        answers: list[Answer] = []
        for index, question in enumerate(questions, 1):
            chosen = await self.tui.ask(question_panel(question, index, len(questions)))
            if chosen is None:
                return None  # esc: declined
            answers.append(answer_of(question, chosen))
        return answers


class LateAsker:
    """An asker made before the session's screen exists (the agent is built first); until
    :attr:`screen` is set a question is declined."""

    def __init__(self) -> None:
        self.screen: PanelScreen | None = None

    async def ask(self, questions: Sequence[Question]) -> Sequence[Answer] | None:
        if self.screen is None:
            return None
        return await TuiAsker(self.screen).ask(questions)


def question_panel(question: Question, index: int = 1, total: int = 1) -> Panel:
    """The panel of one question: its options as rows, a free answer on ``t``."""
    count = f"({index}/{total}) " if total > 1 else ""
    head = f"[{question.header}] " if question.header else ""
    return Panel(
        question=f"{count}{head}{question.question}",
        options=[
            Option(o.label, "pick", detail=o.description, value=f"option:{i}")
            for i, o in enumerate(question.options)
        ],
        typed="pick",
        ask="your answer: ",
        hint=(
            "↑↓ move · digits or space check rows · ⏎ confirms · t types your own answer · "
            "esc declines"
            if question.multi_select
            else "↑↓ move · ⏎ or a digit picks · t types your own answer · esc declines"
        ),
        multi=question.multi_select,
    )


def answer_of(question: Question, chosen: Option) -> Answer:
    """The answer a chosen row (or a typed line) gives ``question``."""
    if chosen.label != "typed" and chosen.value.startswith("option:"):
        return Answer(selected=(question.options[int(chosen.value[7:])].label,))
    if chosen.label == "checked" and chosen.value.startswith("options:"):
        rows = [int(n) for n in chosen.value[8:].split(",")]
        return Answer(selected=tuple(question.options[n].label for n in rows))
    text = chosen.value.strip()
    if question.multi_select and _NUMBERS.fullmatch(text):
        rows = [int(n) for n in text.split(",")]
        if all(1 <= n <= len(question.options) for n in rows):
            labels = [question.options[n - 1].label for n in rows]
            return Answer(selected=tuple(dict.fromkeys(labels)))
    return Answer(text=text)
