"""Unix-millisecond times and millicredit amounts are 64-bit (BIGINT) on PostgreSQL.

0001-0004 declared them ``INTEGER``, which is 32 bits on PostgreSQL: a unix time in ms
(~1.8e12) does not fit, nor more than ~2.1 million credits in millicredits. On PostgreSQL this
revision alters those columns to ``BIGINT`` (on a new database the tables are still empty).

On SQLite it changes nothing, on purpose: SQLite stores every INTEGER-affinity value in up to
8 bytes whatever the declared type (``INTEGER`` and ``BIGINT`` are the same affinity), so existing
databases already hold 64-bit values; renaming the declared type would mean rebuilding every
table (``batch_alter_table`` copies it, and dropping a referenced table with foreign keys on is
refused) for no change in what can be stored. The revision is still recorded, so every database
reaches the same head.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

COLUMNS: dict[str, tuple[str, ...]] = {
    "kx_projects": ("created_at", "credits"),
    "kx_api_keys": ("created_at", "last_used_at", "revoked_at"),
    "kx_ledger": ("amount", "created_at"),
    "kx_holds": ("amount", "created_at", "expires_at", "closed_at"),
    "kx_sessions": ("created_at",),
    "kx_runs": ("created_at", "finished_at", "cost"),
    "kx_executions": ("created_at",),
    "kx_custom_agents": ("created_at", "updated_at"),
    "kx_users": ("created_at", "last_seen_at"),
    "kx_memberships": ("created_at",),
    "kx_signin_links": ("created_at", "expires_at", "used_at"),
}
"""The columns holding unix milliseconds or millicredits (``kyronix.server.db``)."""


def _alter(old: type[sa.types.TypeEngine[int]], new: type[sa.types.TypeEngine[int]]) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, columns in COLUMNS.items():
        for column in columns:
            op.alter_column(table, column, type_=new(), existing_type=old())


def upgrade() -> None:
    _alter(sa.Integer, sa.BigInteger)


def downgrade() -> None:
    _alter(sa.BigInteger, sa.Integer)
