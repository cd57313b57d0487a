"""The executer's 20 built-in tools, each a :class:`~kyronix.executer.tools.base.ToolSpec`."""

from __future__ import annotations

from kyronix.executer.tools.base import ToolSpec

__all__ = ["BUILTIN_NAMES", "builtin_groups", "builtin_tools"]

BUILTIN_NAMES: tuple[str, ...] = (
    "read_file",
    "write_file",
    "delete_file",
    "move_file",
    "copy_file",
    "list_dir",
    "create_dir",
    "write_in_between",
    "modify_line_between",
    "delete_line",
    "read_lines",
    "terminal",
    "navigate",
    "click",
    "type",
    "screenshot",
    "git_clone",
    "git_commit",
    "git_branch",
    "http_request",
)


def builtin_tools() -> dict[str, ToolSpec]:
    """Name -> spec for the 20 built-ins, in the order of the Kyronix document."""
    from kyronix.executer.tools import browser, files, git, http, terminal

    specs = {s.name: s for m in (files, terminal, browser, git, http) for s in m.TOOLS}
    return {name: specs[name] for name in BUILTIN_NAMES}


def builtin_groups() -> dict[str, tuple[str, ...]]:
    """The built-ins by kind, as the document groups them: ``files``, ``terminal``, ``browser``,
    ``git``, ``network`` (each in the document's order)."""
    from kyronix.executer.tools import browser, files, git, http, terminal

    modules = {"files": files, "terminal": terminal, "browser": browser, "git": git,
               "network": http}  # fmt: skip
    return {
        group: tuple(n for n in BUILTIN_NAMES if n in {s.name for s in module.TOOLS})
        for group, module in modules.items()
    }
