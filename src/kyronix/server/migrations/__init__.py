"""The server's schema history: Alembic scripts shipped inside the package.

:func:`migrate` runs at start (``kyronix serve``) and before every CLI command that touches the
database: it upgrades an older database to the newest revision this kyronix knows, and refuses,
with a clear message, a database written by a newer kyronix (a revision this one does not know).
The same scripts run on SQLite and PostgreSQL (on PostgreSQL, under an advisory lock: two
processes starting at once upgrade once).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kyronix.errors import KyronixUsageError

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["DatabaseTooNew", "head", "migrate"]

HERE = Path(__file__).resolve().parent
MIGRATION_LOCK_KEY = 0x6B786D696772  # "kxmigr": PostgreSQL's advisory lock around an upgrade


class DatabaseTooNew(KyronixUsageError):
    """The database's schema revision is newer than this kyronix."""


def _config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    return cfg


def head() -> str:
    from alembic.script import ScriptDirectory

    found = ScriptDirectory.from_config(_config()).get_current_head()
    assert found is not None
    return found


def migrate(db: object) -> str:
    """Bring ``db`` (a :class:`kyronix.server.db.Database`) to the newest revision; return it."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import Connection, text

    from kyronix.server.db import Database

    assert isinstance(db, Database)
    cfg = _config()
    script = ScriptDirectory.from_config(cfg)
    known = {rev.revision for rev in script.walk_revisions()}
    newest = script.get_current_head()
    with db.engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
        conn.rollback()
    if current is not None and current not in known:
        raise DatabaseTooNew(
            f"the database {db.engine.url.render_as_string(hide_password=True)} was written by a "
            f"newer kyronix (schema revision {current}; "
            f"this kyronix knows up to {newest}). Upgrade kyronix, or point --db at another "
            f"database; nothing was changed."
        )
    if current != newest:

        def upgrade(conn: Connection) -> None:
            if not db.is_sqlite:  # another process migrating waits, then finds nothing to do
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

        db.write(upgrade)
    assert newest is not None
    return newest
