"""The kiso session store's tables (kiso_sessions, kiso_events, kiso_writers) in this database.

Kyronix sessions are kiso sessions: their logs go through the kernel's ``SqlSessionStore`` into
the server's own database. The tables are the kernel's (``kiso.kernel.sql.metadata``); a later
change to them comes with a migration of its own.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from kiso.kernel.sql import metadata

    metadata.create_all(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    from kiso.kernel.sql import metadata

    metadata.drop_all(op.get_bind(), checkfirst=True)
