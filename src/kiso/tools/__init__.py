"""The built-in tools of the kiso coding agent, and the contract every tool follows.

:func:`builtin_tools` returns the six built-ins: ``read_file``, ``list_dir``, ``search_text``
(effects ``read``), ``write_file``, ``edit_file`` (``edit``) and ``shell`` (``shell``). All of them
resolve paths through :func:`kiso.tools.paths.resolve_in_workspace`, and the shell runs children
with the environment :func:`kiso.tools.env.child_env` builds; every file write goes through
:func:`kiso.tools.atomic.atomic_write`.
"""

from __future__ import annotations

from kiso.tools.atomic import atomic_write
from kiso.tools.base import Effects, Tool, ToolContext, ToolResult, define_tool
from kiso.tools.env import child_env
from kiso.tools.files import EDIT_FILE, LIST_DIR, READ_FILE, SEARCH_TEXT, WRITE_FILE, revision
from kiso.tools.paths import PathOutsideWorkspace, resolve_in_workspace
from kiso.tools.shell import SHELL, CommandResult, run_command

__all__ = [
    "EDIT_FILE",
    "LIST_DIR",
    "READ_FILE",
    "SEARCH_TEXT",
    "SHELL",
    "WRITE_FILE",
    "CommandResult",
    "Effects",
    "PathOutsideWorkspace",
    "Tool",
    "ToolContext",
    "ToolResult",
    "atomic_write",
    "builtin_tools",
    "child_env",
    "define_tool",
    "resolve_in_workspace",
    "revision",
    "run_command",
]


def builtin_tools() -> list[Tool]:
    """The six built-in tools, in the order a model is shown them. A new list on every call."""
    return [READ_FILE, LIST_DIR, SEARCH_TEXT, WRITE_FILE, EDIT_FILE, SHELL]
