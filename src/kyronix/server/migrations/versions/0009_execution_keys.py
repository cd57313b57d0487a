"""Which API key ran the plan that issued each tool execution id.

``kx_executions.key_id``: the key of the ``POST /api/run`` whose plan gave the id. A tunnel
``kml_result`` is recorded in the issuing session only when the runtime connection that asked for
it holds that same key: another key of the project (a teammate's, a leaked one) cannot write
results into a session it did not run. Rows from before have none, and their results are recorded
from any key of the project, as they were.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("kx_executions", sa.Column("key_id", sa.String(64)))


def downgrade() -> None:
    op.drop_column("kx_executions", "key_id")
