"""What a tool declares (read-only, idempotent) is what decides its receipts; never a name list.

And the execution vocabulary is kiso's: rulings, receipt states, execution ids.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any, get_args

import pytest

from kiso.kernel.execution import ExecutionId, ReceiptState, Rerunnable, Ruling, is_rerunnable
from kyronix.errors import KyronixTypeError, KyronixUsageError, NotUncertainError
from kyronix.executer import (
    ROOT_POLICIES,
    KyronixExecuter,
    PermissionManager,
    ReceiptStore,
    RulingName,
    ToolSpec,
)
from kyronix.executer.permissions import READ_TOOLS, SAFE_POLICIES, WRITE_TOOLS
from kyronix.executer.receipts import SCHEMA_VERSION, request_hash
from kyronix.executer.tools import BUILTIN_NAMES, builtin_tools
from kyronix.executer.tools import files as file_tools

from .kmlkit import kml

DOCS = Path(__file__).resolve().parents[3] / "docs" / "executer.md"


def _declared_in_docs() -> dict[str, tuple[bool, bool]]:
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("### What each built-in declares", 1)[1].split("\n## ", 1)[0]
    marks = {"yes": True, "no": False, "—": False}
    table: dict[str, tuple[bool, bool]] = {}
    for line in section.splitlines():
        m = re.match(r"\| `(\w+)` \| (yes|no|—) \| (yes|no|—) \|", line)
        if m:
            table[m.group(1)] = (marks[m.group(2)], marks[m.group(3)])
    return table


def test_the_builtins_declare_what_the_docs_say() -> None:
    documented = _declared_in_docs()
    specs = builtin_tools()
    assert sorted(documented) == sorted(BUILTIN_NAMES)
    for name, spec in specs.items():
        assert (spec.read_only, spec.idempotent) == documented[name], name
        if spec.read_only:
            assert not spec.idempotent and not spec.writes, name
    assert sorted(n for n, s in specs.items() if s.read_only) == [
        "list_dir",
        "read_file",
        "read_lines",
    ]
    assert sorted(n for n, s in specs.items() if s.idempotent) == [
        "create_dir",
        "navigate",
        "screenshot",
        "write_file",
    ]


def test_a_toolspec_must_declare_both() -> None:
    spec: Rerunnable = builtin_tools()["read_file"]
    assert is_rerunnable(spec)
    with pytest.raises(TypeError, match="read_only"):
        ToolSpec("x", (), lambda call: None)  # type: ignore[call-arg,arg-type,return-value]


def test_safe_policies_come_from_the_declarations() -> None:
    assert set(READ_TOOLS) == {s.name for s in file_tools.TOOLS if s.read_only}
    assert set(READ_TOOLS) | set(WRITE_TOOLS) == {s.name for s in file_tools.TOOLS}
    assert set(READ_TOOLS) == {"read_file", "read_lines", "list_dir"}
    allowed = {p.action for p in SAFE_POLICIES if p.effect == "allow"}
    assert allowed == {f"tool:{s.name}" for s in file_tools.TOOLS}


class _Spy(ReceiptStore):
    """A real store that also notes which executions got a fsynced ``started`` row."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.started: list[str] = []

    def start(self, scope: str, execution_id: ExecutionId, tool: str, digest: str) -> Any:
        self.started.append(execution_id)
        return super().start(scope, execution_id, tool, digest)


def test_only_tools_that_are_not_rerunnable_get_a_started_row(tmp_path: Path, base: Path) -> None:
    spy = _Spy(tmp_path / "r.db")
    ex = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=spy)
    (base / "f.txt").write_text("one\ntwo\n")
    plan = kml(
        ("read_file", {"path": "f.txt"}, "read"),
        ("list_dir", {}, "list"),
        ("read_lines", {"path": "f.txt"}, "lines"),
        ("create_dir", {"path": "d"}, "mkdir"),
        ("write_file", {"path": "w.txt", "content": "w"}, "write"),
        ("write_in_between", {"path": "f.txt", "content": "x", "linebefore": "0"}, "insert"),
        ("delete_file", {"path": "w.txt"}, "delete"),
        ("terminal", {"command": "true"}, "shell"),
    )
    with ex:
        results = ex.execute_sync(plan, base)
        assert all(r["result"]["success"] for r in results), results
        assert spy.started == ["insert", "delete", "shell"]
        # every one of them has its finished receipt, and a second send replays them all
        for eid in ("read", "list", "lines", "mkdir", "write", "insert", "delete", "shell"):
            receipt = spy.get(str(base), ExecutionId(eid))
            assert receipt is not None and receipt.state is ReceiptState.FINISHED, eid
        assert ex.execute_sync(plan, base) == results
    assert (base / "f.txt").read_text() == "x\none\ntwo\n"  # inserted once


