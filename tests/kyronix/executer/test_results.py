"""One result model, producing the document's dict shape (``{tool, args, result: {success,
output, executionId, ...}}``) for every kind of entry the executer returns or stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kyronix.errors import KyronixUsageError
from kyronix.executer import ROOT_POLICIES, KyronixExecuter, PermissionManager, deny
from kyronix.executer.receipts import ReceiptStore
from kyronix.executer.results import ResultDict, ResultEntry, ToolResult

from .kmlkit import kml

REQUIRED = {"success", "output", "executionId", "ms"}
OPTIONAL = set(ResultDict.__annotations__) - REQUIRED


def _check_shape(entry: Any) -> None:
    assert set(entry) == {"tool", "args", "result"}
    result = entry["result"]
    assert REQUIRED <= set(result) <= REQUIRED | OPTIONAL, set(result)
    assert isinstance(result["success"], bool) and isinstance(result["output"], str)
    assert isinstance(result["executionId"], str) and isinstance(result["ms"], int)
    if not result["success"]:
        assert result["errorType"] and result["error"]
    # the model reads back exactly what it wrote, and the dict is plain JSON
    assert ResultEntry.from_dict(entry).to_dict() == entry
    assert json.loads(json.dumps(entry)) == entry


def test_every_kind_of_entry_has_the_document_shape(tmp_path: Path, base: Path) -> None:
    (base / "a.txt").write_text("a\n")
    ex = KyronixExecuter(
        permissions=PermissionManager([*ROOT_POLICIES, deny("tool:delete_file")]),
        receipts=tmp_path / "r.sqlite3",
    )
    ex.register("custom", lambda args: {"success": True, "output": "c", "extra": 1})
    store = ReceiptStore(tmp_path / "r.sqlite3")
    store.start(str(base), "stuck", "terminal", "x")  # type: ignore[arg-type]
    store.close()
    plan = kml(
        ("read_file", {"path": "a.txt"}, "ok"),
        ("read_file", {"path": "missing.txt"}, "notfound"),
        ("nope", {}, "unknown"),
        ("write_in_between", {"path": "a.txt", "content": "x", "linebefore": "x"}, "badarg"),
        ("terminal", {"command": "exit 3"}, "failed"),
        ("custom", {}, "custom"),
        ("terminal", {"command": "true"}, "stuck"),  # a different call under that id: conflict
        ("delete_file", {"path": "a.txt"}, "denied"),
        ("read_file", {"path": "a.txt"}, "after"),
    )
    with ex:
        entries = ex.execute_sync(plan, base)
        for entry in entries:
            _check_shape(entry)
        kinds = [e["result"].get("errorType") for e in entries]
        assert kinds == [
            None, "NotFound", "UnknownTool", "InvalidArguments", "CommandFailed", None,
            "ReceiptConflict", "SecurityError", "Skipped",
        ]  # fmt: skip
        assert entries[-1]["result"]["skipped"] is True
        # replays (from the store) and a person's rulings have the same shape
        for entry in ex.execute_sync(plan, base):
            _check_shape(entry)


def test_the_model_refuses_what_is_not_a_result() -> None:
    good = ToolResult(True, "out", "e-1", 3).to_dict()
    assert good == {"success": True, "output": "out", "executionId": "e-1", "ms": 3}
    for bad in (
        {**good, "success": "yes"},
        {**good, "ms": True},
        {**good, "surprise": 1},
        {"output": "", "executionId": "e", "ms": 0},
        {**good, "success": False},  # a failure says its errorType
        {**good, "resolved": "maybe"},
        [],
    ):
        with pytest.raises(KyronixUsageError):
            ToolResult.from_dict(bad)  # type: ignore[arg-type]
    with pytest.raises(KyronixUsageError):
        ResultEntry.from_dict({"tool": "t", "args": {}, "result": good, "more": 1})
    with pytest.raises(KyronixUsageError):
        ToolResult(True, "", "e", error="but", error_type="ToolError")
