"""Tenants on one server: the free credits come once per account (not once per project), project
names are unique per owner and never tell one tenant about another's, the operator's CLI finds a
project unambiguously, and migration 0008 moves a 0007 database there keeping every name, credit
and owner. On SQLite and on PostgreSQL (tests/pg.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import IntegrityError

from kyronix.errors import KyronixUsageError
from kyronix.server import accounts, billing, users
from kyronix.server.db import Database, ledger, projects

from .browser import SignedIn
from .helpers import ON_BOTH, kyronix, wait_until

GRANT = 100_000  # the default initialCredits (100 credits), in millicredits


class Browser(SignedIn):
    """A signed-in user who makes projects."""

    def create(self, name: str) -> str:
        """A new project through the dashboard: its id."""
        made = self.post("/dashboard/projects", {"name": name})
        assert made.status_code == 303, made.text
        return str(made.headers["location"].split("/")[3])

    def projects(self) -> list[accounts.Project]:
        uid = self.uid
        mine: list[accounts.Project] = self.app.state.kx.db.read(
            lambda c: users.projects_of(c, uid)
        )
        return mine


def grants(db: Database) -> list[tuple[str, int]]:
    rows = db.read(
        lambda c: c.execute(
            select(ledger.c.project_id, ledger.c.amount).where(ledger.c.kind == "grant")
        ).all()
    )
    return [(r.project_id, r.amount) for r in rows]


# --------------------------------------------------------------------------- the grant


@ON_BOTH
def test_five_projects_of_one_account_hold_the_one_grant(make_client: Any) -> None:
    client, app = make_client()
    db = app.state.kx.db
    alice = Browser(client, app, "alice")
    (first,) = alice.projects()
    assert first.credits == GRANT
    made = [alice.create(f"p{n}") for n in range(2, 6)]
    notice = alice.get(f"/dashboard/projects/{made[-1]}/agents").text
    assert "created with 0 credits" in notice and "once per account" in notice
    assert f"kyronix credits grant {made[-1]} N" in notice
    mine = alice.projects()
    assert [p.id for p in mine] == [first.id, *made]
    assert [p.credits for p in mine] == [GRANT, 0, 0, 0, 0]
    assert sum(p.credits for p in mine) == GRANT
    for p in mine:  # the balance is the ledger's sum
        assert db.read(lambda c, pid=p.id: billing.ledger_sum(c, pid)) == p.credits
    assert grants(db) == [(first.id, GRANT)]
    # the pages say it: the 0 balance, and where more credits come from
    listing = alice.get("/dashboard/projects").text
    assert 'id="credits-once"' in listing and "once per account" in listing
    assert listing.count('<td class="num">0</td>') == 4
    usage = alice.get(f"/dashboard/projects/{made[0]}/usage").text
    assert 'id="balance">0 ' in usage and f"kyronix credits grant {made[0]} N" in usage
    # signing in again, or a project made directly for the account, grants nothing more
    again = Browser(client, app, "alice")
    assert again.uid == alice.uid and len(again.projects()) == 5
    user = db.read(lambda c: users.get_user(c, alice.uid))
    assert user is not None
    late = db.write(lambda c: users.create_project_for(c, user, "late", GRANT))
    assert late.credits == 0 and grants(db) == [(first.id, GRANT)]
    # the operator grants more, as the page says (still ledger rows)
    db.write(lambda c: billing.grant(c, made[0], 5_000, note="kyronix credits grant"))
    assert db.read(lambda c: billing.balance(c, made[0])) == 5_000
    # another account gets its own grant, once
    bob = Browser(client, app, "bob")
    assert [p.credits for p in bob.projects()] == [GRANT]
    bob.create("b2")
    assert [p.credits for p in bob.projects()] == [GRANT, 0]


def test_the_operators_projects_keep_their_initial_credits(make_client: Any) -> None:
    _, app = make_client()
    db = app.state.kx.db
    one = db.write(lambda c: accounts.create_project(c, "ops-1", GRANT))
    two = db.write(lambda c: accounts.create_project(c, "ops-2", GRANT))
    assert (one.credits, two.credits) == (GRANT, GRANT)
    assert sorted(grants(db)) == sorted([(one.id, GRANT), (two.id, GRANT)])


# --------------------------------------------------------------------------- names


@ON_BOTH
def test_two_accounts_each_have_alpha_and_one_cannot_have_two(make_client: Any) -> None:
    client, app = make_client()
    bob = Browser(client, app, "bob")
    bobs = bob.create("alpha")
    bob.create("bob-secret-plans")
    alice = Browser(client, app, "alice")
    alices = alice.create("alpha")  # bob's alpha is none of alice's business
    assert alices != bobs
    assert [p.name for p in alice.projects()] == ["alice", "alpha"]
    assert [p.name for p in bob.projects()] == ["bob", "alpha", "bob-secret-plans"]
    # a second alpha of alice's own is refused, in words about her projects only
    taken = alice.post("/dashboard/projects", {"name": "alpha"})
    assert taken.status_code == 400
    assert "a project named &#39;alpha&#39; already exists among your projects" in taken.text
    for leak in ("bob", bobs):
        assert leak not in taken.text
    # renaming: to a name of bob's is fine; to one of her own is refused the same way
    first = alice.projects()[0].id
    renamed = alice.post(f"/dashboard/projects/{first}/rename", {"name": "bob-secret-plans"})
    assert renamed.status_code == 303, renamed.text
    clash = alice.post(f"/dashboard/projects/{first}/rename", {"name": "alpha"})
    assert clash.status_code == 400 and "already exists among your projects" in clash.text
    assert "bob" not in clash.text.replace("bob-secret-plans", "")  # her own name, shown back
    assert len(alice.projects()) == 2 and len(bob.projects()) == 3


def test_a_first_project_takes_the_login_whoever_else_uses_the_name(make_client: Any) -> None:
    """Before 0008, ``carol`` signing in while another project was named ``carol`` got
    ``carol-2``: the suffix told her the name was taken elsewhere."""
    client, app = make_client()
    db = app.state.kx.db
    db.write(lambda c: accounts.create_project(c, "carol", 0))  # the operator's
    carol = Browser(client, app, "carol")
    assert [p.name for p in carol.projects()] == ["carol"]


def test_a_racing_duplicate_name_is_refused_in_the_same_words(pg_url: URL) -> None:
    """PostgreSQL: the second of two creations of one name passes the check before the first
    commits, then waits on the unique index; it is refused in words, not a 500. (On SQLite the
    writes are serial: the check alone sees it.)"""
    from kyronix.server.migrations import migrate

    db = Database(pg_url.render_as_string(hide_password=False))
    refused: list[str] = []

    def second() -> None:
        try:
            db.write(lambda c: accounts.create_project(c, "dup", 0, owner_id="user_x"))
        except KyronixUsageError as exc:
            refused.append(str(exc))

    try:
        migrate(db)
        racer = threading.Thread(target=second)
        with db.engine.connect() as first, first.begin():
            accounts.create_project(first, "dup", 0, owner_id="user_x")
            racer.start()
            waiting = text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            assert wait_until(lambda: db.read(lambda c: c.execute(waiting).scalar_one()) == 1)
        racer.join(30)
        assert refused == ["a project named 'dup' already exists among your projects"]
        named = select(projects.c.id).where(projects.c.name == "dup")
        assert len(db.read(lambda c: c.execute(named).all())) == 1
    finally:
        db.close()


# --------------------------------------------------------------------------- the CLI


def _cli_env(kx_db: str | None) -> dict[str, str]:
    if kx_db is None:
        return {}
    url = make_url(kx_db).set(drivername="postgresql")
    return {"KYRONIX_DATABASE_URL": url.render_as_string(hide_password=False)}


def _database(home: Path, kx_db: str | None) -> Database:
    return Database(kx_db if kx_db is not None else f"sqlite:///{home / 'kyronix.sqlite3'}")


@ON_BOTH
def test_the_cli_refuses_a_name_twice_and_an_ambiguous_name(
    kx_home: Path, kx_db: str | None
) -> None:
    env = _cli_env(kx_db)
    made = kyronix("projects", "create", "acme", home=kx_home, env=env)
    assert made.returncode == 0, made.stderr
    ops = made.stdout.strip()
    again = kyronix("projects", "create", "acme", home=kx_home, env=env)
    assert again.returncode != 0
    assert "already exists among the operator's projects" in again.stderr
    # a dashboard user's acme beside the operator's
    db = _database(kx_home, kx_db)
    try:
        secret = accounts.load_secret(kx_home)
        token, _ = db.write(lambda c: users.create_link(c, secret, login="dora"))
        signed = db.write(lambda c: users.redeem_link(c, secret, token, GRANT))
        assert signed is not None
        dora = signed[0]
        theirs = db.write(lambda c: users.create_project_for(c, dora, "acme", GRANT))
        with pytest.raises(KyronixUsageError) as info:
            db.read(lambda c: accounts.find_project(c, "acme"))
        assert str(info.value) == f"2 projects are named 'acme'; use its id: {ops}, {theirs.id}"
        assert db.read(lambda c: accounts.find_project(c, theirs.id)) == theirs
        assert db.read(lambda c: accounts.find_project(c, "nope")) is None
    finally:
        db.close()
    shown = kyronix("credits", "show", "acme", home=kx_home, env=env)
    assert shown.returncode != 0
    assert "2 projects are named 'acme'" in shown.stderr and ops in shown.stderr
    by_id = kyronix("credits", "show", ops, home=kx_home, env=env)
    assert by_id.returncode == 0 and "100 credits" in by_id.stdout, by_id.stderr


# --------------------------------------------------------------------------- migration 0008


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        db = Database(f"sqlite:///{tmp_path / 'old.sqlite3'}")
    else:
        url = request.getfixturevalue("pg_url")
        db = Database(url.render_as_string(hide_password=False))
    try:
        yield db
    finally:
        db.close()


def _alembic(db: Database, action: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    from kyronix.server.migrations import HERE

    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))

    def run(conn: Any) -> None:
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)

    db.write(run)


OLD_ROWS = """
INSERT INTO kx_users (id, login, created_at) VALUES ('u_a', 'alice', 10), ('u_b', 'bob', 20);
INSERT INTO kx_projects (id, name, created_at, credits) VALUES
  ('p_a1', 'alice', 11, 100000), ('p_a2', 'alice-work', 12, 100000),
  ('p_b1', 'bob', 21, 99500), ('p_op', 'ops', 5, 100000);
