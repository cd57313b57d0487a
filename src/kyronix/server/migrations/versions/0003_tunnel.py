"""The tunnel: which run issued each tool execution id (kx_executions), and a run's mode.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kx_executions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("kx_projects.id"), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Integer, nullable=False),
    )
    op.add_column("kx_runs", sa.Column("mode", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kx_runs") as batch:
        batch.drop_column("mode")
    op.drop_table("kx_executions")
