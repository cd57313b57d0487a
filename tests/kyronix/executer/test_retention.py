"""Receipts stay small: each stored text is capped (with its full length and hash), and settled
receipts older than a retention are pruned (``kyronix receipts prune --older-than 30d``)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiso.kernel.execution import ExecutionId, ReceiptState
from kyronix.errors import KyronixUsageError
from kyronix.executer import ROOT_POLICIES, KyronixExecuter, PermissionManager, ReceiptStore
from kyronix.executer.receipts import STORED_TEXT_LIMIT, cap_entry

from .kmlkit import kml

KYRONIX = str(Path(sys.executable).with_name("kyronix"))


def test_a_long_output_is_stored_capped_with_its_length_and_hash(
    tmp_path: Path, base: Path
) -> None:
    text = "".join(f"line {i:06d} é\n" for i in range(10_000))  # about 150,000 characters
    assert len(text) > STORED_TEXT_LIMIT
    (base / "big.txt").write_text(text)
    plan = kml(("read_file", {"path": "big.txt"}, "r-1"))
    store = tmp_path / "r.sqlite3"
    with KyronixExecuter(receipts=store) as ex:
        [first] = ex.execute_sync(plan, base)
    assert first["result"]["output"] == text  # what the first request gets is never cut
    assert "stored" not in first["result"]
    size = store.stat().st_size + sum(
        p.stat().st_size for p in tmp_path.glob("r.sqlite3-*") if p.is_file()
    )
    with KyronixExecuter(receipts=store) as ex:
        [replay] = ex.execute_sync(plan, base)
    result = replay["result"]
    assert result["output"] == text[:STORED_TEXT_LIMIT]
    assert result["truncated"] is True
    assert result["stored"] == {
        "output": {
            "length": len(text),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
    }
    assert size < len(text.encode())  # the store never held the whole output


def test_cap_entry_cuts_every_text_of_the_result_and_nothing_else() -> None:
    entry = {
        "tool": "http_request",
        "args": {"url": "x" * 50},
        "result": {
            "success": False,
            "output": "o" * 20,
            "executionId": "e",
            "ms": 1,
            "error": "e" * 5,
            "errorType": "HTTPError",
            "data": {"body": "b" * 30, "headers": {"h": "v" * 11}, "list": ["z" * 12, 3]},
        },
    }
    capped = cap_entry(entry, 10)
    result = capped["result"]
    assert result["output"] == "o" * 10 and result["error"] == "e" * 5
    assert result["data"] == {"body": "b" * 10, "headers": {"h": "v" * 10}, "list": ["z" * 10, 3]}
    assert sorted(result["stored"]) == ["data.body", "data.headers.h", "data.list[0]", "output"]
    assert result["stored"]["data.body"]["length"] == 30
    assert capped["args"] == entry["args"]  # arguments are the request, not a stored output
    assert entry["result"]["output"] == "o" * 20  # the entry itself is untouched
    small = {"tool": "t", "args": {}, "result": {"success": True, "output": "ok"}}
    assert cap_entry(small, 10) is small


def _age(store: Path, execution_id: str, seconds: float) -> None:
    db = sqlite3.connect(store)
    then = time.time() - seconds
    db.execute(
        "UPDATE receipts SET started_at = ?, finished_at = CASE WHEN finished_at IS NULL"
        " THEN NULL ELSE ? END WHERE execution_id = ?",
        (then, then, execution_id),
    )
    db.commit()
    db.close()


def _fill(store: Path, base: Path) -> None:
    """old (finished 40 days ago), new (finished now), stuck (started 40 days ago, never
    finished), ruled (resolved 40 days ago)."""
    with KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=store) as ex:
        ex.execute_sync(
            kml(
                ("write_file", {"path": "a", "content": "1"}, "old"),
                ("write_file", {"path": "b", "content": "2"}, "new"),
            ),
            base,
        )
        rs = ex.receipts
        rs.start(str(base), ExecutionId("stuck"), "terminal", "h")
        rs.start(str(base), ExecutionId("ruled"), "terminal", "h")
        ex.resolve("ruled", "skipped", base)
    for eid in ("old", "stuck", "ruled"):
        _age(store, eid, 40 * 86_400)


def test_prune_forgets_old_settled_receipts_and_keeps_the_rest(tmp_path: Path, base: Path) -> None:
    store = tmp_path / "r.sqlite3"
    _fill(store, base)
    rs = ReceiptStore(store)
    try:
        assert rs.prune(30 * 86_400, scope=str(tmp_path / "elsewhere")) == 0
        assert rs.prune(30 * 86_400) == 2
        left = {
            eid: rs.get(str(base), ExecutionId(eid)) for eid in ("old", "new", "stuck", "ruled")
        }
        assert left["old"] is None and left["ruled"] is None
        assert left["new"] is not None and left["new"].state is ReceiptState.FINISHED
        assert left["stuck"] is not None and left["stuck"].state is ReceiptState.STARTED
        with pytest.raises(KyronixUsageError):
            rs.prune(-1)
    finally:
        rs.close()
    # A forgotten id runs again if it is sent again.
    (base / "a").write_text("changed")
    with KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=store) as ex:
        ex.execute_sync(kml(("write_file", {"path": "a", "content": "1"}, "old")), base)
    assert (base / "a").read_text() == "1"


def test_kyronix_receipts_prune(tmp_path: Path, base: Path) -> None:
    store = tmp_path / "r.sqlite3"
    _fill(store, base)
    env = {**os.environ, "KYRONIX_HOME": str(tmp_path / "home")}

    def prune(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [KYRONIX, "receipts", "prune", *args, "--receipts", str(store)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )

    bad = prune("--older-than", "thirty days")
    assert bad.returncode == 2 and "30d" in bad.stderr
    kept = prune("--older-than", "8w")
    assert kept.returncode == 0 and kept.stdout.strip() == "pruned 0 receipts older than 8w"
    done = prune("--older-than", "30d", "--base", str(base))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pruned 2 receipts older than 30d"
    again = prune("--older-than", "1d12h")
    assert again.stdout.strip() == "pruned 0 receipts older than 1d12h"
