"""One contract, four stores: JSONL, memory and SQL (SQLite, PostgreSQL) pass the same tests.

What every :class:`~kiso.kernel.store.SessionStore` promises: a round trip of every event type,
byte for byte where a store writes lines; contiguous seq and compare-and-set; validation on load
by the one loader (the same error types, lines and reasons); one writer per session, within a
process and, for the durable stores, from another process, and freed when its holder is killed;
the committed prefix after a batch interrupted by SIGKILL; group commit, ``flush``, ``commit`` and
an ``await committed()`` that leaves the event loop free; listing by workspace; a failing disk
poisoning the writer with a clear error and leaving the stored prefix intact.

The last section holds what only the SQL store has (the lease, the schema, the engine), on both
databases. PostgreSQL is a real server (tests/pg.py: one cluster per test session, a database
per test).
JSONL-only behaviour (files, modes, torn tails, the index) stays in test_store.py and test_lock.py.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, event, select, text, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import DataError

import kiso
from kiso.kernel import (
    AppendError,
    Assistant,
    CorruptLogError,
    Event,
    ExecutionFinished,
    ExecutionStarted,
    InvalidEventError,
    JsonlSessionStore,
    MemorySessionStore,
    ModelRef,
    Outcome,
    RunEnded,
    RunStarted,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    StoreError,
    TextBlock,
    ToolCall,
    Usage,
    UsageError,
    User,
    parse_log,
    summarize,
)
from kiso.kernel.events import EVENT_TYPES, dumps_line
from kiso.kernel.sql import SqlSessionStore, SqlWriter, create_schema, make_engine, writing
from kiso.kernel.sql import events as event_rows
from kiso.kernel.sql import sessions as session_rows
from kiso.kernel.sql import writers as writer_rows
from tests.conftest import ticking_clock

Store = JsonlSessionStore | MemorySessionStore | SqlSessionStore
CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "v1"
ROOT = Path(__file__).resolve().parents[2]


def sql_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str | URL:
    """A new database of ``kind`` ("sql": SQLite, "postgresql": a database of its own)."""
    if kind == "postgresql":
        url: URL = request.getfixturevalue("pg_url")
        return url
    return f"sqlite:///{tmp_path / 'sessions.db'}"


def make_store(kind: str, request: pytest.FixtureRequest, home: Path, tmp_path: Path) -> Store:
    if kind == "jsonl":
        return JsonlSessionStore(home, clock=ticking_clock())
    if kind == "memory":
        return MemorySessionStore(clock=ticking_clock())
    store = SqlSessionStore(sql_url(kind, request, tmp_path), clock=ticking_clock())
    create_schema(store.engine)
    return store


def is_pg(store: object) -> bool:
    return isinstance(store, SqlSessionStore) and not store._sqlite


@pytest.fixture(params=["jsonl", "memory", "sql", "postgresql"])
def store(request: pytest.FixtureRequest, home: Path, tmp_path: Path) -> Iterator[Store]:
    made = make_store(request.param, request, home, tmp_path)
    yield made
    if isinstance(made, SqlSessionStore):
        made.close()


@pytest.fixture(params=["jsonl", "sql", "postgresql"])
def durable(request: pytest.FixtureRequest, home: Path, tmp_path: Path) -> Iterator[Store]:
    """The stores whose sessions outlive their process."""
    made = make_store(request.param, request, home, tmp_path)
    yield made
    if isinstance(made, SqlSessionStore):
        made.close()


def start(run: str = "r1") -> list[RunStarted | User]:
    return [
        RunStarted(run=run, trigger="user", model=ModelRef("faux", "m"), mode="default"),
        User(run=run, content="hello there"),
    ]


def ended(run: str = "r1") -> RunEnded:
    return RunEnded(run=run, outcome=Outcome.completed())


# --------------------------------------------------------------------------- round trips


def test_create_append_load_round_trip(store: Store, workspace: Path) -> None:
    with store.create(workspace, session_id="s1") as w:
        stamped = w.append(*start())
        assert [e.seq for e in stamped] == [1, 2]
        assert all(e.ts > 0 for e in stamped)
        assert w.next_seq == 3 and w.durable_seq == 2 and w.pending == 0
        w.append(ended())
    log = store.load("s1")
    assert log.header.id == "s1" and log.header.v == 1 and log.header.parent is None
    assert log.header.workspace == os.path.realpath(workspace)
    assert [e.type for e in log.events] == ["run_started", "user", "run_ended"]
    assert log.events[:2] == stamped
    assert not log.torn_tail


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.jsonl")))
def test_every_event_type_round_trips_byte_for_byte(
    store: Store, workspace: Path, name: str
) -> None:
    """The corpus (written by kiso 0.1.0) appended through each store loads back equal, and its
    lines come back byte for byte."""
    corpus = parse_log((CORPUS / name).read_bytes(), name)
    with store.create(workspace, session_id="c") as w:
        for event in corpus.events:  # one batch each: seq and ts are the corpus's own
            (stamped,) = w.append(event)
            assert stamped == event
    log = store.load("c")
    assert log.events == corpus.events
    lines = [dumps_line(e.to_json()) for e in log.events]
    original = (CORPUS / name).read_bytes().splitlines(keepends=True)[1 : len(lines) + 1]
    assert lines == original
    if name == "scripted-3-runs.jsonl":
        assert {e.type for e in log.events} == EVENT_TYPES - {"session"}
    if isinstance(store, JsonlSessionStore):
        assert store.path_of("c").read_bytes().splitlines(keepends=True)[1:] == original
    if isinstance(store, SqlSessionStore):  # the rows hold the lines exactly as written
        with store.engine.connect() as conn:
            stored = conn.execute(
                select(event_rows.c.line).where(event_rows.c.session_id == "c").order_by("seq")
            ).scalars()
            assert [line.encode() + b"\n" for line in stored] == original


def test_open_continues_with_contiguous_seq(store: Store, workspace: Path) -> None:
    with store.create(workspace, session_id="s1") as w:
        w.append(*start())
    with store.open("s1") as w:
        assert len(w.events) == 2 and w.next_seq == 3
        (last,) = w.append(ended())
        assert last.seq == 3
    assert [e.seq for e in store.load("s1").events] == [1, 2, 3]


def test_an_event_naming_the_wrong_seq_is_refused(store: Store, workspace: Path) -> None:
    """Compare-and-set: an event built against an older log names a seq that is taken."""
    with store.create(workspace, session_id="s1") as w:
        w.append(*start())
        with pytest.raises(AppendError, match="next seq is 3"):
            w.append(RunEnded(run="r1", outcome=Outcome.completed(), seq=2))
        w.append(RunEnded(run="r1", outcome=Outcome.completed(), seq=3))
    assert len(store.load("s1").events) == 3


def _turn(call_input: dict[str, Any], started_input: dict[str, Any]) -> list[Event]:
    call = ToolCall("c1", "shell", call_input)
    return [
        *start(),
        Assistant(run="r1", blocks=(call,), stop="tool_use", usage=Usage(), model="m", ms=1),
        ExecutionStarted(
            run="r1", execution_id="s1:4", call_id="c1", name="shell", input=started_input
        ),
        ExecutionFinished(
            run="r1", execution_id="s1:4", call_id="c1", ok=True, content="", is_error=False, ms=1
        ),
    ]


def test_an_invalid_event_in_a_batch_writes_nothing(store: Store, workspace: Path) -> None:
    with store.create(workspace, session_id="s1") as w:
        bad = User(run="r1", content="x", source="model")  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError, match="invalid user event"):
            w.append(*start(), bad)
        not_json = User(run="r1", content=[TextBlock(object())])  # type: ignore[arg-type]
        with pytest.raises(InvalidEventError):
            w.append(not_json)
        # what runs must be what was approved: the loader's cross-record check, on append
        with pytest.raises(InvalidEventError, match="differs"):
            w.append(*_turn({"command": "ls"}, {"command": "rm -rf /"}))
        assert list(w.events) == []
        w.append(*_turn({"command": "ls"}, {"command": "ls"}))
    assert [e.type for e in store.load("s1").events][-2:] == [
        "execution_started",
        "execution_finished",
    ]


def test_a_closed_writer_refuses_to_append(store: Store, workspace: Path) -> None:
    w = store.create(workspace, session_id="s1")
    w.close()
    w.close()  # idempotent
    with pytest.raises(AppendError, match="closed"):
        w.append(*start())


def test_ids_are_checked_and_unique(store: Store, workspace: Path) -> None:
    store.create(workspace, session_id="s1").close()
    with pytest.raises(SessionExistsError):
        store.create(workspace, session_id="s1")
    with pytest.raises(ValueError, match="invalid session id"):
        store.create(workspace, session_id="../escape")
    with pytest.raises(SessionNotFoundError):
        store.open("nope")
    with pytest.raises(SessionNotFoundError):
        store.load("nope")
    generated = store.create(workspace, parent="s1")
    generated.close()
    assert len(generated.id) == 36
    assert store.load(generated.id).header.parent == "s1"


def test_a_second_writer_is_refused_and_the_first_close_frees_it(
    store: Store, workspace: Path
) -> None:
    w = store.create(workspace, session_id="s1")
    with pytest.raises(SessionLockedError, match=f"pid {os.getpid()}") as info:
        store.open("s1")
    assert info.value.session_id == "s1"
    w.append(*start())  # the refused open changed nothing
    w.close()
    with store.open("s1") as again:
        assert len(again.events) == 2


def test_listing_by_workspace_with_states_and_titles(
    store: Store, workspace: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    with store.create(workspace, session_id="done") as w:
        w.append(*start())
        w.append(
            Assistant(
                run="r1", blocks=(TextBlock("hi"),), stop="end_turn", usage=Usage(), model="m", ms=1
            ),
            ended(),
        )
    with store.create(workspace, session_id="open") as w:
        w.append(*start())
    store.create(other, session_id="elsewhere").close()
    rows = {r.id: r for r in store.list(workspace)}
    assert set(rows) == {"done", "open"}
    assert rows["done"].state.value == "completed"
    assert rows["open"].state.value == "interrupted"
    assert rows["done"].title == "hello there"
    assert rows["done"].runs == 1 and rows["done"].inputs == 1 and rows["done"].events == 4
    assert {r.id for r in store.list()} == {"done", "open", "elsewhere"}
    assert store.list()[0].id == "elsewhere"  # newest activity first
    assert {r.state.value for r in store.list(other)} == {"empty"}
    # every row is what the log says (the SQL store's projection included)
    for row in store.list():
        expected = summarize(store.load(row.id))
        assert (row.state, row.title, row.updated, row.runs, row.inputs, row.events) == (
            expected.state,
            expected.title,
            expected.updated,
            expected.runs,
            expected.inputs,
            expected.events,
        )


# --------------------------------------------------------------------------- group commit


def test_group_commit_flush_and_an_await_that_leaves_the_loop_free(
    store: Store, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = store.create(workspace, session_id="s1")
    batches: list[int] = []
    entered, release = threading.Event(), threading.Event()
    real = w._write

    def held(data: bytes, count: int) -> None:
        batches.append(count)
        if len(batches) == 1 and not w.inline_io:
            entered.set()
            assert release.wait(60)
        real(data, count)

    monkeypatch.setattr(w, "_write", held)
    (first,) = w.stage(User(run="r1", content="one"))
    assert w.pending == 1 and w.durable_seq == 0  # staged: in memory only
    assert list(w.events) == [first]
    w.flush()
    if w.inline_io:  # nothing is written: flushing is immediate
        assert w.durable_seq == 1
        w.stage(User(run="r1", content="two"))
        w.flush()
        asyncio.run(w.committed())
        assert w.durable_seq == 2 and batches == [1, 1]
        w.close()
        return
    assert entered.wait(60)  # the first batch is on its way, held inside _write
    w.stage(User(run="r1", content="two"))
    w.flush()
    w.stage(User(run="r1", content="three"))
    w.flush()
    assert w.durable_seq == 0 and w.pending == 3

    async def wait_for_it() -> int:
        waiting = asyncio.create_task(w.committed())
        turns = 0
        for _ in range(20):  # the loop keeps running while the batch is held
            await asyncio.sleep(0)
            turns += 1
        assert not waiting.done()
        release.set()
        await asyncio.wait_for(waiting, 60)
        return turns

    assert asyncio.run(wait_for_it()) == 20
    assert w.durable_seq == 3 and w.pending == 0
    assert batches == [1, 2]  # the two batches queued behind the first were written as one
    w.commit()
    w.close()
    assert [e.content for e in store.load("s1").events] == ["one", "two", "three"]  # type: ignore[union-attr]


# --------------------------------------------------------------------------- validation on load


def damage(store: Store, session_id: str, line: int, data: bytes) -> Callable[[], bytes]:
    """Replace line ``line`` (1 = the header) of the stored log; return a snapshot function."""
    if isinstance(store, JsonlSessionStore):
        path = store.path_of(session_id)
        lines = path.read_bytes().splitlines(keepends=True)
        lines[line - 1 : line] = [data]
        path.write_bytes(b"".join(lines))
        return path.read_bytes
    assert isinstance(store, SqlSessionStore)
    value = data.decode("utf-8").removesuffix("\n")
    if is_pg(store) and "\x00" in value:  # PostgreSQL's text holds no NUL: this damage cannot be
        with pytest.raises(DataError), store.engine.begin() as conn:  # stored; U+FFFD stands in
            conn.execute(update(session_rows).values(title=value))  # for each NUL instead
        value = value.replace("\x00", "\ufffd")
    with store.engine.begin() as conn:
        if line == 1:
            conn.execute(
                update(session_rows).where(session_rows.c.id == session_id).values(header=value)
            )
        else:
            conn.execute(
                update(event_rows)
                .where(event_rows.c.session_id == session_id, event_rows.c.seq == line - 1)
                .values(line=value)
            )

    def snapshot() -> bytes:
        with store.engine.connect() as conn:
            rows = conn.execute(select(event_rows).order_by("session_id", "seq")).all()
            heads = conn.execute(select(session_rows.c.header)).all()
        return repr((rows, heads)).encode()

    return snapshot


DAMAGE = [
    ("not-json", 4, b"not json\n", "not valid JSON"),
    ("unknown-type", 4, b'{"seq":3,"ts":1,"run":"r1","type":"bogus"}\n', "unknown event type"),
    ("gap", 4, b'{"seq":5,"ts":1,"run":"r1","type":"run_ended","outcome":{"kind":"completed"}}\n',
     "seq 5 where 3 was expected"),
    ("duplicate", 4,
     b'{"seq":2,"ts":1,"run":"r1","type":"run_ended","outcome":{"kind":"completed"}}\n',
     "seq 2 where 3 was expected"),
    ("empty", 4, b"\n", "not valid JSON"),
    ("nul", 4, b"\x00{\x00}\x00\n", "not valid JSON"),
    ("missing-key", 3, b'{"seq":2,"ts":1,"run":"r1","type":"user","source":"user"}\n',
     "not a valid event"),
    ("other-session", 1,
     b'{"seq":0,"type":"session","v":1,"id":"s9","workspace":"/w","created":1,"kiso":"x",'
     b'"parent":null}\n', "names session 's9'"),
    ("newer", 1, b'{"seq":0,"type":"session","v":9,"id":"s1","workspace":"/w","created":1,'
     b'"kiso":"x","parent":null}\n', "upgrade kiso"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "data", "reason"), [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE]
)
def test_a_damaged_log_is_refused_the_same_way_by_every_durable_store(
    durable: Store, workspace: Path, line: int, data: bytes, reason: str
) -> None:
    with durable.create(workspace, session_id="s1") as w:
        w.append(*start(), ended())
    snapshot = damage(durable, "s1", line, data)
    before = snapshot()
    for attempt in (lambda: durable.load("s1"), lambda: durable.open("s1")):
        with pytest.raises(CorruptLogError) as info:
            attempt()
        assert info.value.line == line, str(info.value)
        assert reason in str(info.value) and f"line {line}" in str(info.value)
        assert "was not changed" in str(info.value)
        assert info.value.session_id == "s1"
        # never advise cutting the log (that would drop receipts): the doctor, or a backup
        if isinstance(durable, JsonlSessionStore):
            assert "`kiso doctor s1`" in str(info.value)
        else:
            assert "Do not delete its rows by hand" in str(info.value)
    assert snapshot() == before  # a damaged log is never modified
    (row,) = durable.list()
    if isinstance(durable, JsonlSessionStore):  # the index notices any change to the file
        assert row.state.value == "corrupt" and f"line {line}" in (row.error or "")
    else:  # a row edited in place keeps its projection: found on load (ADR 0015)
        assert row.id == "s1" and row.events == 3
    if isinstance(durable, SqlSessionStore):  # a refused open leaves no lease behind
        with durable.engine.connect() as conn:
            assert conn.execute(select(writer_rows)).all() == []


def test_an_execution_whose_input_differs_from_its_call_is_corruption(
    durable: Store, workspace: Path
) -> None:
    with durable.create(workspace, session_id="s1") as w:
        w.append(*_turn({"command": "ls"}, {"command": "ls"}))
    started = dumps_line(durable.load("s1").events[3].to_json())
    damage(durable, "s1", 5, started.replace(b'{"command":"ls"}', b'{"command":"rm"}'))
    with pytest.raises(CorruptLogError) as info:
        durable.load("s1")
    assert info.value.line == 5  # the execution_started ...
    assert "line 4" in info.value.reason  # ... and the assistant record it contradicts
    assert "s1:4" in info.value.reason and "c1" in info.value.reason


# --------------------------------------------------------------------------- other processes


def child_store(store: Store) -> str:
    """Python that builds, in another process, a store on the same sessions."""
    if isinstance(store, JsonlSessionStore):
        home = str(store.home)
        return f"from kiso.kernel import JsonlSessionStore\nstore = JsonlSessionStore({home!r})\n"
    assert isinstance(store, SqlSessionStore)
    url = store.engine.url.render_as_string(hide_password=False)
    return f"from kiso.kernel.sql import SqlSessionStore\nstore = SqlSessionStore({url!r})\n"


HOLDER = """
import sys, time
from kiso.kernel import ModelRef, RunStarted, User
writer = store.open(sys.argv[1])
writer.append(RunStarted(run="held", trigger="user", model=ModelRef("faux", "m"), mode="default"),
              User(run="held", content="from the holder"))
