"""The path sandbox under a concurrent swap: a thread keeps exchanging ``base/d`` (a real
directory) with a symlink to a directory outside the base while thousands of file tools run on
paths through ``d``. Whatever the interleaving, nothing is written, created, deleted, moved or
copied outside, and nothing outside is read or listed.

The outcome does not depend on timing: every check is a safety property that must hold for
*every* interleaving (the swapper only makes the bad interleavings likely). Both ways of opening
beneath the base are run: openat2 (where the kernel has it) and the O_NOFOLLOW walk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kiso.tools import paths as sandbox_paths
from kyronix.executer import ROOT_POLICIES, KyronixExecuter, PermissionManager
from kyronix.executer.tools.base import Call, SecurityError, ToolFailure, sandbox_resolve
from kyronix.executer.tools.files import TOOLS
from kyronix.kml import Plan, ToolCall, serialize

SECRET = "SECRET-OUTSIDE"
OUTSIDE_NAMES = {"x.txt", "secret-name.txt", "y.txt"}
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _exchange(a: str, b: str) -> bool:
    """renameat2(RENAME_EXCHANGE): swap two names atomically."""
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd = -100
    done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return bool(done == 0)


class Swapper:
    """Swap ``base/d`` and ``base/lnk`` (a symlink to ../outside) until stopped: with
    RENAME_EXCHANGE, or (``mode="rename"``) by renaming the directory away and a symlink in."""

    def __init__(self, base: Path, mode: str) -> None:
        self.base = base
        self.mode = mode
        self.swaps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        d, lnk, real = str(self.base / "d"), str(self.base / "lnk"), str(self.base / "d.real")
        tmp_link = str(self.base / "lnk.tmp")
        while not self._stop.is_set():
            if self.mode == "exchange":
                if _exchange(d, lnk) and _exchange(d, lnk):
                    self.swaps += 1
                continue
            try:
                os.rename(d, real)  # the directory away ...
            except OSError:
                continue
            try:
                os.symlink("../outside", tmp_link)
                os.rename(tmp_link, d)  # ... a symlink to outside in its place ...
                self.swaps += 1
            except OSError:
                pass
            finally:
                self._restore()  # ... and back

    def _restore(self) -> None:
        d, real = self.base / "d", self.base / "d.real"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.base / "lnk.tmp")
        while real.is_dir():
            with contextlib.suppress(OSError):
                if d.is_symlink():
                    d.unlink()
                elif d.is_dir():  # a tool made a new d/ while the real one was away
                    shutil.rmtree(d, ignore_errors=True)
                real.rename(d)

    def __enter__(self) -> Swapper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        # put the real directory back at d, whatever state the last swap left
        d, lnk = self.base / "d", self.base / "lnk"
        self._restore()
        if d.is_symlink() and lnk.is_dir() and not lnk.is_symlink():
            _exchange(str(d), str(lnk))


@pytest.fixture(params=["openat2", "walk"])
def opener(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        if not sandbox_paths.openat2_available():
            pytest.skip("this kernel has no openat2")
    else:
        monkeypatch.setattr(sandbox_paths._openat2, "enabled", False)
    return str(request.param)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # fsync is not what is tested here; without it thousands of writes take a second, not a
    # minute, on a shared disk.
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    outside = tmp_path / "w" / "outside"
    outside.mkdir(parents=True)
    for name in OUTSIDE_NAMES:
        (outside / name).write_text(SECRET + "\n")
    base = (tmp_path / "w" / "base").resolve()
    (base / "d").mkdir(parents=True)
    (base / "d" / "x.txt").write_text("inside\n")
    (base / "c").mkdir()
    (base / "c" / "seed.txt").write_text("seed\n")
    (base / "lnk").symlink_to("../outside", target_is_directory=True)
    return base


def outside_untouched(base: Path) -> None:
    outside = base.parent / "outside"
    assert {p.name for p in outside.iterdir()} == OUTSIDE_NAMES
    for name in OUTSIDE_NAMES:
        assert (outside / name).read_text() == SECRET + "\n", name
    leftovers = [p for p in base.parent.iterdir() if p.name not in ("outside", "base")]
    assert leftovers == [], leftovers


SPECS = {s.name: s for s in TOOLS}


def run_tool(base: Path, tool: str, **raw: str) -> tuple[bool, str, Any]:
    """Run one file tool as the pipeline does: the sandbox resolves every path argument, then
    the handler runs. A refusal or a failure is an outcome; any other exception is a bug."""
    spec = SPECS[tool]
    args: dict[str, Any] = {}
    try:
        for p in spec.params:
            if p.name not in raw:
                continue
            if p.type in ("path", "dir"):
                args[p.name] = sandbox_resolve(base, raw[p.name])
            elif p.type == "integer":
                args[p.name] = int(raw[p.name])
            else:
                args[p.name] = raw[p.name]
        call = Call(tool, "exec_race", args, base, PermissionManager(ROOT_POLICIES), raw=raw)
        handler: Callable[[Call], Any] = spec.handler
        out = handler(call)
    except SecurityError as exc:
        return False, str(exc), None
    except ToolFailure as exc:
        return False, exc.message, None
    return True, out.output, out.data


def operations(i: int) -> list[tuple[str, dict[str, str]]]:
    return [
        ("write_file", {"path": "d/x.txt", "content": f"write {i}\n"}),
        ("write_file", {"path": f"d/new{i % 7}.txt", "content": "new\n"}),
        ("read_file", {"path": "d/x.txt"}),
        ("read_lines", {"path": "d/y.txt", "start": "1"}),
        ("list_dir", {"path": "d"}),
        ("write_in_between", {"path": "d/x.txt", "content": "more", "linebefore": "0"}),
        ("delete_line", {"path": "d/x.txt", "line": "1"}),
        ("copy_file", {"source": "d/x.txt", "destination": f"c/copy{i % 5}.txt"}),
        ("copy_file", {"source": "c/seed.txt", "destination": "d/y.txt"}),
        ("copy_file", {"source": "d", "destination": f"c/tree{i}"}),
        ("move_file", {"source": "d/y.txt", "destination": "c/moved.txt"}),
        ("move_file", {"source": "c/moved.txt", "destination": "d/y.txt"}),
        ("create_dir", {"path": f"d/sub{i % 3}/deeper"}),
        ("delete_file", {"path": f"d/sub{i % 3}"}),
        ("delete_file", {"path": f"d/new{(i + 3) % 7}.txt"}),
        ("delete_file", {"path": "d/secret-name.txt"}),
        ("delete_file", {"path": f"c/tree{i}"}),
    ]


def check_result(tool: str, raw: dict[str, str], ok: bool, text: str, data: Any) -> None:
    assert SECRET not in text, (tool, raw, text)
    if ok and tool == "list_dir":
        assert "secret-name.txt" not in data["entries"], data
    if ok and tool == "read_lines":
        assert all(SECRET not in line for line in data["lines"])


@pytest.mark.parametrize("mode", ["exchange", "rename"])
def test_a_swapped_directory_never_lets_a_tool_reach_outside(
    world: Path, opener: str, mode: str
) -> None:
    base = world
    outcomes = {"ok": 0, "refused": 0}
    rounds = 200  # x 17 operations = 3,400 tool calls
    with Swapper(base, mode) as swapper:
        for i in range(rounds):
            for tool, raw in operations(i):
                ok, text, data = run_tool(base, tool, **raw)
                check_result(tool, raw, ok, text, data)
                outcomes["ok" if ok else "refused"] += 1
    outside_untouched(base)
    # the copies made inside hold only what was inside
    for path in base.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET not in path.read_text(errors="replace"), path
    assert swapper.swaps > 0
    assert outcomes["ok"] > 0


def test_through_the_executer_a_swapped_directory_reaches_nothing_outside(
    world: Path, tmp_path: Path
) -> None:
    base = world
    executer = KyronixExecuter(
        permissions=PermissionManager(ROOT_POLICIES),
        receipts=tmp_path / "receipts.sqlite3",
        continue_on_denial=True,
    )
    calls = [
        ToolCall(tool, raw, f"exec_{i}_{n}")
        for i in range(30)
        for n, (tool, raw) in enumerate(operations(i))
    ]
    with executer, Swapper(base, "exchange"):
        results = executer.execute_sync(serialize(Plan(tuple(calls))), base)
    assert len(results) == len(calls)
    for entry in results:
        result = entry["result"]
        assert SECRET not in result.get("output", "") + result.get("error", "")
        assert "failed unexpectedly" not in result.get("error", ""), result
        if entry["tool"] == "list_dir" and result["success"]:
            assert "secret-name.txt" not in result["data"]["entries"]
    outside_untouched(base)


def test_the_walk_refuses_a_symlink_component_and_says_why(world: Path, opener: str) -> None:
    """Without a race: the state a swap leaves (a checked path whose directory is now a
    symlink) is refused as a change, never followed."""
    base = world
    checked = sandbox_resolve(base, "d/x.txt")
    os.rename(base / "d", base / "d.real")
    (base / "d").symlink_to("../outside", target_is_directory=True)
    with pytest.raises(sandbox_paths.PathChanged, match="symbolic link while it was in use"):
        sandbox_paths.open_beneath(base, checked)
    fd, name = None, None
    with pytest.raises(sandbox_paths.PathChanged):
        fd, name = sandbox_paths.open_parent(base, checked)
    assert fd is None and name is None
    permissions = PermissionManager(ROOT_POLICIES)
    write = Call("write_file", "e1", {"path": checked, "content": "x"}, base, permissions)
    with pytest.raises(SecurityError, match="symbolic link"):
        SPECS["write_file"].handler(write)
    read = Call("read_file", "e2", {"path": checked}, base, permissions)
    with pytest.raises(SecurityError, match="symbolic link"):
        SPECS["read_file"].handler(read)
    outside_untouched(base)


def test_renameat2_is_there_for_the_exchange_swapper(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.write_text("b")
    if not _exchange(str(a), str(b)):
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL, 0):
            pytest.skip("no renameat2(RENAME_EXCHANGE) here")
        raise AssertionError(os.strerror(err))
    assert a.is_file() and b.is_dir()
