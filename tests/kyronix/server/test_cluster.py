"""kyronix.server.cluster on a real PostgreSQL: liveness, presence, the mailbox (in one process;
tests/kyronix/server/test_replicas.py runs real replicas)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.engine import URL

from kiso.kernel import AppendError, SettingChanged
from kiso.kernel.sql import SqlSessionStore, process_identity, writers
from kyronix.errors import KyronixUsageError
from kyronix.server.cluster import Cluster
from kyronix.server.config import load_server_config
from kyronix.server.db import Database, mailbox, now_ms, presence, replicas
from kyronix.server.migrations import migrate


@pytest.fixture
def db(pg_url: URL) -> Iterator[Database]:
    database = Database(pg_url.render_as_string(hide_password=False))
    migrate(database)
    try:
        yield database
    finally:
        database.close()


def _gone_process() -> tuple[int, str]:
    """The pid and identity of a process of ours that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        identity = None
        for _ in range(100):
            identity = process_identity(child.pid)
            if identity:
                break
            time.sleep(0.01)
        assert identity
    finally:
        child.kill()
        child.wait()
    return child.pid, identity


def test_a_replica_is_dead_by_its_heartbeat_or_at_once_when_its_process_is_gone(
    db: Database,
) -> None:
    me, slow, killed = (Cluster(db, f"srv_{n}", timeout=5) for n in ("me", "slow", "killed"))
    for c in (me, slow, killed):
        c.register()
    assert me.liveness() == ({"srv_me", "srv_slow", "srv_killed"}, [])
    db.write(
        lambda c: c.execute(
            update(replicas).where(replicas.c.id == "srv_slow").values(heartbeat_at=now_ms() - 6000)
        )
    )
    pid, identity = _gone_process()
    db.write(
        lambda c: c.execute(
            update(replicas)
            .where(replicas.c.id == "srv_killed")
            .values(pid=pid, process=identity)  # its heartbeat is fresh: the process tells
        )
    )
    live, dead = me.liveness()
    assert live == {"srv_me"} and sorted(dead) == ["srv_killed", "srv_slow"]
    slow.heartbeat()  # renewed: alive again
    assert me.liveness()[0] == {"srv_me", "srv_slow"}


def test_forgetting_a_dead_replica_frees_its_leases_presence_and_mailbox(
    db: Database, tmp_path: Path
) -> None:
    me, dead = Cluster(db, "srv_me"), Cluster(db, "srv_dead")
    me.register()
    dead.register()
    row = db.read(lambda c: c.execute(select(replicas).where(replicas.c.id == "srv_dead")).one())
    dead.announce("proj_1", "default")
    dead.post("srv_dead", "request", {"x": 1})
    me.post("srv_me", "request", {"x": 2})
    writer = SqlSessionStore(db.engine).create(str(tmp_path), session_id="sess_1")
    db.write(  # the lease as the dead replica's process took it
        lambda c: c.execute(update(writers).values(pid=row.pid, host=row.host, process=None))
    )
    me.forget(["srv_dead"])
    assert db.read(lambda c: c.execute(select(writers)).all()) == []
    assert db.read(lambda c: c.execute(select(presence)).all()) == []
    assert [r.target for r in db.read(lambda c: c.execute(select(mailbox)).all())] == ["srv_me"]
    assert me.liveness() == ({"srv_me"}, [])
    with pytest.raises(AppendError):  # fenced: the lease is gone
        writer.append(SettingChanged(key="k", value=1))
    writer.close()


