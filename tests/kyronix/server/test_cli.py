"""The bootstrap commands, the database's migrations, and what ``kyronix --help`` imports."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from .helpers import kyronix


def test_help_imports_neither_fastapi_nor_sqlalchemy() -> None:
    code = (
        "import sys\n"
        "from kyronix.cli import cli\n"
        "try:\n    cli(['--help'], prog_name='kyronix')\nexcept SystemExit:\n    pass\n"
        "heavy = ('fastapi', 'sqlalchemy', 'uvicorn', 'starlette', 'alembic')\n"
        "bad = [m for m in heavy if m in sys.modules]\n"
        "print('IMPORTED', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "IMPORTED []" in out.stdout, out.stdout
    for name in ("serve", "projects", "keys", "credits"):
        assert name in out.stdout


def test_bootstrap_projects_keys_credits(tmp_path: Path) -> None:
    home = tmp_path / "home"
    made = kyronix("projects", "create", "acme", home=home)
    assert made.returncode == 0, made.stderr
    project = made.stdout.strip()
    assert project.startswith("proj_")
    assert (home.stat().st_mode & 0o777) == 0o700
    assert kyronix("projects", "create", "acme", home=home).returncode != 0  # names are unique
    key = kyronix("keys", "create", "--project", "acme", home=home)
    assert key.returncode == 0
    secret = key.stdout.strip()
    assert secret.startswith("kyr_") and len(secret) == 47
    assert "not shown again" in key.stderr
    listed = kyronix("keys", "list", "--json", home=home)
    (row,) = json.loads(listed.stdout)
    assert row["prefix"] == secret[:12] and not row["revoked"] and secret not in listed.stdout
    shown = kyronix("credits", "show", "acme", "--ledger", home=home)
    assert "100 credits" in shown.stdout and "grant" in shown.stdout
    granted = kyronix("credits", "grant", project, "25.5", home=home)
    assert granted.returncode == 0 and "balance 125.5" in granted.stdout
    assert kyronix("credits", "grant", "acme", "-3", home=home).returncode != 0
    assert kyronix("credits", "show", "nope", home=home).returncode != 0
    revoked = kyronix("keys", "revoke", row["id"], home=home)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    assert json.loads(kyronix("keys", "list", "--json", home=home).stdout)[0]["revoked"]
    assert kyronix("keys", "revoke", "key_nope", home=home).returncode != 0
    # the key is never stored, only its keyed hash
    assert secret.encode() not in (home / "kyronix.sqlite3").read_bytes()
    assert ((home / "secret.key").stat().st_mode & 0o777) == 0o600


def test_a_database_from_a_newer_kyronix_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert kyronix("projects", "create", "acme", home=home).returncode == 0
    with sqlite3.connect(home / "kyronix.sqlite3") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    out = kyronix("projects", "list", home=home)
    assert out.returncode != 0
    assert "newer kyronix" in out.stderr and "9999" in out.stderr
    serve = kyronix("serve", "--port", "0", home=home)
    assert serve.returncode != 0 and "newer kyronix" in serve.stderr


def test_migrations_are_shipped_and_reach_head(tmp_path: Path) -> None:
    from kyronix.server.db import Database
    from kyronix.server.migrations import HERE, head, migrate

    assert (HERE / "env.py").is_file() and list((HERE / "versions").glob("0001_*.py"))
    db = Database(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    try:
        assert migrate(db) == head()
        assert migrate(db) == head()  # again: nothing to do
        with sqlite3.connect(tmp_path / "x.sqlite3") as conn:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            assert {
                "kx_projects",
                "kx_ledger",
                "kx_holds",
                "kiso_sessions",
                "kiso_events",
            } <= tables
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


def test_the_migrated_kiso_tables_are_exactly_the_kernels(tmp_path: Path) -> None:
    """Migration 0002 spells the session tables out; they must match kiso.kernel.sql's."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from kiso.kernel.sql import metadata
    from kyronix.server.db import Database
    from kyronix.server.migrations import migrate

    db = Database(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    try:
        migrate(db)

        def kiso_only(name: str | None, kind: str, parent: dict[str, str | None]) -> bool:
            table = name if kind == "table" else parent.get("table_name")
            return table is None or table.startswith("kiso_")

        with db.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"include_name": kiso_only})
            assert compare_metadata(context, metadata) == []
    finally:
        db.close()
