"""Tenancy: project names are unique per owner, the free credits come once per account, and an
executer's presence records the API key that claimed it.

* ``kx_projects.owner_id``: who owns the project, the user's id for a dashboard project, ``''``
  (the server default) for the operator's (``kyronix projects create``). Backfilled from
  ``kx_memberships`` (role ``owner``). The global UNIQUE on ``name`` is dropped and
  ``kx_projects_owner_name`` UNIQUE (``owner_id``, ``name``) takes its place: one tenant's names
  no longer collide with, or reveal, another's.
* ``kx_users.credits_granted_at``: when the account received its one grant of free credits;
  backfilled, for a user who owns a project, with the time of their first one (which got it).
* ``kx_presence.key_id``: the API key id of the executer connection that claimed an executer id.

On PostgreSQL the old constraint is ``kx_projects_name_key`` (looked up, not assumed). On SQLite it
was declared inline: an unnamed automatic index that only rebuilding the table removes, and
``kx_projects`` is referenced by eight tables' foreign keys, which are on and cannot be turned off
inside the migration's transaction. Dropping a referenced table counts its children as deferred
violations; putting rows back into a table of that name counts them found again. So the rebuild
runs with the checks deferred to commit (``PRAGMA defer_foreign_keys``), in the one order that
brings the count back to zero: the rows copied aside, the old table dropped, the new one made
under the same name, the rows put back. (Alembic's batch mode copies into the new table before
dropping the old one, and the commit would be refused.)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

OWNER_NAME = "kx_projects_owner_name"
OLD_UNIQUE = "kx_projects_name_key"  # PostgreSQL's name for the inline UNIQUE of 0001


def _projects(*, owned: bool) -> None:
    """Create ``kx_projects``: owned (0008) or the earlier shape (a global UNIQUE name)."""
    columns: list[sa.schema.SchemaItem] = [
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=not owned),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("credits", sa.BigInteger, nullable=False),
    ]
    if owned:
        columns.append(sa.Column("owner_id", sa.String(64), nullable=False, server_default=""))
        columns.append(sa.UniqueConstraint("owner_id", "name", name=OWNER_NAME))
    op.create_table("kx_projects", *columns)


def _rebuild_projects_sqlite(*, owned: bool) -> None:
    """SQLite: ``kx_projects`` made again in its new shape, its rows and every reference kept
    (the order the module's docstring explains)."""
    op.execute("PRAGMA defer_foreign_keys = ON")
    op.execute("CREATE TABLE _kx_projects_copy AS SELECT * FROM kx_projects")
    op.drop_table("kx_projects")
    _projects(owned=owned)
    op.execute(
        "INSERT INTO kx_projects (id, name, created_at, credits) "
        "SELECT id, name, created_at, credits FROM _kx_projects_copy"
    )
    op.drop_table("_kx_projects_copy")
    op.execute("PRAGMA defer_foreign_keys = OFF")


def _unique_on_name(bind: sa.Connection) -> str:
    for found in sa.inspect(bind).get_unique_constraints("kx_projects"):
        if found["column_names"] == ["name"] and found["name"]:
            return str(found["name"])
    return OLD_UNIQUE


def upgrade() -> None:
    bind = op.get_bind()
    op.add_column("kx_users", sa.Column("credits_granted_at", sa.BigInteger))
    op.add_column("kx_presence", sa.Column("key_id", sa.String(64)))
    if bind.dialect.name == "sqlite":
        _rebuild_projects_sqlite(owned=True)
    else:
        op.add_column(
            "kx_projects",
            sa.Column("owner_id", sa.String(64), nullable=False, server_default=""),
        )
        op.drop_constraint(_unique_on_name(bind), "kx_projects", type_="unique")
        op.create_unique_constraint(OWNER_NAME, "kx_projects", ["owner_id", "name"])
    op.execute(
        "UPDATE kx_projects SET owner_id = ("
        "SELECT MIN(m.user_id) FROM kx_memberships m "
        "WHERE m.project_id = kx_projects.id AND m.role = 'owner') "
        "WHERE EXISTS (SELECT 1 FROM kx_memberships m "
        "WHERE m.project_id = kx_projects.id AND m.role = 'owner')"
    )
    op.execute(
        "UPDATE kx_users SET credits_granted_at = ("
        "SELECT MIN(p.created_at) FROM kx_projects p WHERE p.owner_id = kx_users.id) "
        "WHERE credits_granted_at IS NULL"
    )


def downgrade() -> None:
    """Back to global names: refused (a unique violation) while two owners share a name."""
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_projects_sqlite(owned=False)
    else:
        op.drop_constraint(OWNER_NAME, "kx_projects", type_="unique")
        op.create_unique_constraint(OLD_UNIQUE, "kx_projects", ["name"])
        op.drop_column("kx_projects", "owner_id")
    op.drop_column("kx_presence", "key_id")
    op.drop_column("kx_users", "credits_granted_at")