print("HOLDING", flush=True)
time.sleep(120)
"""


@contextmanager
def child(store: Store, body: str, *args: str, ready: str) -> Iterator[subprocess.Popen[str]]:
    """A real process running ``body`` on the same store, once it has printed ``ready``."""
    code = child_store(store) + textwrap.dedent(body)
    with subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == ready
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_a_writer_in_another_process_is_refused_by_name_and_freed_by_sigkill(
    durable: Store, workspace: Path
) -> None:
    durable.create(workspace, session_id="k9").close()
    with child(durable, HOLDER, "k9", ready="HOLDING") as holder:
        with pytest.raises(SessionLockedError) as info:
            durable.open("k9")
        message = str(info.value)
        assert f"pid {holder.pid}" in message
        assert socket.gethostname() in message
        assert time.strftime("%Y-%m-%d") in message
        assert "k9" in message
        assert [e.type for e in durable.load("k9").events] == ["run_started", "user"]  # no lock
        os.killpg(holder.pid, signal.SIGKILL)
        assert holder.wait() == -signal.SIGKILL
    # reaped: the very next open succeeds (no retry, no sleep), and the holder's appends stayed
    with durable.open("k9") as writer:
        assert len(writer.events) == 2
        writer.append(RunEnded(run="held", outcome=Outcome.aborted("crash")))
    assert durable.load("k9").events[-1].seq == 3


INTERRUPTED_SQL = """
import sys, time
from kiso.kernel import User
from kiso.kernel.sql import SqlWriter

