"""Kyronix: an agent platform on the kiso runtime.

Built so far: :mod:`kyronix.kml` (KML v1) and :mod:`kyronix.executer` (runs a KML plan's tools
locally under permissions, a path sandbox and durable receipts). The server, the runtime SDK and
the WebSocket tunnel arrive with their issues.
"""

from kiso import __version__

__all__ = ["__version__"]