@pytest.mark.parametrize(
    ("flags", "rerunnable"),
    [({"read_only": True}, True), ({"idempotent": True}, True), ({}, False)],
    ids=["read_only", "idempotent", "effects"],
)
def test_a_custom_tool_gets_the_receipts_it_declares(
    tmp_path: Path, base: Path, flags: dict[str, bool], rerunnable: bool
) -> None:
    ex = KyronixExecuter(receipts=tmp_path / "r.db")
    seen: list[Any] = []

    def probe(args: dict[str, Any]) -> str:
        seen.append(ex.receipts.get(str(base), ExecutionId("probe-1")))
        return "probed"

    ex.register("probe", probe, **flags)
    with ex:
        [entry] = ex.execute_sync(kml(("probe", {}, "probe-1")), base)
        assert entry["result"]["output"] == "probed"
        [during] = seen
        if rerunnable:
            assert during is None  # nothing fsynced before it ran
        else:
            assert during is not None and during.state is ReceiptState.STARTED
        after = ex.receipts.get(str(base), ExecutionId("probe-1"))
        assert after is not None and after.state is ReceiptState.FINISHED
        # a finished call is replayed whatever the tool declares
        assert ex.execute_sync(kml(("probe", {}, "probe-1")), base) == [entry]
        assert len(seen) == 1


@pytest.mark.parametrize(
    ("flags", "rerunnable"),
    [({"read_only": True}, True), ({"idempotent": True}, True), ({}, False)],
    ids=["read_only", "idempotent", "effects"],
)
def test_a_left_over_started_row_is_rerun_only_for_a_rerunnable_tool(
    tmp_path: Path, base: Path, flags: dict[str, bool], rerunnable: bool
) -> None:
    """What a crash (or an earlier declaration) leaves: a started row and no finish."""
    ex = KyronixExecuter(receipts=tmp_path / "r.db")
    runs: list[str] = []
    ex.register("probe", lambda args: runs.append("ran") or "ran", **flags)
    scope = str(base)
    with ex:
        ex.receipts.start(scope, ExecutionId("left"), "probe", request_hash("probe", {}))
        [entry] = ex.execute_sync(kml(("probe", {}, "left")), base)
        receipt = ex.receipts.get(scope, ExecutionId("left"))
        assert receipt is not None
        if rerunnable:
            assert entry["result"]["success"] and runs == ["ran"]
            assert receipt.state is ReceiptState.FINISHED
            assert ex.uncertain_executions(base) == []
        else:
            assert entry["result"]["uncertain"] is True and runs == []
            assert receipt.state is ReceiptState.STARTED
        # another call under the same id is still a conflict, rerunnable or not
        [other] = ex.execute_sync(kml(("probe", {"x": "1"}, "left")), base)
        assert other["result"]["errorType"] == "ReceiptConflict"


def test_register_checks_its_declarations(tmp_path: Path) -> None:
    ex = KyronixExecuter(receipts=":memory:")
    with ex:
        with pytest.raises(KyronixTypeError, match="read_only"):
            ex.register("x", lambda args: None, read_only="yes")  # type: ignore[arg-type]
        with pytest.raises(KyronixTypeError, match="idempotent"):
            ex.register("x", lambda args: None, idempotent=1)  # type: ignore[arg-type]


# -- the vocabulary ----------------------------------------------------------------------------


def test_the_ruling_literal_is_the_rulings() -> None:
    assert set(get_args(RulingName)) == {r.value for r in Ruling}


