"""Concurrent edits of one file take turns: none is lost, from threads or from processes.

Issue 12: 20 concurrent ``write_in_between`` on one file all reported success and 5-7 lines
landed. Every tool that is not read-only now holds the edit lock of each file it names for the
whole call (``kyronix.executer.locks``), so all 20 land, whether they come from one event loop,
from threads or from two processes sharing the state directory; a call that cannot get the lock
in time fails loudly and changes nothing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kyronix.executer import ROOT_POLICIES, KyronixExecuter, Param, PermissionManager
from kyronix.executer.locks import FileLocks

from .kmlkit import kml

N = 20


def _insert(i: int) -> str:
    return kml(("write_in_between", {"path": "f.txt", "content": f"line {i}\n", "linebefore": "0"}))


def _landed(path: Path) -> list[str]:
    return sorted(line for line in path.read_text().splitlines() if line.startswith("line "))


def _expected(count: int) -> list[str]:
    return sorted(f"line {i}" for i in range(count))


def test_twenty_concurrent_executes_on_one_loop_all_land(
    root_executer: KyronixExecuter, base: Path
) -> None:
    (base / "f.txt").write_text("top\n")

    async def all_at_once() -> list[Any]:
        return await asyncio.gather(*(root_executer.execute(_insert(i), base) for i in range(N)))

    results = asyncio.run(all_at_once())
    assert all(r[0]["result"]["success"] for r in results), results
    assert _landed(base / "f.txt") == _expected(N)
    assert (base / "f.txt").read_text().endswith("top\n")


def test_twenty_threads_on_one_executer_all_land(
    root_executer: KyronixExecuter, base: Path
) -> None:
    (base / "f.txt").write_text("")
    start = threading.Barrier(N)
    outcomes: list[Any] = [None] * N

    def worker(i: int) -> None:
        start.wait(30)
        outcomes[i] = root_executer.execute_sync(_insert(i), base)[0]["result"]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(o is not None and o["success"] for o in outcomes), outcomes
    assert _landed(base / "f.txt") == _expected(N)
    assert not list((root_executer.state_dir / "locks").glob("*.lock")), "a lock file was left"


def test_every_line_tool_and_write_take_turns_on_one_file(
    root_executer: KyronixExecuter, base: Path
) -> None:
    """Mixed edits of one file (inserts, a replacement of the first line, a whole rewrite at
    the start): the end state is one a sequence of them could produce, nothing lost."""
    (base / "f.txt").write_text("".join(f"seed {i}\n" for i in range(5)))

    def insert(i: int) -> str:
        return kml(
            ("write_in_between", {"path": "f.txt", "content": f"line {i}\n", "linebefore": "1"})
        )

    async def go() -> None:
        await asyncio.gather(
            *(root_executer.execute(insert(i), base) for i in range(10)),
            root_executer.execute(
                kml(
                    (
                        "modify_line_between",
                        {"path": "f.txt", "content": "first\n", "startline": "1", "endline": "1"},
                    )
                ),
                base,
            ),
        )

    asyncio.run(go())
    lines = (base / "f.txt").read_text().splitlines()
    assert sorted(x for x in lines if x.startswith("line ")) == _expected(10)
    assert sum(1 for x in lines if x.startswith("seed ")) in (4, 5)  # line 1 replaced once
    assert len(lines) == 15


def test_a_tool_with_effects_is_never_inside_twice_on_the_same_file(
    tmp_path: Path, base: Path
) -> None:
    """Deterministic proof: a registered tool that names a path waits inside its call until a
    second call on the same file arrives or 0.3 s pass. With the lock the second can only
    start after the first has left, so no call ever sees another inside."""
    inside = {"now": 0, "most": 0}
    guard = threading.Lock()
    entered = threading.Event()

    def slow(args: dict[str, Any]) -> str:
        with guard:
            inside["now"] += 1
            inside["most"] = max(inside["most"], inside["now"])
        entered.set()
        time.sleep(0.3)
        with guard:
            inside["now"] -= 1
        return "ok"

    ex = KyronixExecuter(
        permissions=PermissionManager(ROOT_POLICIES), receipts=tmp_path / "r.sqlite3"
    )
    ex.register("slow_edit", slow, params=[Param("path", "path")])
    ex.register("slow_other", slow, params=[Param("path", "path")])
    with ex:

        async def go() -> list[Any]:
            return await asyncio.gather(
                *(ex.execute(kml(("slow_edit", {"path": "same.txt"})), base) for _ in range(3)),
            )

        began = time.monotonic()
        asyncio.run(go())
        assert inside["most"] == 1
        assert time.monotonic() - began >= 0.9  # they took turns
        # different files do not wait for each other
        inside["most"] = 0

        async def apart() -> list[Any]:
            return await asyncio.gather(
                ex.execute(kml(("slow_edit", {"path": "a.txt"})), base),
                ex.execute(kml(("slow_other", {"path": "b.txt"})), base),
            )

        asyncio.run(apart())
        assert inside["most"] == 2


def test_a_locked_file_fails_loudly_and_nothing_changes(tmp_path: Path, base: Path) -> None:
    (base / "f.txt").write_text("a\n")
    ex = KyronixExecuter(
        permissions=PermissionManager(ROOT_POLICIES),
        receipts=tmp_path / "r.sqlite3",
        lock_timeout_s=0.2,
    )
    with ex:
        # Another process's edit, as the lock file sees it: held on the file's real path.
        held = FileLocks(ex.state_dir / "locks").acquire([base / "f.txt"])
        try:
            [entry] = ex.execute_sync(_insert(1), base)
        finally:
            held.release()
        result = entry["result"]
        assert result["success"] is False and result["errorType"] == "Busy"
        assert f"pid {os.getpid()}" in result["error"] and "nothing was changed" in result["error"]
        assert (base / "f.txt").read_text() == "a\n"
        # nothing was recorded: the same id, sent again when the file is free, runs
        assert ex.receipts.get(str(base), entry["result"]["executionId"]) is None  # type: ignore[arg-type]
        [again] = ex.execute_sync(_insert(1), base)
        assert again["result"]["success"]
        assert (base / "f.txt").read_text() == "line 1\na\n"


def test_both_ends_of_a_move_are_locked_in_one_order(
    root_executer: KyronixExecuter, base: Path
) -> None:
    """A move a->b and a move b->a at once take the two locks in the same order: no deadlock
    (each is a failure or a success, and the file exists exactly once)."""
    (base / "a").write_text("x")

    async def go() -> list[Any]:
        return await asyncio.gather(
            *(
                root_executer.execute(kml(("move_file", {"source": s, "destination": d})), base)
                for s, d in [("a", "b"), ("b", "a")] * 5
            )
        )

    asyncio.run(asyncio.wait_for(go(), 60))
    assert sorted(p.name for p in base.iterdir()) in (["a"], ["b"])


_WORKER = r"""
import sys, time
from pathlib import Path
from kyronix.executer import KyronixExecuter, ROOT_POLICIES, PermissionManager
from kyronix.kml import Plan, ToolCall, serialize

