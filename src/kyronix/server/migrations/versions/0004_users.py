"""The dashboard's people: users, which projects each may see, one-time sign-in links.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kx_users",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("github_id", sa.String(64), unique=True),
        sa.Column("login", sa.String(128), nullable=False),
        sa.Column("name", sa.String(255)),
        sa.Column("created_at", sa.Integer, nullable=False),
        sa.Column("last_seen_at", sa.Integer),
    )
    op.create_table(
        "kx_memberships",
        sa.Column("user_id", sa.String(64), sa.ForeignKey("kx_users.id"), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("kx_projects.id"), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Integer, nullable=False),
    )
    op.create_index("kx_memberships_project", "kx_memberships", ["project_id"])
    op.create_table(
        "kx_signin_links",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("hash", sa.String(128), nullable=False, unique=True),
        sa.Column("user_id", sa.String(64), sa.ForeignKey("kx_users.id")),
        sa.Column("login", sa.String(128), nullable=False),
        sa.Column("purpose", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Integer, nullable=False),
        sa.Column("expires_at", sa.Integer, nullable=False),
        sa.Column("used_at", sa.Integer),
    )


def downgrade() -> None:
    op.drop_table("kx_signin_links")
    op.drop_index("kx_memberships_project", "kx_memberships")
    op.drop_table("kx_memberships")
    op.drop_table("kx_users")
