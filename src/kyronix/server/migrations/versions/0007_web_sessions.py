"""Dashboard sessions held by the server, and OAuth states spent on any replica.

``kx_web_sessions``: one row a signed-in browser (the SHA-256 of the token its signed cookie
carries); signing out deletes it, so a copied cookie stops working too. ``kx_spent_states``:
the OAuth ``state`` values a GitHub callback has used, so a replayed callback is refused by
every replica, not only the one that saw it first.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kx_web_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(64), sa.ForeignKey("kx_users.id"), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
    )
    op.create_index("kx_web_sessions_user", "kx_web_sessions", ["user_id"])
    op.create_table(
        "kx_spent_states",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("kx_spent_states")
    op.drop_index("kx_web_sessions_user", "kx_web_sessions")
    op.drop_table("kx_web_sessions")