INSERT INTO kx_memberships (user_id, project_id, role, created_at) VALUES
  ('u_a', 'p_a1', 'owner', 11), ('u_a', 'p_a2', 'owner', 12), ('u_b', 'p_b1', 'owner', 21);
INSERT INTO kx_ledger (project_id, kind, amount, created_at) VALUES
  ('p_a1', 'grant', 100000, 11), ('p_a2', 'grant', 100000, 12), ('p_b1', 'grant', 100000, 21),
  ('p_b1', 'settle', -500, 22), ('p_op', 'grant', 100000, 5);
INSERT INTO kx_api_keys (id, project_id, prefix, hash, created_at) VALUES
  ('key_1', 'p_b1', 'kyr_AAAAAAAA', 'h1', 22);
INSERT INTO kx_presence (project_id, executer_id, replica_id, connected_at, seen_at) VALUES
  ('p_b1', 'laptop', 'r1', 23, 24);
"""


def test_migration_0008_keeps_names_credits_and_owners(database: Database) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from kiso.kernel.sql import metadata as kiso_metadata
    from kyronix.server.db import metadata
    from kyronix.server.migrations import head, migrate

    db = database
    _alembic(db, "upgrade", "0007")
    for statement in OLD_ROWS.split(";"):
        if statement.strip():
            db.write(lambda c, s=statement: c.execute(text(s)))
    assert migrate(db) == head() >= "0008"

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return db.read(lambda c: [tuple(r) for r in c.execute(text(sql))])

    assert rows("SELECT id, name, credits, owner_id FROM kx_projects ORDER BY id") == [
        ("p_a1", "alice", 100000, "u_a"),
        ("p_a2", "alice-work", 100000, "u_a"),
        ("p_b1", "bob", 99500, "u_b"),
        ("p_op", "ops", 100000, ""),
    ]
    for pid, credits in rows("SELECT id, credits FROM kx_projects"):
        assert db.read(lambda c, p=pid: billing.ledger_sum(c, p)) == credits
    # the grant the users already had is recorded: with their first project's time
    assert rows("SELECT id, credits_granted_at FROM kx_users ORDER BY id") == [
        ("u_a", 11),
        ("u_b", 21),
    ]
    assert rows("SELECT executer_id, key_id FROM kx_presence") == [("laptop", None)]
    assert rows("SELECT id, project_id FROM kx_api_keys") == [("key_1", "p_b1")]
    with db.engine.connect() as conn:  # the migrated schema is exactly the metadata
        context = MigrationContext.configure(conn, opts={"compare_type": not db.is_sqlite})
        assert compare_metadata(context, [metadata, kiso_metadata]) == []
        if db.is_sqlite:
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
    # the foreign keys still hold: a project with a key cannot go, a key needs its project
    with pytest.raises(IntegrityError, match=r"(?i)foreign key"):
        db.write(lambda c: c.execute(text("DELETE FROM kx_projects WHERE id = 'p_b1'")))
    with pytest.raises(IntegrityError, match=r"(?i)foreign key"):
        db.write(
            lambda c: c.execute(
                text(
                    "INSERT INTO kx_api_keys (id, project_id, prefix, hash, created_at) "
                    "VALUES ('key_2', 'p_gone', 'kyr_BBBBBBBB', 'h2', 30)"
                )
            )
        )
    # after it: alice had her grant, so her next project starts at 0; bob may now have "alice"
    alice = db.read(lambda c: users.get_user(c, "u_a"))
    bob = db.read(lambda c: users.get_user(c, "u_b"))
    assert alice is not None and bob is not None
    assert db.write(lambda c: users.create_project_for(c, alice, "third", GRANT)).credits == 0
    assert db.write(lambda c: users.create_project_for(c, bob, "alice", GRANT)).credits == 0
    with pytest.raises(KyronixUsageError, match="already exists among your projects"):
        db.write(lambda c: users.create_project_for(c, alice, "alice-work", GRANT))
    # and back: 0007's global names again, once no two owners share one
    db.write(lambda c: c.execute(text("DELETE FROM kx_memberships WHERE project_id LIKE 'proj_%'")))
    db.write(lambda c: c.execute(text("DELETE FROM kx_ledger WHERE project_id LIKE 'proj_%'")))
    db.write(lambda c: c.execute(text("DELETE FROM kx_projects WHERE id LIKE 'proj_%'")))
    _alembic(db, "downgrade", "0007")
    assert rows("SELECT id, name, credits FROM kx_projects ORDER BY id") == [
        ("p_a1", "alice", 100000),
        ("p_a2", "alice-work", 100000),
        ("p_b1", "bob", 99500),
        ("p_op", "ops", 100000),
    ]
    with pytest.raises(IntegrityError, match=r"(?i)unique"):
        db.write(
            lambda c: c.execute(
                text("INSERT INTO kx_projects VALUES ('p_x', 'bob', 30, 0)")  # global again
            )
        )
    assert migrate(db) == head()