def hold(writer, batch):  # inside the batch's transaction, its rows inserted, not committed
    print("INSIDE", flush=True)
    time.sleep(120)

writer = store.open(sys.argv[1])
SqlWriter._before_commit = hold
writer.append(*(User(run="r1", content=f"lost {i}") for i in range(3)))
"""

INTERRUPTED_JSONL = """
import os, sys, time
from kiso.kernel import User
writer = store.open(sys.argv[1])
real = os.write

def torn(fd, data):  # the batch's bytes cut inside its first record, as power loss leaves it
    real(fd, bytes(data)[:25])
    print("INSIDE", flush=True)
    time.sleep(120)

os.write = torn
writer.append(*(User(run="r1", content=f"lost {i}") for i in range(3)))
"""


def test_a_batch_interrupted_by_sigkill_leaves_exactly_the_committed_prefix(
    durable: Store, workspace: Path
) -> None:
    with durable.create(workspace, session_id="s1") as w:
        committed = w.append(*start())
    body = INTERRUPTED_SQL if isinstance(durable, SqlSessionStore) else INTERRUPTED_JSONL
    with child(durable, body, "s1", ready="INSIDE") as proc:
        assert durable.load("s1").events == committed  # a reader sees only committed batches
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    assert durable.load("s1").events == committed
    with durable.open("s1") as w:  # the dead writer is no obstacle, and nothing of it is left
        assert tuple(w.events) == committed
        (next_one,) = w.append(ended())
        assert next_one.seq == 3
    log = durable.load("s1")
    assert [e.type for e in log.events] == ["run_started", "user", "run_ended"]
    assert not log.torn_tail


# --------------------------------------------------------------------------- a failing disk


@contextmanager
def full_disk(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every write fails as on a full disk, until the block ends."""
    if isinstance(store, JsonlSessionStore):
        real = os.write

        def full(fd: int, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "write", full)
        try:
            yield
        finally:
            monkeypatch.setattr(os, "write", real)
        return
    assert isinstance(store, SqlSessionStore)
    if is_pg(store):  # the server's own disk_full error (SQLSTATE 53100), raised by the server
        full_sql = (
            "CREATE FUNCTION kiso_test_full() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION USING ERRCODE = 'disk_full', MESSAGE = 'could not extend file "
            '"base/1/2": No space left on device\'; END $$; '
            "CREATE TRIGGER kiso_test_full BEFORE INSERT ON kiso_events "
            "FOR EACH ROW EXECUTE FUNCTION kiso_test_full()"
        )
        with store.engine.begin() as conn:
            conn.execute(text(full_sql))
        try:
            yield
        finally:
            with store.engine.begin() as conn:
                conn.execute(text("DROP TRIGGER kiso_test_full ON kiso_events"))
        return

    def cap(dbapi: Any, _record: Any) -> None:  # SQLite's own SQLITE_FULL, for real
        cur = dbapi.cursor()
        pages = cur.execute("PRAGMA page_count").fetchone()[0]
        cur.execute(f"PRAGMA max_page_count = {pages}")
        cur.close()

    event.listen(store.engine, "connect", cap)
    store.engine.dispose()
    try:
        yield
    finally:
        event.remove(store.engine, "connect", cap)
        store.engine.dispose()


