"""Several replicas on one database: who is alive, where each executer is, frames between them.

``kx_replicas``: one row a running ``kyronix serve`` (its host, pid and process identity, its
last heartbeat). ``kx_presence``: which replica each connected executer (project, executer id)
is connected to, and when it was last heard from. ``kx_mailbox``: a frame for another replica,
a durable row the target reads when ``NOTIFY kx_<replica>`` names it, or at its next sweep.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kx_replicas",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("process", sa.String(128)),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "kx_presence",
        sa.Column("project_id", sa.String(64), primary_key=True),
        sa.Column("executer_id", sa.String(64), primary_key=True),
        sa.Column("replica_id", sa.String(64), nullable=False),
        sa.Column("connected_at", sa.BigInteger, nullable=False),
        sa.Column("seen_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "kx_mailbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_index("kx_mailbox_target", "kx_mailbox", ["target", "id"])


def downgrade() -> None:
    op.drop_index("kx_mailbox_target", "kx_mailbox")
    op.drop_table("kx_mailbox")
    op.drop_table("kx_presence")
    op.drop_table("kx_replicas")
