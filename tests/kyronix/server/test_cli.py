"""The bootstrap commands, the database's migrations, and what ``kyronix --help`` imports."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from .helpers import ServerProcess, kyronix


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


# --------------------------------------------------------------------------- PostgreSQL


def _plain(url: URL) -> str:
    """The URL as a user writes it: ``postgresql://`` (kyronix picks psycopg 3 itself)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def test_every_migration_runs_on_postgresql_and_matches_the_tables(pg_url: URL) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import text

    from kiso.kernel.sql import metadata as kiso_metadata
    from kyronix.server.db import Database, metadata
    from kyronix.server.migrations import DatabaseTooNew, head, migrate

    db = Database(_plain(pg_url))
    try:
        assert db.engine.url.drivername == "postgresql+psycopg" and not db.is_sqlite
        assert migrate(db) == head()
        assert migrate(db) == head()  # again: nothing to do
        with db.engine.connect() as conn:  # the migrated schema is exactly the two metadatas
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, [metadata, kiso_metadata]) == []
            kinds = dict(
                conn.execute(
                    text(
                        "SELECT table_name || '.' || column_name, data_type "
                        "FROM information_schema.columns WHERE table_schema = 'public'"
                    )
                ).all()
            )
        assert kinds["kx_runs.created_at"] == kinds["kx_projects.credits"] == "bigint"
        now = 1_790_000_000_000  # unix ms: past 32 bits, which INTEGER is on PostgreSQL
        db.write(
            lambda c: c.execute(
                text("INSERT INTO kx_projects VALUES ('p', 'p', :now, :big)"),
                {"now": now, "big": 2**40},
            )
        )
        db.write(lambda c: c.execute(text("UPDATE alembic_version SET version_num = '9999'")))
        with pytest.raises(DatabaseTooNew, match="newer kyronix") as info:
            migrate(db)
        assert "9999" in str(info.value)
    finally:
        db.close()


def test_the_database_url_comes_from_the_flag_or_the_environment(tmp_path: Path) -> None:
    from kyronix.errors import KyronixUsageError
    from kyronix.server.config import load_server_config

    env = {"KYRONIX_DATABASE_URL": "postgresql://kx@db.example/kyronix"}
    assert load_server_config(tmp_path, environ=env).database_url == env["KYRONIX_DATABASE_URL"]
    flag = load_server_config(tmp_path, environ=env, db_url="sqlite:////srv/k.db")
    assert flag.database_url == "sqlite:////srv/k.db"  # --db wins
    assert load_server_config(tmp_path, environ={}).database_url.endswith("kyronix.sqlite3")
    with pytest.raises(KyronixUsageError, match="postgresql://user@host/dbname") as info:
        load_server_config(tmp_path, environ={}, db_url="mysql://root:hunter2@db/k")
    assert "hunter2" not in str(info.value)


def test_server_json_sets_the_tunnel_limits_and_the_trusted_proxies(tmp_path: Path) -> None:
    import json

    from kyronix.errors import KyronixUsageError
    from kyronix.server.config import load_server_config

    settings = {
        "trustedProxies": ["10.0.0.5", "fd00::1"],
        "tunnel": {"maxFrameBytes": 65536, "bytesPerSecond": 100000, "byteBurst": 65536,
                   "framesPerSecondPerProject": 50, "frameBurstPerProject": 60,
                   "bytesPerSecondPerProject": 200000, "byteBurstPerProject": 131072,
                   "maxPendingBytes": 4096, "maxPendingBytesPerProject": 8192},
    }  # fmt: skip
    (tmp_path / "server.json").write_text(json.dumps(settings))
    cfg = load_server_config(tmp_path, environ={})
    assert cfg.trusted_proxies == ("10.0.0.5", "fd00::1")
    t = cfg.tunnel
    assert (t.bytes_per_second, t.byte_burst, t.max_pending_bytes) == (100000, 65536, 4096)
    assert (t.project_frames_per_second, t.project_frame_burst) == (50.0, 60)
    assert (t.project_bytes_per_second, t.project_byte_burst) == (200000, 131072)
    assert t.max_pending_bytes_project == 8192
    assert load_server_config(tmp_path / "none", environ={}).trusted_proxies == ()  # none
    for bad, says in [
        ({"trustedProxies": ["proxy.example"]}, "trustedProxies: must be a list of the prox"),
        ({"trustedProxies": "10.0.0.5"}, "trustedProxies"),
        ({"tunnel": {"byteBurst": 2048}}, "at least tunnel.maxFrameBytes"),
        ({"tunnel": {"bytesPerSecond": -1}}, "tunnel.bytesPerSecond: must be an integer"),
        ({"tunnel": {"maxPendingBytes": "lots"}}, "tunnel.maxPendingBytes"),
    ]:
        (tmp_path / "server.json").write_text(json.dumps(bad))
        with pytest.raises(KyronixUsageError, match=says):
            load_server_config(tmp_path, environ={})


def test_kyronix_serve_on_postgresql_and_a_second_replica_beside_it(
    pg_url: URL, tmp_path: Path
) -> None:
    """The CLI and ``serve`` on ``--db postgresql://…`` / KYRONIX_DATABASE_URL: migrated at start,
    a run answered and charged; a second server on the same database (and home: the same key
    secret) starts as a replica and answers the same key, charging the same credits."""
    env = {"KYRONIX_DATABASE_URL": _plain(pg_url)}
    home = tmp_path / "home"
    made = kyronix("projects", "create", "acme", home=home, env=env)
    assert made.returncode == 0, made.stderr
    key = kyronix("keys", "create", "--project", "acme", home=home, env=env).stdout.strip()
    assert not (home / "kyronix.sqlite3").exists()  # everything went to PostgreSQL
    with ServerProcess(home, None, "--db", _plain(pg_url)) as server:
        with server.client() as client:
            r = client.post(
                "/api/agents/coding",
                json={"input": "Create a React component"},
                headers={"Authorization": f"Bearer {key}"},
            )
        assert r.status_code == 200, r.text
        assert r.json()["creditsRemaining"] == 99.5
        with ServerProcess(home, env) as second, second.client() as client:
            r = client.post(
                "/api/agents/coding",
                json={"input": "Create a React component"},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 200, r.text
            assert r.json()["creditsRemaining"] == 99.0
        assert server.proc.poll() is None  # the first one serves on
    shown = kyronix("credits", "show", "acme", home=home, env=env)
    assert "99 credits" in shown.stdout, shown.stdout + shown.stderr
