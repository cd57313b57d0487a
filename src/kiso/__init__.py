"""kiso: a durable runtime for AI agents.

Every approval, tool result and event is written to an append-only log before it is acted on, so
an interrupted agent resumes from its committed prefix. The log and everything derived from it
live in :mod:`kiso.kernel`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
