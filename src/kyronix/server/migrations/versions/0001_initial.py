"""The first schema: projects, API keys, the credit ledger and holds, sessions, runs, custom agents.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kx_projects",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Integer, nullable=False),
        sa.Column("credits", sa.Integer, nullable=False),
    )
    op.create_table(
        "kx_api_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("kx_projects.id"), nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("hash", sa.String(128), nullable=False, unique=True),
        sa.Column("name", sa.String(128)),
        sa.Column("created_at", sa.Integer, nullable=False),
        sa.Column("last_used_at", sa.Integer),
        sa.Column("revoked_at", sa.Integer),
    )
    op.create_index("kx_api_keys_project", "kx_api_keys", ["project_id"])
    op.create_table(
        "kx_ledger",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("kx_projects.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount", sa.Integer, nullable=False),
        sa.Column("hold_id", sa.String(64)),
        sa.Column("run_id", sa.String(64)),
        sa.Column("note", sa.Text),
        sa.Column("created_at", sa.Integer, nullable=False),
    )
    op.create_index("kx_ledger_project", "kx_ledger", ["project_id"])
    op.create_table(
        "kx_holds",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("kx_projects.id"), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False, unique=True),
        sa.Column("amount", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Integer, nullable=False),
        sa.Column("expires_at", sa.Integer, nullable=False),
        sa.Column("closed_at", sa.Integer),
    )
    op.create_index("kx_holds_open", "kx_holds", ["status", "expires_at"])
    op.create_table(
        "kx_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("kx_projects.id"), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("custom_agent_id", sa.String(64)),
        sa.Column("created_at", sa.Integer, nullable=False),
        sa.Column("active_run", sa.String(64)),
    )
    op.create_index("kx_sessions_project", "kx_sessions", ["project_id"])
    op.create_table(
        "kx_runs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("kx_projects.id"), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("agent", sa.String(64), nullable=False),
        sa.Column("custom_agent_id", sa.String(64)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("idem_key", sa.String(255)),
        sa.Column("request_hash", sa.String(64)),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("input", sa.Text),
        sa.Column("created_at", sa.Integer, nullable=False),
        sa.Column("finished_at", sa.Integer),
        sa.Column("http_status", sa.Integer),
        sa.Column("result", sa.Text),
        sa.Column("transcript", sa.Text),
        sa.Column("cost", sa.Integer),
        sa.Column("usage_input", sa.Integer),
        sa.Column("usage_output", sa.Integer),
        sa.UniqueConstraint("project_id", "idem_key", name="kx_runs_idem"),
    )
    op.create_index("kx_runs_status", "kx_runs", ["status"])
    op.create_index("kx_runs_session", "kx_runs", ["session_id"])
    op.create_table(
        "kx_custom_agents",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("kx_projects.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("tools", sa.Text, nullable=False),
        sa.Column("created_at", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Integer, nullable=False),
    )
    op.create_index("kx_custom_agents_project", "kx_custom_agents", ["project_id"])


def downgrade() -> None:
    for table in (
        "kx_custom_agents",
        "kx_runs",
        "kx_sessions",
        "kx_holds",
        "kx_ledger",
        "kx_api_keys",
        "kx_projects",
    ):
        op.drop_table(table)
