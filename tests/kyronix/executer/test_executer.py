"""The executer's pipeline: dispatch, arguments, permissions, receipts, custom tools, terminal."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from kyronix.executer import (
    ROOT_POLICIES,
    SAFE_POLICIES,
    KmlError,
    KyronixExecuter,
    PermissionManager,
    ReceiptStore,
    Sandbox,
    allow,
    deny,
)
from kyronix.executer.receipts import request_hash

from .kmlkit import fail, kml, ok


def test_public_names_import() -> None:
    from kyronix.executer import (  # noqa: F401
        ROOT_POLICIES,
        SAFE_POLICIES,
        KyronixExecuter,
        PermissionManager,
        Sandbox,
    )

    assert len(KyronixExecuter(receipts=":memory:").tools) == 20


def test_permission_manager_check_as_documented(tmp_path: Path) -> None:
    root = PermissionManager(ROOT_POLICIES)
    assert root.check("tool:write_file", "/path/to/file.txt")
    assert root.check("tool:terminal")
    assert root.check("net:private", "127.0.0.1:80")
    safe = PermissionManager(SAFE_POLICIES)
    assert safe.check("tool:write_file", "src/app.py")
    assert safe.check("tool:read_file", ".env")
    for protected in (".env", "config/.env.local", ".git/config", "keys/server.pem", "id_rsa"):
        assert not safe.check("tool:write_file", protected), protected
        assert not safe.check("tool:delete_file", protected), protected
    for action in ("tool:terminal", "tool:http_request", "tool:git_clone", "tool:navigate"):
        assert not safe.check(action)
    assert not safe.check("net:private", "127.0.0.1:80")
    # SAFE allows paths inside the base only: an absolute path is judged against a known base
    assert not safe.check("tool:write_file", "/etc/passwd")
    assert not safe.check("tool:read_file", "../outside.txt")
    based = PermissionManager(SAFE_POLICIES, base=tmp_path)
    assert based.check("tool:write_file", str(tmp_path / "src/app.py"))
    assert not based.check("tool:write_file", str(tmp_path / ".env"))
    assert not based.check("tool:write_file", "/etc/passwd")
    assert based.with_policies(allow("tool:terminal")).check("tool:read_file", str(tmp_path))
    # deny wins over allow; a later allow can open one thing
    opened = safe.with_policies(allow("tool:terminal"))
    assert opened.check("tool:terminal")
    closed = PermissionManager((*ROOT_POLICIES, deny("tool:write_file", "*.lock")))
    assert not closed.check("tool:write_file", "poetry.lock")
    assert closed.check("tool:write_file", "main.py")
    with pytest.raises(TypeError, match="Policy"):
        PermissionManager(["tool:*"])  # type: ignore[list-item]


def test_default_is_safe_shell_denied_and_envelope_stops(
    safe_executer: KyronixExecuter, base: Path
) -> None:
    text = kml(
        ("write_file", {"path": "a.txt", "content": "A"}),
        ("terminal", {"command": "touch pwned"}),
        ("write_file", {"path": "b.txt", "content": "B"}),
    )
    first, denied, skipped = safe_executer.execute_sync(text, base)
    assert first["result"]["success"]
    assert denied["result"]["success"] is False
    assert denied["result"]["errorType"] == "SecurityError"
    assert denied["result"]["error"].startswith("SecurityError:")
    assert "ROOT_POLICIES" in denied["result"]["error"]
    assert skipped["result"]["skipped"] is True and skipped["result"]["success"] is False
    assert (base / "a.txt").exists()
    assert not (base / "pwned").exists()
    assert not (base / "b.txt").exists()


def test_continue_on_denial_runs_the_rest(safe_executer: KyronixExecuter, base: Path) -> None:
    text = kml(
        ("write_file", {"path": ".env", "content": "SECRET=1"}),
        ("write_file", {"path": "b.txt", "content": "B"}),
    )
    denied, second = safe_executer.execute_sync(text, base, continue_on_denial=True)
    assert denied["result"]["errorType"] == "SecurityError"
    assert second["result"]["success"]
    assert not (base / ".env").exists() and (base / "b.txt").read_text() == "B"


def test_safe_protects_git_env_and_keys(safe_executer: KyronixExecuter, base: Path) -> None:
    (base / ".git").mkdir()
    (base / ".git/config").write_text("[core]\n")
    (base / "a.txt").write_text("a")
    for tool, args in [
        ("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\n"}),
        ("write_file", {"path": ".env.production", "content": "X=1"}),
        ("write_file", {"path": "deploy/id_ed25519", "content": "KEY"}),
        ("delete_file", {"path": ".git"}),
        ("move_file", {"source": "a.txt", "destination": ".git/config"}),
        ("copy_file", {"source": ".git/config", "destination": "keys/tls.key"}),
    ]:
        r = fail(safe_executer, base, tool, **args)
        assert r["errorType"] == "SecurityError", (tool, r)
    assert (base / ".git/config").read_text() == "[core]\n"
    assert not (base / ".git/hooks").exists() and not (base / ".env.production").exists()
    assert not (base / "deploy").exists() and not (base / "keys").exists()
    assert (base / "a.txt").exists()
    # reading inside the base is allowed
    assert ok(safe_executer, base, "read_file", path=".git/config")["output"] == "[core]\n"


def test_policy_list_is_accepted(tmp_path: Path, base: Path) -> None:
    ex = KyronixExecuter(
        permissions=[*SAFE_POLICIES, allow("tool:terminal")], receipts=tmp_path / "r.db"
    )
    with ex:
        result = ok(ex, base, "terminal", command="echo hi; echo err >&2")
        assert result["output"] == "hi\nerr\n"  # exactly what it printed, stderr merged
        assert result["data"]["exit_code"] == 0


def test_finished_execution_is_never_run_again(root_executer: KyronixExecuter, base: Path) -> None:
    text = kml(("write_file", {"path": "f.txt", "content": "v1"}, "exec-1"))
    first = root_executer.execute_sync(text, base)
    (base / "f.txt").write_text("changed by a person")
    again = root_executer.execute_sync(text, base)
    assert again == first
    assert (base / "f.txt").read_text() == "changed by a person"
    # a fresh executer on the same store (a restart) replays it too
    ex2 = KyronixExecuter(
        permissions=root_executer.permissions, receipts=root_executer.receipts.path
    )
    with ex2:
        assert ex2.execute_sync(text, base) == first
    assert (base / "f.txt").read_text() == "changed by a person"


def test_reads_replay_too_and_failures_are_receipted(
    root_executer: KyronixExecuter, base: Path
) -> None:
    (base / "r.txt").write_text("old")
    read = kml(("read_file", {"path": "r.txt"}, "read-1"))
    assert root_executer.execute_sync(read, base)[0]["result"]["output"] == "old"
    (base / "r.txt").write_text("new")
    assert root_executer.execute_sync(read, base)[0]["result"]["output"] == "old"
    failing = kml(("terminal", {"command": "echo once | tee -a log.txt; exit 3"}, "t-1"))
    r1 = root_executer.execute_sync(failing, base)[0]["result"]
    assert r1["success"] is False and r1["data"]["exit_code"] == 3
    assert "once" in r1["output"]
    r2 = root_executer.execute_sync(failing, base)[0]["result"]
    assert r2 == r1
    assert (base / "log.txt").read_text() == "once\n"


def test_same_id_for_a_different_call_is_a_conflict(
    root_executer: KyronixExecuter, base: Path
) -> None:
    root_executer.execute_sync(kml(("write_file", {"path": "a", "content": "1"}, "dup")), base)
    [entry] = root_executer.execute_sync(
        kml(("write_file", {"path": "a", "content": "2"}, "dup")), base
    )
    assert entry["result"]["errorType"] == "ReceiptConflict"
    assert (base / "a").read_text() == "1"


def test_receipts_are_scoped_by_base(root_executer: KyronixExecuter, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    text = kml(("write_file", {"path": "f", "content": "x"}, "same-id"))
    root_executer.execute_sync(text, one)
    root_executer.execute_sync(text, two)
    assert (one / "f").exists() and (two / "f").exists()


def test_uncertain_is_reported_not_rerun_then_resolved(
    root_executer: KyronixExecuter, base: Path
) -> None:
    args = {"command": "echo ran >> runs.txt"}
    store = root_executer.receipts
    # what a killed executer leaves: a started receipt and no finish
    assert store.start(str(base), "u-1", "terminal", request_hash("terminal", args)) is None
    text = kml(("terminal", args, "u-1"), ("write_file", {"path": "after", "content": "x"}))
    uncertain, skipped = root_executer.execute_sync(text, base)
    assert uncertain["result"]["uncertain"] is True
    assert uncertain["result"]["success"] is False
    assert "never finished" in uncertain["result"]["error"]
    assert skipped["result"]["skipped"] is True
    assert not (base / "runs.txt").exists() and not (base / "after").exists()
    assert [r.execution_id for r in root_executer.uncertain_executions(base)] == ["u-1"]

    root_executer.resolve("u-1", "rerun", base)
    [entry] = root_executer.execute_sync(kml(("terminal", args, "u-1")), base)
    assert entry["result"]["success"]
    assert (base / "runs.txt").read_text() == "ran\n"
    assert root_executer.uncertain_executions(base) == []


def test_resolve_applied_records_the_outcome(root_executer: KyronixExecuter, base: Path) -> None:
    args = {"path": "x", "content": "1"}
    root_executer.receipts.start(str(base), "u-2", "write_file", request_hash("write_file", args))
    root_executer.resolve("u-2", "applied", base)
    [entry] = root_executer.execute_sync(kml(("write_file", args, "u-2")), base)
    assert entry["result"]["success"] is True and entry["result"]["resolved"] == "applied"
    assert not (base / "x").exists()
    with pytest.raises(ValueError, match="already finished"):
        root_executer.resolve("u-2", "rerun", base)


def test_parse_error_runs_nothing(root_executer: KyronixExecuter, base: Path) -> None:
    truncated = (
        '<kyronix><tool name="write_file"><path>a.txt</path><content>x</content></tool>'
        '<tool name="terminal"><command>touch b'
    )
    with pytest.raises(KmlError) as info:
        root_executer.execute_sync(truncated, base)
    assert info.value.offset > 0
    assert os.listdir(base) == []


def test_unknown_tool_and_bad_arguments(root_executer: KyronixExecuter, base: Path) -> None:
    r = fail(root_executer, base, "rm_rf", path=".")
    assert r["errorType"] == "UnknownTool" and "write_file" in r["error"]
    r = fail(root_executer, base, "write_file", path="a")
    assert r["errorType"] == "InvalidArguments" and "<content>" in r["error"]
    r = fail(root_executer, base, "read_file", path="a", mode="rb")
    assert r["errorType"] == "InvalidArguments" and "<mode>" in r["error"]
    assert os.listdir(base) == []


def test_register_custom_tools_sync_and_async(root_executer: KyronixExecuter, base: Path) -> None:
    calls: list[dict[str, Any]] = []

    def execute_sql(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {"success": True, "results": [{"n": 1}]}

    async def shout(args: dict[str, Any]) -> str:
        await asyncio.sleep(0)
        return args["text"].upper()

    def broken(args: dict[str, Any]) -> None:
        raise RuntimeError("database is down")

    root_executer.register("execute_sql", execute_sql)
    root_executer.register("shout", shout)
    root_executer.register("broken", broken)
    text = kml(
        ("execute_sql", {"sql_query": "select 1", "limit": "5"}, "sql-1"),
        ("shout", {"text": "hi"}),
        ("broken", {}),
    )
    sql, loud, bad = root_executer.execute_sync(text, base)
    assert sql["result"]["success"] and sql["result"]["data"] == {"results": [{"n": 1}]}
    assert calls == [{"sql_query": "select 1", "limit": "5"}]
    assert loud["result"]["output"] == "HI"
    assert bad["result"]["success"] is False and "database is down" in bad["result"]["error"]
    # custom tools get receipts too
    root_executer.execute_sync(kml(("execute_sql", {"sql_query": "select 1", "limit": "5"},
                                    "sql-1")), base)  # fmt: skip
    assert len(calls) == 1
    with pytest.raises(ValueError, match="built-in"):
        root_executer.register("write_file", execute_sql)
    with pytest.raises(ValueError, match="already registered"):
        root_executer.register("shout", execute_sql)
    root_executer.register("shout", execute_sql, replace=True)


def test_registered_tool_runs_under_safe_unless_denied(tmp_path: Path, base: Path) -> None:
    ex = KyronixExecuter(receipts=tmp_path / "r.db")
    ex.register("custom_action", lambda args: {"success": True, "output": "Action performed"})
    with ex:
        assert ok(ex, base, "custom_action")["output"] == "Action performed"
    ex2 = KyronixExecuter(
        permissions=[*SAFE_POLICIES, deny("tool:custom_action")], receipts=tmp_path / "r2.db"
    )
    ex2.register("custom_action", lambda args: "ran")
    with ex2:
        assert fail(ex2, base, "custom_action")["errorType"] == "SecurityError"


def test_a_request_in_flight_runs_once(root_executer: KyronixExecuter, base: Path) -> None:
    counter = {"n": 0}
    gate = threading.Event()

    def slow(args: dict[str, Any]) -> str:
        counter["n"] += 1
        gate.wait(5)
        return "done"

    root_executer.register("slow", slow)
    text = kml(("slow", {}, "flight-1"))

    async def both() -> list[list[dict[str, Any]]]:
        first = asyncio.create_task(root_executer.execute(text, base))
        await asyncio.sleep(0.2)
        second = asyncio.create_task(root_executer.execute(text, base))
        await asyncio.sleep(0.2)
        gate.set()
        return [await first, await second]

    a, b = asyncio.run(both())
    assert counter["n"] == 1
    assert a == b and a[0]["result"]["output"] == "done"


def test_terminal_runs_in_base_without_credentials(
    root_executer: KyronixExecuter, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    monkeypatch.setenv("KYRONIX_API_KEY", "kyr_secret")
    monkeypatch.setenv("HARMLESS_SETTING", "visible")
    ex = KyronixExecuter(permissions=root_executer.permissions, receipts=":memory:")
    (base / "sub").mkdir()
    with ex:
        [entry] = ex.execute_sync(kml(("terminal", {"command": "pwd; env"})), base)
        r = entry["result"]
        assert r["success"] and entry["args"]["cwd"] == str(base)
        assert r["output"].splitlines()[0] == str(base)
        assert "sk-secret-value" not in r["output"] and "kyr_secret" not in r["output"]
        assert "HARMLESS_SETTING=visible" in r["output"]
        r = ok(ex, base, "terminal", command="pwd", cwd="sub")
        assert r["output"].splitlines()[0] == str(base / "sub")
        r = ok(ex, base, "terminal", command="echo $0", shell="sh")
        assert r["output"].startswith("/") and "sh" in r["output"].splitlines()[0]
        r = fail(ex, base, "terminal", command="pwd", cwd="../..")
        assert r["errorType"] == "SecurityError"
        r = fail(ex, base, "terminal", command="true", shell="no-such-shell")
        assert "was not found" in r["error"]


def test_terminal_timeout_kills_the_group(root_executer: KyronixExecuter, base: Path) -> None:
    r = fail(root_executer, base, "terminal", command="sleep 30 & sleep 30; echo never",
             timeout="1")  # fmt: skip
    assert r["errorType"] == "Timeout" and r["data"]["timed_out"] is True
    assert "never" not in r["output"]


def test_terminal_output_is_capped(root_executer: KyronixExecuter, base: Path) -> None:
    r = ok(root_executer, base, "terminal", command="head -c 500000 /dev/zero | tr '\\0' a")
    assert r["truncated"] is True and len(r["output"]) < 40_000
    assert r["data"]["bytes"] == 500_000


def test_sandbox_is_path_safe(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "inside").mkdir(parents=True)
    (tmp_path / "base-evil").mkdir()
    (base / "out").symlink_to(tmp_path)
    assert Sandbox.is_path_safe(base, "inside/new.txt")
    assert Sandbox.is_path_safe(base, str(base / "inside"))
    assert not Sandbox.is_path_safe(base, "../base-evil/x")
    assert not Sandbox.is_path_safe(base, str(tmp_path / "base-evil"))
    assert not Sandbox.is_path_safe(base, "out/base-evil")
    assert not Sandbox.is_path_safe(base, "a\x00b")
    assert not Sandbox.is_path_safe(base, "../../../../etc/passwd")
    bound = Sandbox(base)
    assert bound.is_path_safe("inside/new.txt")
    assert not bound.is_path_safe("../base-evil/x")
    assert bound.resolve("inside") == (base / "inside").resolve()
    assert not bound.check_all(["inside/a", "out/x"])


def test_execute_sync_refuses_a_running_loop_and_ws_url_is_explicit(base: Path) -> None:
    ex = KyronixExecuter(receipts=":memory:")

    async def inside() -> None:
        with pytest.raises(RuntimeError, match="await execute"):
            ex.execute_sync("<tool name='list_dir'></tool>", base)

    asyncio.run(inside())
    # ws_url is the tunnel now (test_daemon.py): without a key it says which one it needs.
    with pytest.raises(ValueError, match="KYRONIX_API_KEY"):
        KyronixExecuter(ws_url="ws://localhost:8080/ws", receipts=":memory:", api_key="")
    with pytest.raises(ValueError, match="not an existing directory"):
        ex.execute_sync("<tool name='list_dir'></tool>", base / "missing")


def test_receipt_store_file_is_private(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "deep/receipts.sqlite3")
    assert (tmp_path / "deep/receipts.sqlite3").stat().st_mode & 0o777 == 0o600
    store.close()
    (tmp_path / "junk.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(RuntimeError, match="receipt store"):
        ReceiptStore(tmp_path / "junk.sqlite3")
