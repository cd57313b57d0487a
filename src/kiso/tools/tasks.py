"""``update_tasks``: the model keeps a short checklist, replacing the whole list each time.

Opt-in (``"tasks": true`` in config): most sessions never call it, and a tool pays prompt rent on
every request. The list is at most :data:`MAX_TASKS` items ``{content, status}``, ``status`` one
of ``pending``, ``active``, ``done``, at most one ``active``; a bad list is an error result naming
the problem, and the previous list stays in force.

Durable by construction: the tool's result carries the normalized list (as JSON), so it is in
the session's log as the call's receipt. :func:`current_tasks` reads the list back from the log's
events — the last successful ``update_tasks`` receipt — not from the model's messages, so it
survives ``kill -9`` (what has a receipt is on disk; an interrupted call is re-run, the tool being
idempotent) and compaction (a summary replaces messages; the events stay in the log).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from kiso.kernel import Event, ExecutionFinished, ExecutionStarted
from kiso.tools.base import Tool, ToolContext, ToolResult, define_tool

__all__ = [
    "MAX_TASKS",
    "STATUSES",
    "TASKS_TOOL",
    "Task",
    "TaskListError",
    "current_tasks",
    "parse_tasks",
    "render_tasks",
    "tasks_result",
    "update_tasks_tool",
]

MAX_TASKS = 50
CONTENT_CAP = 500
STATUSES = ("pending", "active", "done")
TASKS_TOOL = "update_tasks"
Status = Literal["pending", "active", "done"]


@dataclass(frozen=True, slots=True)
class Task:
    content: str
    status: Status = "pending"

    def to_json(self) -> dict[str, str]:
        return {"content": self.content, "status": self.status}


class TaskListError(ValueError):
    """The list is not a valid task list; the message names the item and what to do."""


def parse_tasks(raw: Any) -> tuple[Task, ...]:
    """The normalized list (contents stripped), or :class:`TaskListError`."""
    if not isinstance(raw, list):
        raise TaskListError("tasks: must be a list of {content, status} items")
    if len(raw) > MAX_TASKS:
        raise TaskListError(
            f"tasks: {len(raw)} items; at most {MAX_TASKS} — merge or drop finished ones"
        )
    out: list[Task] = []
    active: list[int] = []
    for i, item in enumerate(raw, start=1):
        where = f"tasks[{i}]"
        if not isinstance(item, dict):
            raise TaskListError(f"{where}: must be an object {{content, status}}")
        content = item.get("content")
        if not isinstance(content, str) or not content.strip():
            raise TaskListError(f"{where}.content: must be a non-empty string")
        content = " ".join(content.split())
        if len(content) > CONTENT_CAP:
            raise TaskListError(
                f"{where}.content: {len(content)} characters; at most {CONTENT_CAP}"
            )
        status = item.get("status", "pending")
        if status not in STATUSES:
            raise TaskListError(f"{where}.status: must be pending, active or done, got {status!r}")
        extra = set(item) - {"content", "status"}
        if extra:
            raise TaskListError(f"{where}: unknown keys {sorted(extra)}; use content and status")
        if status == "active":
            active.append(i)
        out.append(Task(content, cast(Status, status)))
    if len(active) > 1:
        raise TaskListError(
            f"tasks: items {', '.join(map(str, active))} are all active; at most one is active "
            f"at a time (mark the others pending or done)"
        )
    return tuple(out)


def tasks_result(tasks: Sequence[Task]) -> str:
    """The result content: one JSON object carrying the list and a line for the model."""
    done = sum(t.status == "done" for t in tasks)
    note = f"Task list saved: {len(tasks)} items, {done} done."
    return json.dumps({"tasks": [t.to_json() for t in tasks], "note": note}, ensure_ascii=False)


def _execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    try:
        tasks = parse_tasks(args.get("tasks"))
    except TaskListError as exc:
        return ToolResult(
            f"{exc}. The list was not changed; send the whole list again.",
            is_error=True,
            error_kind="invalid_input",
        )
    return ToolResult(tasks_result(tasks))


def update_tasks_tool() -> Tool:
    """The ``update_tasks`` tool (idempotent: saving the same list twice changes nothing)."""
    return define_tool(
        TASKS_TOOL,
        "Replace your task list for this session (the whole list each time, at most 50 items, "
        "at most one active). Use it for work of several steps: mark a task active when you "
        "start it and done when it is finished.",
        {
            "type": "object",
            "properties": {
                "tasks": {
                    "type": "array",
                    "maxItems": MAX_TASKS,
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string", "minLength": 1},
                            "status": {"type": "string", "enum": list(STATUSES)},
                        },
                        "required": ["content", "status"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["tasks"],
            "additionalProperties": False,
        },
        _execute,
        effects="read",
        idempotent=True,
    )


def current_tasks(events: Iterable[Event]) -> list[Task]:
    """The task list in force: the last successful ``update_tasks`` receipt in the log, or []."""
    names: dict[str, str] = {}
    latest: list[Task] = []
    for event in events:
        if isinstance(event, ExecutionStarted):
            names[event.execution_id] = event.name
        elif (
            isinstance(event, ExecutionFinished)
            and event.ok
            and not event.is_error
            and names.get(event.execution_id) == TASKS_TOOL
        ):
            try:
                data = json.loads(event.content)
                latest = list(parse_tasks(data["tasks"]))
            except (ValueError, KeyError, TypeError):
                continue  # a hook rewrote the result: that receipt carries no list
    return latest


_MARKS = {"done": ("[x]", "green"), "active": ("[>]", "bold yellow"), "pending": ("[ ]", "dim")}


def render_tasks(tasks: Sequence[Task]) -> Any:
    """A rich renderable: the checklist (``[x]`` done, ``[>]`` active, ``[ ]`` pending)."""
    from rich.text import Text

    text = Text()
    if not tasks:
        text.append("no tasks", style="dim")
        return text
    for i, task in enumerate(tasks):
        mark, style = _MARKS[task.status]
        if i:
            text.append("\n")
        text.append(f"{mark} ", style=style)
        text.append(task.content, style="strike dim" if task.status == "done" else style)
    return text
