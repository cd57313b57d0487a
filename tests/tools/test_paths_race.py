"""kiso's file tools on the one path sandbox, under a concurrent swap of ``ws/d`` (a real
directory) with a symlink to a directory outside the workspace: thousands of reads, writes,
edits, listings and searches, and nothing outside is read, listed, written or created.

Every check is a safety property that must hold for every interleaving; the swapper only makes
the bad ones likely. Both ways of opening beneath the root run: openat2 and the O_NOFOLLOW walk.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from kiso.tools import (
    EDIT_FILE,
    LIST_DIR,
    READ_FILE,
    SEARCH_TEXT,
    WRITE_FILE,
    Tool,
    ToolContext,
    ToolResult,
)
from kiso.tools import paths as sandbox_paths

SECRET = "SECRET-OUTSIDE"
OUTSIDE = {"x.txt": SECRET + "\n", "secret-name.txt": SECRET + "\n"}
_libc = ctypes.CDLL(None, use_errno=True)


def _exchange(a: Path, b: Path) -> bool:
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        return False
    return bool(renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0)  # EXCHANGE


@pytest.fixture(params=["openat2", "walk"])
def opener(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        if not sandbox_paths.openat2_available():
            pytest.skip("this kernel has no openat2")
    else:
        monkeypatch.setattr(sandbox_paths._openat2, "enabled", False)
    return str(request.param)


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # not what is tested; keeps it quick
    outside = tmp_path / "outside"
    outside.mkdir()
    for name, text in OUTSIDE.items():
        (outside / name).write_text(text)
    root = (tmp_path / "ws").resolve()
    (root / "d").mkdir(parents=True)
    (root / "d" / "x.txt").write_text("inside\n")
    (root / "lnk").symlink_to("../outside", target_is_directory=True)
    a, b = root / "d", root / "lnk"
    if not _exchange(a, b) or not _exchange(a, b):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    return root


def call(tool: Tool, ctx: ToolContext, **input: Any) -> tuple[bool, str]:
    result = tool.execute(input, ctx)
    assert isinstance(result, ToolResult)
    return not result.is_error, result.content


def test_a_swapped_directory_never_lets_a_kiso_tool_reach_outside(ws: Path, opener: str) -> None:
    ctx = ToolContext(workspace=ws, execution_id="k1:1")
    stop = threading.Event()
    swaps = [0]

    def swapper() -> None:
        while not stop.is_set():
            if _exchange(ws / "d", ws / "lnk") and _exchange(ws / "d", ws / "lnk"):
                swaps[0] += 1

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    done = 0
    try:
        for i in range(400):  # x 7 = 2,800 tool calls
            for tool, input in (
                (WRITE_FILE, {"path": "d/x.txt", "content": f"inside {i}\n"}),
                (WRITE_FILE, {"path": f"d/new{i % 5}/n.txt", "content": "new\n"}),
                (READ_FILE, {"path": "d/x.txt"}),
                (EDIT_FILE, {"path": "d/x.txt", "edits": [{"oldText": "inside", "newText": "in"}]}),
                (LIST_DIR, {"path": "d"}),
                (SEARCH_TEXT, {"pattern": "SECRET|in", "path": "d"}),
                (SEARCH_TEXT, {"pattern": "SECRET", "path": "."}),
            ):
                ok, text = call(tool, ctx, **input)
                assert SECRET not in text, (tool.name, input, text)
                assert "secret-name.txt" not in text, (tool.name, text)
                done += ok
    finally:
        stop.set()
        thread.join(10)
    outside = ws.parent / "outside"
    assert {p.name: p.read_text() for p in outside.iterdir()} == OUTSIDE
    assert sorted(p.name for p in ws.parent.iterdir()) == ["outside", "ws"]
    assert swaps[0] > 0 and done > 0


def test_kiso_tools_refuse_a_checked_path_that_became_a_symlink(ws: Path, opener: str) -> None:
    """The state a swap leaves between the check and the use, without a race."""
    checked = sandbox_paths.resolve_in_workspace(ws, "d/x.txt")
    os.rename(ws / "d", ws / "d.real")
    (ws / "d").symlink_to("../outside", target_is_directory=True)
    with pytest.raises(sandbox_paths.PathChanged):
        sandbox_paths.open_regular(ws, checked)
    with pytest.raises(sandbox_paths.PathChanged):
        sandbox_paths.open_parent(ws, checked, create=True)
    assert {p.name: p.read_text() for p in (ws.parent / "outside").iterdir()} == OUTSIDE
