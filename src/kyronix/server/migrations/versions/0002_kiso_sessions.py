"""The kiso session store's tables (kiso_sessions, kiso_events, kiso_writers) in this database.

Kyronix sessions are kiso sessions: their logs go through the kernel's ``SqlSessionStore`` into
the server's own database. The tables are the kernel's (``kiso.kernel.sql.metadata``) as they
were at this revision; a later change to them comes with a migration of its own (a test compares
the migrated database with the kernel's metadata).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Spelled out as the tables were at this revision (not ``metadata.create_all``), so a later
    # change to the kernel's tables is a migration of its own and this one never changes.
    op.create_table(
        "kiso_sessions",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("workspace", sa.Text, nullable=False),
        sa.Column("project", sa.String(128), nullable=True),
        sa.Column("parent", sa.String(128), nullable=True),
        sa.Column("created", sa.BigInteger, nullable=False),
        sa.Column("kiso", sa.String(64), nullable=False),
        sa.Column("header", sa.Text, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("updated", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("runs", sa.Integer, nullable=False),
        sa.Column("inputs", sa.Integer, nullable=False),
        sa.Column("projected", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_kiso_sessions"),
    )
    op.create_index("ix_kiso_sessions_workspace", "kiso_sessions", ["workspace", "updated"])
    op.create_index("ix_kiso_sessions_project", "kiso_sessions", ["project", "updated"])
    op.create_table(
        "kiso_events",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.BigInteger, nullable=False),
        sa.Column("run", sa.Text, nullable=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("line", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("session_id", "seq", name="pk_kiso_events"),
        sa.ForeignKeyConstraint(
            ["session_id"], ["kiso_sessions.id"], name="fk_kiso_events_session", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_kiso_events_type", "kiso_events", ["session_id", "type"])
    op.create_index("ix_kiso_events_run", "kiso_events", ["session_id", "run"])
    op.create_table(
        "kiso_writers",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("process", sa.String(128), nullable=True),
        sa.Column("since", sa.BigInteger, nullable=False),
        sa.Column("renewed", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="pk_kiso_writers"),
        sa.ForeignKeyConstraint(
            ["session_id"], ["kiso_sessions.id"], name="fk_kiso_writers_session", ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    op.drop_table("kiso_writers")
    op.drop_table("kiso_events")
    op.drop_table("kiso_sessions")