def test_a_full_disk_poisons_the_writer_and_leaves_the_stored_prefix(
    durable: Store, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = durable.create(workspace, session_id="s1")
    prefix = w.append(*start())
    with full_disk(durable, monkeypatch):
        with pytest.raises(AppendError) as info:
            w.append(User(run="r1", content="x" * 300_000))
        message = str(info.value)
        assert "is full" in message and "free some space there and try again" in message, message
        assert "1 event(s) were not committed" in message
        assert "Traceback" not in message
        with pytest.raises(AppendError, match="writer stopped") as poisoned:
            w.append(ended())  # refused, whatever the disk does now
        assert "ends at seq 2, intact" in str(poisoned.value)
        assert durable.load("s1").events == prefix
    with pytest.raises(AppendError, match="writer stopped"):
        w.append(ended())  # still poisoned once the disk has room again
    w.close()
    assert durable.load("s1").events == prefix
    with durable.open("s1") as again:  # opened again, it continues from what is stored
        assert again.append(ended())[0].seq == 3


# --------------------------------------------------------------------------- the SQL store only


@pytest.fixture(params=["sql", "postgresql"])
def sql(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlSessionStore]:
    made = SqlSessionStore(sql_url(request.param, request, tmp_path), clock=ticking_clock())
    create_schema(made.engine)
    yield made
    made.close()


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[SqlSessionStore]:
    made = SqlSessionStore(f"sqlite:///{tmp_path / 'sessions.db'}", clock=ticking_clock())
    create_schema(made.engine)
    yield made
    made.close()


def lease(store: SqlSessionStore, session_id: str) -> dict[str, Any] | None:
    with store.engine.connect() as conn:
        row = conn.execute(
            select(writer_rows).where(writer_rows.c.session_id == session_id)
        ).first()
    return None if row is None else dict(row._mapping)


def forge_lease(store: SqlSessionStore, session_id: str, **values: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            update(writer_rows).where(writer_rows.c.session_id == session_id).values(**values)
        )


def test_importing_the_kernel_does_not_import_sqlalchemy() -> None:
    code = (
        "import sys, kiso, kiso.kernel\n"
        "assert 'sqlalchemy' not in sys.modules, 'the kernel imported SQLAlchemy'\n"
        "from kiso.kernel import SqlSessionStore\n"
        "assert SqlSessionStore.__module__ == 'kiso.kernel.sql' and 'sqlalchemy' in sys.modules\n"
        "print('OK')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert out.stdout.strip() == "OK", out.stderr


def test_sqlite_connections_are_durable_and_careful(sqlite: SqlSessionStore) -> None:
    with sqlite.engine.connect() as conn:
        pragmas = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        }
    assert pragmas == {
        "journal_mode": "wal",
        "synchronous": 2,
        "foreign_keys": 1,
        "busy_timeout": 30000,
    }


def test_the_lease_is_a_row_released_on_close(sql: SqlSessionStore, workspace: Path) -> None:
    w = sql.create(workspace, session_id="s1")
    held = lease(sql, "s1")
    assert held is not None
    assert (held["pid"], held["host"], held["token"]) == (
        os.getpid(),
        socket.gethostname(),
        w.token,
    )
    assert held["process"] and held["process"].endswith(
        ":" + Path("/proc/self/stat").read_text().split(") ")[1].split()[19]
    )
    w.close()
    assert lease(sql, "s1") is None
    with sql.open("s1") as again:
        assert lease(sql, "s1")["token"] == again.token  # type: ignore[index]
    assert lease(sql, "s1") is None


def test_a_second_process_is_refused_while_this_one_holds_the_session(
    sql: SqlSessionStore, workspace: Path
) -> None:
    opener = child_store(sql) + textwrap.dedent(
        """
        import sys
        from kiso.kernel import SessionLockedError
        try:
            store.open(sys.argv[1]).close()
        except SessionLockedError as exc:
            print("LOCKED", exc)
        else:
            print("OPENED")
        """
    )
    with sql.create(workspace, session_id="s1"):
        out = subprocess.run(
            [sys.executable, "-c", opener, "s1"],
            capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
        )  # fmt: skip
        assert out.stdout.startswith("LOCKED"), out.stdout + out.stderr
        assert f"pid {os.getpid()} on {socket.gethostname()}" in out.stdout
    out = subprocess.run(
        [sys.executable, "-c", opener, "s1"],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert out.stdout.strip() == "OPENED", out.stderr


def test_a_stale_lease_on_this_host_is_taken_over_and_a_live_one_is_not(
    sql: SqlSessionStore, workspace: Path
) -> None:
    sql.create(workspace, session_id="s1").close()
    with subprocess.Popen(["sleep", "60"]) as sleeper:
        try:
            alive = Path(f"/proc/{sleeper.pid}/stat").read_text().split(") ")[1].split()[19]
            first = sql.open("s1")  # a lease to rewrite as if another process held it
            ident = lease(sql, "s1")["process"].split(":")[0]  # type: ignore[index]
            forge_lease(sql, "s1", pid=sleeper.pid, process=f"{ident}:{alive}", token="theirs")
            with pytest.raises(SessionLockedError, match=f"pid {sleeper.pid}"):
                sql.open("s1")  # a live process on this host
            forge_lease(sql, "s1", process=f"{ident}:{int(alive) + 1}")
            taken = sql.open("s1")  # that pid is another process now: the lease is stale
            assert lease(sql, "s1")["token"] == taken.token  # type: ignore[index]
            with pytest.raises(AppendError, match="no longer holds the session's lease"):
                first.append(*start())  # the forged-over writer is fenced off
            taken.close()
            first.close()
        finally:
            sleeper.kill()
            sleeper.wait()
    w = sql.open("s1")
    forge_lease(sql, "s1", pid=sleeper.pid, token="dead")  # reaped: no such process
    with sql.open("s1") as w2:
        assert w2.append(*start())[0].seq == 1
    w.close()


IN_FLIGHT = """
import sys
from kiso.kernel import User
from kiso.kernel.sql import SqlWriter
writer = store.open(sys.argv[1])

def hold(w, batch):  # inside the batch's transaction, until the parent says go on
    print("INSIDE", flush=True)
    sys.stdin.readline()

SqlWriter._before_commit = hold
writer.append(User(run="r1", content="in flight"))
SqlWriter._before_commit = None
print("COMMITTED", flush=True)
sys.stdin.readline()
try:
    writer.append(User(run="r1", content="too late"))
except Exception as exc:
    print("REFUSED", exc, flush=True)
else:
    print("APPENDED", flush=True)
"""


def test_a_takeover_waits_for_a_batch_in_flight_in_another_process_and_fences_it(
    sql: SqlSessionStore, workspace: Path
) -> None:
    """Cross-process single writer: a takeover of the lease waits for the holder's open batch
    (PostgreSQL: the batch holds its lease row FOR UPDATE; SQLite: BEGIN IMMEDIATE), then the
    old holder's next batch is refused, and the log is exactly the committed batches."""
    with sql.create(workspace, session_id="s1") as w:
        w.append(*start())
    code = child_store(sql) + textwrap.dedent(IN_FLIGHT)
    with subprocess.Popen(
        [sys.executable, "-c", code, "s1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, cwd=ROOT, start_new_session=True,
    ) as proc:  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "INSIDE"
            old = int(time.time() * 1000) - 60_000
            forger = threading.Thread(  # as if the holder were on a host that went silent
                target=forge_lease, args=(sql, "s1"), kwargs={"host": "elsewhere", "renewed": old}
            )
            forger.start()
            forger.join(0.5)
            assert forger.is_alive()  # it waits for the batch in flight
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "COMMITTED"
            forger.join(30)
            assert not forger.is_alive()
            with SqlSessionStore(sql.engine, lease_ttl=30).open("s1") as taken:
                assert taken.next_seq == 4  # the batch that was in flight committed first
                taken.append(User(run="r1", content="the new holder"))
                proc.stdin.write("\n")
                proc.stdin.flush()
                answer = proc.stdout.readline()
            assert answer.startswith("REFUSED") and "no longer holds" in answer, answer
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    contents = [getattr(e, "content", None) for e in sql.load("s1").events]
    assert contents == [None, "hello there", "in flight", "the new holder"]


def test_a_lease_from_another_host_waits_for_its_ttl(
    sql: SqlSessionStore, workspace: Path, tmp_path: Path
) -> None:
    w = sql.create(workspace, session_id="s1")
    forge_lease(sql, "s1", host="elsewhere", pid=1, renewed=int(time.time() * 1000) - 60_000)
    with pytest.raises(SessionLockedError, match="pid 1 on elsewhere"):
        sql.open("s1")  # no ttl: another host's lease is never assumed dead
    patient = SqlSessionStore(sql.engine, lease_ttl=3600)
    with pytest.raises(SessionLockedError, match="elsewhere"):
        patient.open("s1")  # renewed a minute ago, within the ttl
    hasty = SqlSessionStore(sql.engine, lease_ttl=30)
    with hasty.open("s1") as taken:
        taken.append(*start())
        taken.renew()
    with pytest.raises(AppendError, match="no longer holds"):
        w.append(ended())


def test_rows_changed_underneath_a_writer_are_refused(
    sql: SqlSessionStore, workspace: Path
) -> None:
    w = sql.create(workspace, session_id="s1")
    w.append(*start())
    with sql.engine.begin() as conn:  # another writer that ignored the lease
        conn.execute(
            event_rows.insert().values(
                session_id="s1", seq=3, ts=1, run="r1", type="run_ended",
                line='{"seq":3,"ts":1,"run":"r1","type":"run_ended","outcome":{"kind":"completed"}}',
            )
        )  # fmt: skip
    with pytest.raises(AppendError, match="changed underneath this writer"):
        w.append(ended())
    w.close()
    with sql.open("s1") as again:  # the stored log is the truth; the projection follows it
        assert again.next_seq == 4
        again.append(User(run="r1", content="after"))
    assert sql.list()[0].events == 4


def test_a_read_only_database_refuses_with_a_clear_error(
    sql: SqlSessionStore, workspace: Path
) -> None:
    w = sql.create(workspace, session_id="s1")
    w.append(*start())

    def read_only(dbapi: Any, _record: Any) -> None:
        if is_pg(sql):  # as a hot standby is: every transaction read-only
            dbapi.execute("SET default_transaction_read_only = on")
            dbapi.commit()
        else:
            dbapi.execute("PRAGMA query_only = ON")

    event.listen(sql.engine, "connect", read_only)
    sql.engine.dispose()
    with pytest.raises(AppendError, match="read-only") as info:
        w.append(ended())
    assert "1 event(s) were not committed" in str(info.value)
    event.remove(sql.engine, "connect", read_only)
    sql.engine.dispose()
    w.close()
    assert len(sql.load("s1").events) == 2


@pytest.mark.parametrize("kind", ["sql", "postgresql"])
def test_a_database_without_the_tables_says_what_to_do(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, workspace: Path
) -> None:
    bare = SqlSessionStore(sql_url(kind, request, tmp_path))
    with pytest.raises(StoreError, match="create_schema"):
        bare.create(workspace, session_id="s1")
    bare.close()


def test_sessions_are_scoped_by_project(sql: SqlSessionStore, workspace: Path) -> None:
    sql.create(workspace, session_id="a", project="p1").close()
    sql.create(workspace, session_id="b", project="p2").close()
    sql.create(workspace, session_id="c").close()
    assert [r.id for r in sql.list(project="p1")] == ["a"]
    assert {r.id for r in sql.list(workspace)} == {"a", "b", "c"}
    assert sql.project_of("b") == "p2" and sql.project_of("c") is None
    with pytest.raises(SessionNotFoundError):
        sql.project_of("nope")
    with pytest.raises(ValueError, match="project"):
        sql.create(workspace, project="x" * 129)


def test_the_listing_projection_is_rebuilt_when_it_disagrees(
    sql: SqlSessionStore, workspace: Path
) -> None:
    with sql.create(workspace, session_id="s1") as w:
        w.append(*start(), ended())
    truth = sql.list()
    with sql.engine.begin() as conn:  # written by another kiso version, with another answer
        conn.execute(update(session_rows).values(projected="0.0.0-old", state="empty", title="?"))
    assert sql.list() == truth
    with sql.engine.connect() as conn:  # and cached again
        row = conn.execute(select(session_rows.c.state, session_rows.c.projected)).one()
    assert tuple(row) == ("completed", kiso.__version__)


def test_each_batch_is_one_transaction(sql: SqlSessionStore, workspace: Path) -> None:
    commits: list[int] = []
    event.listen(sql.engine, "commit", lambda conn: commits.append(1))
    with sql.create(workspace, session_id="s1") as w:
        before = len(commits)
        w.append(*start(), ended())
        w.append(User(run="r1", content="again"))
        assert len(commits) - before == 2


def test_the_schema_is_portable_and_alembic_sees_it(
    sql: SqlSessionStore, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex, CreateTable

    from kiso.kernel.sql import metadata

    for table in metadata.sorted_tables:  # PostgreSQL DDL: no SQLite-only construct
        ddl = str(CreateTable(table).compile(dialect=postgresql.dialect()))
        assert "AUTOINCREMENT" not in ddl and "WITHOUT ROWID" not in ddl
        for index in table.indexes:
            str(CreateIndex(index).compile(dialect=postgresql.dialect()))
    with sql.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    if is_pg(sql):
        pg = request.getfixturevalue("pg_cluster")
        other = pg.create_database()
        request.addfinalizer(lambda: pg.drop_database(other))
        empty = make_engine(other)
    else:
        empty = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    with empty.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    added = {op[1].name for op in diff if op[0] == "add_table"}
    assert added == {"kiso_sessions", "kiso_events", "kiso_writers"}
    assert {op[1].name for op in diff if op[0] == "add_index"} == {
        "ix_kiso_events_run",
        "ix_kiso_events_type",
        "ix_kiso_sessions_project",
        "ix_kiso_sessions_workspace",
    }
    empty.dispose()


def test_an_in_memory_database_works_across_threads(workspace: Path) -> None:
    memory = SqlSessionStore("sqlite://")
    create_schema(memory.engine)
    with memory.create(workspace, session_id="s1") as w:
        w.stage(*start())

        async def go() -> None:
            await w.committed()

        asyncio.run(go())
    assert len(memory.load("s1").events) == 2
    assert memory.where == "an in-memory SQLite database"
    memory.close()


def test_json_of_the_rows_matches_the_jsonl_file(
    sql: SqlSessionStore, home: Path, workspace: Path
) -> None:
    """The same events through both stores: the SQL rows are the JSONL file's lines."""
    jsonl = JsonlSessionStore(home, clock=ticking_clock())
    events = [*_turn({"command": "ls"}, {"command": "ls"}), ended()]
    for store in (jsonl, sql):
        with store.create(workspace, session_id="s1") as w:
            w.append(*events[:3])
            w.append(*events[3:])
    file_lines = jsonl.path_of("s1").read_bytes().decode().splitlines()
    with sql.engine.connect() as conn:
        head = conn.execute(select(session_rows.c.header)).scalar_one()
        rows = conn.execute(select(event_rows).order_by("seq")).all()
    assert [head, *(r.line for r in rows)] == file_lines
    assert [(r.seq, r.type, r.run) for r in rows] == [
        (e.seq, e.type, e.run) for e in jsonl.load("s1").events
    ]
    assert json.loads(head)["id"] == "s1"


def test_the_sql_store_example_in_the_docs_runs() -> None:
    doc = (ROOT / "docs" / "durability.md").read_text()
    section = doc[doc.index("\n## The SQL store\n") :]
    code = section[
        section.index("```python\n") + 10 : section.index("```\n", section.index("```python"))
    ]
    exec(compile(code, "docs/durability.md", "exec"), {})


# ------------------------------------------------- the SQL store: an application's rows with it

_side_meta = MetaData()
_side = Table("app_side", _side_meta, Column("note", String(64), nullable=False))


def _side_notes(store: SqlSessionStore) -> list[str]:
    with store.engine.connect() as conn:
        return [r.note for r in conn.execute(select(_side.c.note))]


def test_attached_rows_commit_in_the_batch_that_makes_their_event_durable(
    sql: SqlSessionStore, workspace: Path
) -> None:
    _side_meta.create_all(sql.engine)
    with sql.create(workspace, session_id="s1") as w:
        first = w.stage(*start())
        w.attach(
            lambda conn: conn.execute(_side.insert().values(note="with r1")), seq=first[-1].seq
        )
        assert _side_notes(sql) == []  # staged, not durable: nothing of it yet
        w.commit()
        assert _side_notes(sql) == ["with r1"]
        assert [e.seq for e in sql.load("s1").events] == [1, 2]
        # a durable (or never staged) event takes nothing: its transaction is over
        for seq in (2, 3):
            with pytest.raises(UsageError, match="attach needs a staged event"):
                w.attach(lambda conn: None, seq=seq)
        # attached to a later event of a batch: that same batch, not the one before it
        (end,) = w.stage(ended())
        w.attach(lambda conn: conn.execute(_side.insert().values(note="with end")), seq=end.seq)
        w.commit()
    assert _side_notes(sql) == ["with r1", "with end"]


def test_a_failed_batch_takes_its_attached_rows_with_it(
    sql: SqlSessionStore, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _side_meta.create_all(sql.engine)

    def fail(writer: SqlWriter, batch: Any) -> None:
        raise RuntimeError("the disk went away")

    w = sql.create(workspace, session_id="s1")
    staged = w.stage(*start())
    w.attach(lambda conn: conn.execute(_side.insert().values(note="charge")), seq=staged[0].seq)
    monkeypatch.setattr(SqlWriter, "_before_commit", fail)
    with pytest.raises(Exception, match="the disk went away"):
        w.commit()
    monkeypatch.setattr(SqlWriter, "_before_commit", None)
    w.close()
    assert _side_notes(sql) == []  # neither the events nor the application's row
    assert sql.load("s1").events == ()


def test_an_attached_function_that_raises_fails_the_batch(
    sql: SqlSessionStore, workspace: Path
) -> None:
    def boom(conn: Any) -> None:
        raise ValueError("refused by the application")

    w = sql.create(workspace, session_id="s1")
    staged = w.stage(*start())
    w.attach(boom, seq=staged[-1].seq)
    with pytest.raises(Exception, match="refused by the application"):
        w.commit()
    w.close()
    assert sql.load("s1").events == ()


def test_create_can_join_the_callers_transaction(sql: SqlSessionStore, workspace: Path) -> None:
    _side_meta.create_all(sql.engine)
    # rolled back: neither the session nor the caller's row, and the writer closes harmlessly
    made: list[SqlWriter] = []

    def admit_then_give_up() -> None:
        with writing(sql.engine) as conn:
            conn.execute(_side.insert().values(note="admitted"))
            made.append(sql.create(workspace, session_id="s1", connection=conn))
            assert lease(sql, "s1") is None  # not visible outside the transaction yet
            raise RuntimeError("caller gives up")

    with pytest.raises(RuntimeError, match="caller gives up"):
        admit_then_give_up()
    made[0].close()
    with pytest.raises(SessionNotFoundError):
        sql.load("s1")
    assert _side_notes(sql) == []
    # committed: both, and the writer holds the lease and appends
    with writing(sql.engine) as conn:
        conn.execute(_side.insert().values(note="admitted"))
        w = sql.create(workspace, session_id="s1", connection=conn)
    assert _side_notes(sql) == ["admitted"]
    assert lease(sql, "s1")["token"] == w.token  # type: ignore[index]
    w.append(*start())
    w.close()
    assert [e.type for e in sql.load("s1").events] == ["run_started", "user"]
