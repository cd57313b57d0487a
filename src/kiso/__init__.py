"""kiso: a durable runtime for AI agents.

Every approval, tool result and event is written to an append-only log before it is acted on, so
an interrupted agent resumes from its committed prefix. The log and everything derived from it
live in :mod:`kiso.kernel`; the loop, approvals and resume in :mod:`kiso.runtime`; the tool
contract and the built-in tools in :mod:`kiso.tools`; model adapters in :mod:`kiso.providers`.

The names below are imported on first use, so ``import kiso`` stays cheap.
"""

from __future__ import annotations

from importlib import import_module

from kiso._version import __version__

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost startup time
if TYPE_CHECKING:
    from kiso.kernel import JsonlSessionStore, KisoError, MemorySessionStore
    from kiso.providers.faux import FauxAdapter
    from kiso.runtime import Agent, Session
    from kiso.tools.base import Tool, ToolContext, ToolResult, define_tool

_LAZY = {
    "Agent": "kiso.runtime",
    "Session": "kiso.runtime",
    "define_tool": "kiso.tools.base",
    "Tool": "kiso.tools.base",
    "ToolResult": "kiso.tools.base",
    "ToolContext": "kiso.tools.base",
    "JsonlSessionStore": "kiso.kernel",
    "MemorySessionStore": "kiso.kernel",
    "FauxAdapter": "kiso.providers.faux",
    "KisoError": "kiso.kernel",
}

__all__ = [
    "Agent",
    "FauxAdapter",
    "JsonlSessionStore",
    "KisoError",
    "MemorySessionStore",
    "Session",
    "Tool",
    "ToolContext",
    "ToolResult",
    "__version__",
    "define_tool",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kiso' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
