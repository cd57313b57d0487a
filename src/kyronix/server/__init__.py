"""The Kyronix server: the platform API over kiso sessions, with keys, credits and streaming.

``kyronix serve`` runs it (see docs/server.md). :func:`kyronix.server.app.create_app` builds the
ASGI application for a :class:`~kyronix.server.config.ServerConfig`. Importing this package
imports neither FastAPI nor SQLAlchemy.
"""

from kyronix.server.config import ServerConfig, kyronix_home, load_server_config

__all__ = ["ServerConfig", "kyronix_home", "load_server_config"]
