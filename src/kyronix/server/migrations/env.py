"""Alembic's environment: always given a connection by :func:`kyronix.server.migrations.migrate`."""

from __future__ import annotations

from alembic import context

from kyronix.server.db import metadata


def run() -> None:
    connection = context.config.attributes["connection"]
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    context.run_migrations()


try:
    _running = context.config is not None
except AttributeError:  # imported outside an Alembic run (a tool walking every module)
    _running = False
if _running:
    run()