def test_resolve_takes_a_ruling_or_its_value_but_no_alias(
    root_executer: KyronixExecuter, base: Path
) -> None:
    store, scope = root_executer.receipts, str(base)
    (base / "x").write_text("kept")
    args = {"path": "x"}  # delete_file is not rerunnable: its started row is uncertain
    for eid in ("by-enum", "by-text", "alias"):
        store.start(scope, ExecutionId(eid), "delete_file", request_hash("delete_file", args))
    root_executer.resolve("by-enum", Ruling.SKIPPED, base)
    root_executer.resolve("by-text", "applied", base)
    with pytest.raises(KyronixUsageError, match="'rerun', 'skipped', 'applied'"):
        root_executer.resolve("alias", "skip", base)  # type: ignore[arg-type]
    with pytest.raises(KyronixUsageError):
        root_executer.resolve("alias", "maybe", base)  # type: ignore[arg-type]
    skipped = store.get(scope, ExecutionId("by-enum"))
    applied = store.get(scope, ExecutionId("by-text"))
    assert skipped is not None and skipped.state is ReceiptState.RESOLVED
    assert applied is not None and applied.state is ReceiptState.RESOLVED
    [entry] = root_executer.execute_sync(kml(("delete_file", args, "by-enum")), base)
    assert entry["result"]["resolved"] == "skipped" and entry["result"]["errorType"] == "Skipped"
    [entry] = root_executer.execute_sync(kml(("delete_file", args, "by-text")), base)
    assert entry["result"]["resolved"] == "applied" and entry["result"]["success"] is True
    with pytest.raises(NotUncertainError, match="resolved it as applied"):
        root_executer.resolve("by-text", "skipped", base)
    assert [r.execution_id for r in root_executer.uncertain_executions(base)] == ["alias"]
    # the message of an uncertain execution names the rulings
    [entry] = root_executer.execute_sync(kml(("delete_file", args, "alias")), base)
    assert entry["result"]["uncertain"] is True
    assert "'rerun' | 'skipped' | 'applied'" in entry["result"]["error"]
    assert (base / "x").read_text() == "kept"  # none of them ran


def test_the_state_column_accepts_exactly_the_receipt_states(tmp_path: Path) -> None:
    ReceiptStore(tmp_path / "r.db").close()
    db = sqlite3.connect(tmp_path / "r.db")
    (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'receipts'").fetchone()
    for state in ReceiptState:
        assert f"'{state.value}'" in sql
    row = ("s", "id-{}", "t", "h", "{}", 0.0, 1, "host")
    for i, state in enumerate(ReceiptState):
        db.execute(
            "INSERT INTO receipts (scope, execution_id, tool, request_hash, state, started_at,"
            " pid, host) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (*row[:1], row[1].format(i), *row[2:4], state.value, *row[5:]),
        )
    with pytest.raises(sqlite3.IntegrityError):
        db.execute(
            "INSERT INTO receipts (scope, execution_id, tool, request_hash, state, started_at,"
            " pid, host) VALUES ('s', 'bad', 't', 'h', 'uncertain', 0, 1, 'host')"
        )
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


_LAYOUT_0 = """
CREATE TABLE receipts (
    scope        TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    tool         TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('started', 'finished')),
    started_at   REAL NOT NULL,
    finished_at  REAL,
    pid          INTEGER NOT NULL,
    host         TEXT NOT NULL,
    entry        TEXT,
    PRIMARY KEY (scope, execution_id)
) WITHOUT ROWID
"""


def test_a_store_of_the_first_layout_is_migrated(tmp_path: Path, base: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.execute(_LAYOUT_0)
    args = {"path": "f", "content": "v1"}
    entry = {
        "tool": "write_file",
        "args": {},
        "result": {"success": True, "output": "old", "executionId": "done", "ms": 3},
    }
    db.execute(
        "INSERT INTO receipts VALUES (?, 'done', 'write_file', ?, 'finished', 1, 2, 7, 'h', ?)",
        (str(base), request_hash("write_file", args), __import__("json").dumps(entry)),
    )
    db.execute(
        "INSERT INTO receipts VALUES (?, 'open', 'terminal', ?, 'started', 1, NULL, 7, 'h', NULL)",
        (str(base), request_hash("terminal", {"command": "true"})),
    )
    db.commit()
    db.close()
    ex = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=path)
    with ex:
        [replayed] = ex.execute_sync(kml(("write_file", args, "done")), base)
        assert replayed == entry and not (base / "f").exists()
        assert [r.execution_id for r in ex.uncertain_executions(base)] == ["open"]
        ex.resolve("open", "applied", base)  # 'resolved' did not exist in layout 0
        receipt = ex.receipts.get(str(base), ExecutionId("open"))
        assert receipt is not None and receipt.state is ReceiptState.RESOLVED
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT count(*) FROM receipts").fetchone()[0] == 2
    db.close()
    ReceiptStore(path).close()  # opening a migrated store again changes nothing


def test_a_store_from_a_newer_kyronix_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    ReceiptStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    from kyronix.errors import ReceiptStoreError

    with pytest.raises(ReceiptStoreError, match="newer Kyronix"):
        ReceiptStore(path)
