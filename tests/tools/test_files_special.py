"""kiso's file tools and the fd layer of the path sandbox on odd files: hard links, setuid
bits, FIFOs and sockets, symlink loops, over-long names; both openat2 and the O_NOFOLLOW walk."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from kiso.tools import EDIT_FILE, READ_FILE, SEARCH_TEXT, WRITE_FILE, Tool, ToolContext, ToolResult
from kiso.tools import paths as sandbox_paths
from kiso.tools.atomic import atomic_write


def call(tool: Tool, ctx: ToolContext, **input: Any) -> ToolResult:
    return asyncio.run(tool.run(input, ctx))


@pytest.fixture(params=["openat2", "walk"])
def opener(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        if not sandbox_paths.openat2_available():
            pytest.skip("this kernel has no openat2")
    else:
        monkeypatch.setattr(sandbox_paths._openat2, "enabled", False)
    return str(request.param)


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return ToolContext(workspace=workspace.resolve(), execution_id="k:1")


def test_writes_replace_a_hard_link_and_never_write_the_shared_inode(
    ctx: ToolContext, tmp_path: Path, opener: str
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("shared\n")
    link = ctx.workspace / "linked.txt"
    os.link(outside, link)
    read = call(READ_FILE, ctx, path="linked.txt")
    assert "shared" in read.content  # read like any file (documented)
    assert not call(WRITE_FILE, ctx, path="linked.txt", content="mine\n").is_error
    assert outside.read_text() == "shared\n" and link.read_text() == "mine\n"
    link.unlink()
    os.link(outside, link)
    edit = call(EDIT_FILE, ctx, path="linked.txt", edits=[{"oldText": "shared", "newText": "e"}])
    assert not edit.is_error, edit.content
    assert outside.read_text() == "shared\n" and link.read_text() == "e\n"
    assert link.stat().st_nlink == 1


def test_rewriting_clears_setuid_and_setgid(ctx: ToolContext, opener: str) -> None:
    target = ctx.workspace / "tool.sh"
    target.write_text("old\n")
    target.chmod(0o6755)
    assert not call(WRITE_FILE, ctx, path="tool.sh", content="new\n").is_error
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    target.chmod(0o2750)
    atomic_write(target, b"again\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o750


@pytest.mark.timeout(60)
def test_fifos_and_sockets_are_never_read_or_searched(ctx: ToolContext, opener: str) -> None:
    os.mkfifo(ctx.workspace / "pipe")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(ctx.workspace / "sock"))
    (ctx.workspace / "text.txt").write_text("needle\n")
    try:
        for name in ("pipe", "sock"):
            result = call(READ_FILE, ctx, path=name)
            assert result.is_error and "not a regular file" in result.content
            with pytest.raises(sandbox_paths.SpecialFile):
                sandbox_paths.open_regular(ctx.workspace, ctx.workspace / name)
        found = call(SEARCH_TEXT, ctx, pattern="needle")
        assert "text.txt:1: needle" in found.content
        refused = call(SEARCH_TEXT, ctx, pattern="x", path="pipe")
        assert refused.is_error and "cannot be searched" in refused.content
    finally:
        sock.close()


def test_a_symlink_loop_and_a_long_name_get_clear_errors(ctx: ToolContext, opener: str) -> None:
    (ctx.workspace / "a").symlink_to("b")
    (ctx.workspace / "b").symlink_to("a")
    for result in (
        call(READ_FILE, ctx, path="a"),
        call(WRITE_FILE, ctx, path="a", content="x"),
    ):
        assert result.is_error and "loops" in result.content, result.content
    assert (ctx.workspace / "a").is_symlink()
    long = "n" * 300
    assert call(READ_FILE, ctx, path=f"d/{long}").is_error  # it does not (cannot) exist
    result = call(WRITE_FILE, ctx, path=f"d/{long}", content="x")
    assert result.is_error and "too long" in result.content, result.content
    assert not (ctx.workspace / "d").exists()


def test_open_beneath_follows_no_symlink_even_inside(workspace: Path, opener: str) -> None:
    root = workspace.resolve()
    (root / "real").mkdir()
    (root / "real" / "f").write_text("x")
    (root / "alias").symlink_to("real")
    fd = sandbox_paths.open_beneath(root, root / "real" / "f")
    assert os.read(fd, 10) == b"x"
    os.close(fd)
    with pytest.raises(sandbox_paths.PathChanged):
        sandbox_paths.open_beneath(root, root / "alias" / "f")
    with pytest.raises(sandbox_paths.PathOutsideWorkspace):
        sandbox_paths.open_beneath(root, root.parent / "elsewhere")
    with pytest.raises(sandbox_paths.PathOutsideWorkspace):
        sandbox_paths.relative_parts(root, str(root) + "/../x")


def test_open_dir_beneath_creates_and_names_a_file_in_the_way(workspace: Path, opener: str) -> None:
    root = workspace.resolve()
    fd = sandbox_paths.open_dir_beneath(root, root / "a" / "b" / "c", create=True)
    os.close(fd)
    assert (root / "a" / "b" / "c").is_dir()
    (root / "file").write_text("")
    with pytest.raises(NotADirectoryError) as info:
        sandbox_paths.open_dir_beneath(root, root / "file" / "sub", create=True)
    assert info.value.filename == str(root / "file")
