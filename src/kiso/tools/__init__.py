"""The built-in tools of the kiso coding agent, and the contract every tool follows.

:func:`builtin_tools` returns the six built-ins: ``read_file``, ``list_dir``, ``search_text``
(effects ``read``), ``write_file``, ``edit_file`` (``edit``) and ``shell`` (``shell``). All of them
resolve paths through :func:`kiso.tools.paths.resolve_in_workspace`, and the shell runs children
with the environment :func:`kiso.tools.env.child_env` builds; every file write goes through
:func:`kiso.tools.atomic.atomic_write`.
"""

from __future__ import annotations

from kiso.tools.ask_user import Answer, Asker, Option, Question, ask_user_tool, interactive_tools
from kiso.tools.atomic import atomic_write
from kiso.tools.base import Effects, Tool, ToolContext, ToolResult, define_tool
from kiso.tools.env import child_env
from kiso.tools.files import EDIT_FILE, LIST_DIR, READ_FILE, SEARCH_TEXT, WRITE_FILE, revision
from kiso.tools.paths import PathOutsideWorkspace, resolve_in_workspace
from kiso.tools.shell import SHELL, CommandResult, run_command
from kiso.tools.tasks import Task, current_tasks, render_tasks, update_tasks_tool

__all__ = [
    "EDIT_FILE",
    "LIST_DIR",
    "READ_FILE",
    "SEARCH_TEXT",
    "SHELL",
    "WRITE_FILE",
    "Answer",
    "Asker",
    "CommandResult",
    "Effects",
    "Option",
    "PathOutsideWorkspace",
    "Question",
    "Task",
    "Tool",
    "ToolContext",
    "ToolResult",
    "ask_user_tool",
    "atomic_write",
    "builtin_tools",
    "child_env",
    "current_tasks",
    "define_tool",
    "interactive_tools",
    "render_tasks",
    "resolve_in_workspace",
    "revision",
    "run_command",
    "update_tasks_tool",
]


def builtin_tools() -> list[Tool]:
    """The six built-in tools, in the order a model is shown them. A new list on every call."""
    return [READ_FILE, LIST_DIR, SEARCH_TEXT, WRITE_FILE, EDIT_FILE, SHELL]