def test_locate_prefers_default_and_ignores_silent_executers_and_dead_replicas(
    db: Database,
) -> None:
    me, a, b = Cluster(db, "srv_me"), Cluster(db, "srv_a"), Cluster(db, "srv_b")
    for c in (me, a, b):
        c.register()
    a.announce("proj_1", "laptop")
    b.announce("proj_1", "default")
    me.announce("proj_1", "mine")  # on this replica: not a route to another
    assert me.locate("proj_1", None) == ("srv_b", "default")
    assert me.locate("proj_1", "laptop") == ("srv_a", "laptop")
    assert me.locate("proj_1", "mine") is None
    assert me.locate("proj_2", None) is None
    assert me.count("proj_1") == 3
    b.seen({("proj_1", "default"): now_ms() - 46_000})  # not heard from for 46 s: lost
    assert me.locate("proj_1", None) == ("srv_b", "default")  # remembered for half a second
    me.forget_route("proj_1")  # (a replica answered "moved")
    assert me.locate("proj_1", None) == ("srv_a", "laptop")
    db.write(
        lambda c: c.execute(update(replicas).where(replicas.c.id == "srv_a").values(heartbeat_at=0))
    )
    me.forget_route("proj_1")
    assert me.locate("proj_1", None) is None  # its replica is dead
    a.withdraw("proj_1", "laptop")
    assert me.count("proj_1") == 1


@pytest.mark.parametrize("notify", [True, False])
def test_the_mailbox_delivers_in_order_by_notification_or_by_the_sweep(
    db: Database, notify: bool
) -> None:
    sender, target = Cluster(db, "srv_s", notify=notify), Cluster(db, "srv_t", notify=notify)
    got: list[Any] = []

    async def handle(body: dict[str, Any]) -> None:
        if body["n"] == 2:
            raise RuntimeError("a bad handler")  # logged and dropped: the rest still arrive
        got.append(body["n"])

    target.handlers["request"] = handle

    async def main() -> None:
        listening = asyncio.create_task(target.listen_forever())
        sweeping = asyncio.create_task(target.sweep_forever(every=0.05 if not notify else 30))
        try:
            await asyncio.sleep(0.3)  # LISTEN in place
            for n in range(5):
                await sender.send("srv_t", "request", {"n": n})
            for _ in range(200):
                if len(got) == 4:
                    break
                await asyncio.sleep(0.02)
        finally:
            for task in (listening, sweeping):
                task.cancel()
            await asyncio.gather(listening, sweeping, return_exceptions=True)

    asyncio.run(main())
    assert got == [0, 1, 3, 4]
    assert target.pending() == 0 and target.delivered == 5
    assert (target.swept > 0) is (not notify)  # without NOTIFY only the sweep delivers


def test_prune_drops_rows_for_replicas_that_are_gone(db: Database) -> None:
    me = Cluster(db, "srv_me")
    me.register()
    db.write(
        lambda c: c.execute(
            insert(mailbox),
            [
                {"target": "srv_gone", "kind": "frame", "body": json.dumps({}), "created_at": 0},
                {"target": "srv_me", "kind": "frame", "body": json.dumps({}), "created_at": 0},
            ],
        )
    )
    assert me.prune() == 1
    assert [r.target for r in db.read(lambda c: c.execute(select(mailbox)).all())] == ["srv_me"]


def test_the_replica_settings_are_checked(tmp_path: Path) -> None:
    cfg = load_server_config(
        tmp_path, environ={"KYRONIX_REPLICA_TIMEOUT": "4", "KYRONIX_NOTIFY": "0"}
    )
    assert cfg.replica_timeout == 4 and cfg.notify is False
    with pytest.raises(KyronixUsageError, match="KYRONIX_NOTIFY: must be 1 or 0"):
        load_server_config(tmp_path, environ={"KYRONIX_NOTIFY": "maybe"})
    (tmp_path / "server.json").write_text('{"replicaTimeout": 0}')
    with pytest.raises(KyronixUsageError, match="replicaTimeout: must be seconds > 0"):
        load_server_config(tmp_path, environ={})
    (tmp_path / "server.json").write_text('{"notify": "yes"}')
    with pytest.raises(KyronixUsageError, match="notify: must be true or false"):
        load_server_config(tmp_path, environ={})