who, base, receipts = sys.argv[1], sys.argv[2], sys.argv[3]
count, go = int(sys.argv[4]), Path(sys.argv[5])
while not go.exists():
    time.sleep(0.01)
ex = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=receipts)
with ex:
    for k in range(count):
        call = ToolCall(
            "write_in_between",
            {"path": "f.txt", "content": f"line {who}-{k}\n", "linebefore": "0"},
            f"{who}-{k}",
        )
        [entry] = ex.execute_sync(serialize(Plan((call,))), base)
        assert entry["result"]["success"], entry
print("done")
"""


def test_two_processes_sharing_a_state_directory_lose_nothing(tmp_path: Path, base: Path) -> None:
    (base / "f.txt").write_text("")
    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    go = tmp_path / "go"
    count = 30
    # Each process has its own receipt store, in the same state directory (where the locks are).
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(worker),
                who,
                str(base),
                str(tmp_path / f"{who}.sqlite3"),
                str(count),
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in ("p", "q")
    ]
    try:
        go.write_text("")
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.strip() == "done", err
    lines = (base / "f.txt").read_text().splitlines()
    want = sorted(f"line {who}-{k}" for who in ("p", "q") for k in range(count))
    assert sorted(lines) == want
    assert not list((tmp_path / "locks").glob("*.lock"))


@pytest.mark.parametrize("tool", ["read_file", "read_lines", "list_dir"])
def test_read_only_tools_take_no_lock(tmp_path: Path, base: Path, tool: str) -> None:
    (base / "f.txt").write_text("a\n")
    ex = KyronixExecuter(
        permissions=PermissionManager(ROOT_POLICIES),
        receipts=tmp_path / "r.sqlite3",
        lock_timeout_s=0.05,
    )
    with ex:
        held = FileLocks(ex.state_dir / "locks").acquire([base / "f.txt", base])
        try:
            [entry] = ex.execute_sync(
                kml((tool, {"path": "." if tool == "list_dir" else "f.txt"})), base
            )
        finally:
            held.release()
    assert entry["result"]["success"], entry


_HOLDER = r"""
import sys, time
from pathlib import Path
from kyronix.executer.locks import FileLocks

held = FileLocks(Path(sys.argv[1])).acquire([sys.argv[2]])
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
held.release()
"""


def test_a_lock_held_by_another_process_is_respected(tmp_path: Path, base: Path) -> None:
    """Deterministic across processes: while another process holds the file's lock, an edit
    here fails Busy and the file is untouched; once it lets go, the edit runs."""
    (base / "f.txt").write_text("a\n")
    ex = KyronixExecuter(
        permissions=PermissionManager(ROOT_POLICIES),
        receipts=tmp_path / "r.sqlite3",
        lock_timeout_s=0.3,
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(ex.state_dir / "locks"), str(base / "f.txt")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with ex:
            [entry] = ex.execute_sync(_insert(7), base)
            assert entry["result"]["errorType"] == "Busy", entry
            assert f"pid {holder.pid}" in entry["result"]["error"]
            assert (base / "f.txt").read_text() == "a\n"
            assert holder.stdin is not None
            holder.stdin.close()
            assert holder.wait(30) == 0
            [entry] = ex.execute_sync(_insert(7), base)
            assert entry["result"]["success"], entry
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()
    assert (base / "f.txt").read_text() == "line 7\na\n"
