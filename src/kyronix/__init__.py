"""Kyronix: an agent platform on the kiso runtime (server, runtime SDK, KML executer, tunnel).

Only the package and its command exist so far; the parts arrive with their issues.
"""

from kiso import __version__

__all__ = ["__version__"]
