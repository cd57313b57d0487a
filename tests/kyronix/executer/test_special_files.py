"""FIFOs, devices, sockets, hard links, setuid bits, symlinks to act on, loops, long names and
big files: the file tools on the filesystem's odd corners, end to end through the executer."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kyronix.executer import KyronixExecuter

from .kmlkit import fail, ok, run


@pytest.fixture
def specials(base: Path) -> Iterator[dict[str, Path]]:
    """A FIFO, a socket and (where mknod is allowed) a character device like /dev/zero."""
    made = {"fifo": base / "pipe"}
    os.mkfifo(made["fifo"])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    made["socket"] = base / "sock"
    sock.bind(str(made["socket"]))
    with contextlib.suppress(PermissionError, OSError):
        os.mknod(base / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
        made["device"] = base / "zero"
    yield made
    sock.close()


KINDS = {"fifo": "FIFO", "socket": "socket", "device": "character device"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read_file", {}),
        ("read_lines", {"start": "1", "end": "3"}),
        ("write_in_between", {"content": "x", "linebefore": "0"}),
        ("delete_line", {"line": "1"}),
        ("modify_line_between", {"content": "x", "startline": "1", "endline": "1"}),
        ("copy_file", {"destination": "copied"}),
    ],
)
def test_special_files_are_refused_at_once(
    *,
    root_executer: KyronixExecuter,
    base: Path,
    specials: dict[str, Path],
    kind: str,
    tool: str,
    args: dict[str, str],
) -> None:
    """A FIFO never blocks a tool (it is opened O_NONBLOCK and refused by fstat), a device
    never streams into a copy."""
    if kind not in specials:
        pytest.skip("mknod is not allowed here")
    name = specials[kind].name
    key = "source" if tool == "copy_file" else "path"
    r = fail(root_executer, base, tool, **{key: name}, **args)
    assert KINDS[kind] in r["error"] and "regular file" in r["error"], r
    assert "unexpectedly" not in r["error"]
    assert not (base / "copied").exists()
    assert stat.S_IFMT(os.lstat(specials[kind]).st_mode) != stat.S_IFREG


def test_copying_a_directory_skips_special_files_and_says_which(
    root_executer: KyronixExecuter, base: Path
) -> None:
    tree = base / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("b")
    (tree / "link").symlink_to("a.txt")
    os.mkfifo(tree / "sub" / "fifo")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tree / "sock"))
    try:
        r = ok(root_executer, base, "copy_file", source="tree", destination="copy")
    finally:
        sock.close()
    assert "skipped 2 special file(s)" in r["output"]
    assert "tree/sub/fifo (a FIFO (named pipe))" in r["output"]
    assert r["data"]["skipped"] == ["tree/sock (a socket)", "tree/sub/fifo (a FIFO (named pipe))"]
    copy = base / "copy"
    assert (copy / "a.txt").read_text() == "a" and (copy / "sub" / "b.txt").read_text() == "b"
    assert os.readlink(copy / "link") == "a.txt"
    assert not (copy / "sub" / "fifo").exists() and not (copy / "sock").exists()
    assert sorted(p.name for p in base.iterdir() if p.name.startswith(".")) == []


def test_a_hard_link_to_an_outside_file_is_read_but_writes_replace_the_link(
    root_executer: KyronixExecuter, base: Path, tmp_path: Path
) -> None:
    """pnpm's store is hard links, so a hard link is read like any file (documented); a write
    replaces the link with a new file and never writes the shared inode."""
    outside = tmp_path / "outside.txt"
    outside.write_text("outside 1\noutside 2\n")
    os.link(outside, base / "linked.txt")
    assert ok(root_executer, base, "read_file", path="linked.txt")["output"] == (
        "outside 1\noutside 2\n"
    )
    for tool, args in (
        ("write_in_between", {"content": "in", "linebefore": "1"}),
        ("modify_line_between", {"content": "x", "startline": "1", "endline": "1"}),
        ("delete_line", {"line": "1"}),
        ("write_file", {"content": "replaced\n"}),
    ):
        ok(root_executer, base, tool, path="linked.txt", **args)
        assert outside.read_text() == "outside 1\noutside 2\n", tool
        assert (base / "linked.txt").stat().st_nlink == 1
        os.unlink(base / "linked.txt")
        os.link(outside, base / "linked.txt")
    (base / "src.txt").write_text("copied\n")
    ok(root_executer, base, "copy_file", source="src.txt", destination="linked.txt")
    assert outside.read_text() == "outside 1\noutside 2\n"
    assert (base / "linked.txt").read_text() == "copied\n"


def test_rewriting_a_file_clears_setuid_and_setgid(
    root_executer: KyronixExecuter, base: Path
) -> None:
    for tool, args in (
        ("write_file", {"content": "new\n"}),
        ("write_in_between", {"content": "x", "linebefore": "0"}),
    ):
        target = base / "tool"
        target.write_text("old\n")
        target.chmod(0o6755)
        ok(root_executer, base, tool, path="tool", **args)
        assert stat.S_IMODE(target.stat().st_mode) == 0o755, tool
    (base / "src").write_text("s")
    (base / "src").chmod(0o4750)
    ok(root_executer, base, "copy_file", source="src", destination="dst")
    assert stat.S_IMODE((base / "dst").stat().st_mode) == 0o750


def test_read_lines_streams_a_file_over_the_read_file_limit(
    root_executer: KyronixExecuter, base: Path
) -> None:
    line = "x" * 99 + "\n"
    count = 11 * 1024 * 1024 // len(line) + 10
    with open(base / "big.log", "w") as f:
        for n in range(count):
            f.write(f"{n:08d}" + line[8:])
    r = fail(root_executer, base, "read_file", path="big.log")
    assert "read_lines" in r["error"] and "start" in r["error"]
    r = ok(root_executer, base, "read_lines", path="big.log", start="5", end="6")
    assert r["data"]["total"] == count and r["data"]["end"] == 6
    assert r["output"].splitlines() == [f"5\t00000004{'x' * 91}", f"6\t00000005{'x' * 91}"]
    r = ok(root_executer, base, "read_lines", path="big.log", start=str(count))
    assert r["data"]["lines"] == [f"{count - 1:08d}" + "x" * 91]
    r = fail(root_executer, base, "write_in_between", path="big.log", content="x", linebefore="0")
    assert "line edits load the whole file" in r["error"]


def test_move_file_of_a_symlink_moves_the_link(root_executer: KyronixExecuter, base: Path) -> None:
    (base / "real.txt").write_text("real")
    (base / "link.txt").symlink_to("real.txt")
    ok(root_executer, base, "move_file", source="link.txt", destination="moved.txt")
    assert (base / "moved.txt").is_symlink() and os.readlink(base / "moved.txt") == "real.txt"
    assert not (base / "link.txt").exists() and (base / "real.txt").read_text() == "real"


def test_delete_file_of_a_symlink_pointing_outside_removes_the_link(
    root_executer: KyronixExecuter, base: Path, tmp_path: Path
) -> None:
    (tmp_path / "target.txt").write_text("keep")
    (base / "out.txt").symlink_to(tmp_path / "target.txt")
    ok(root_executer, base, "delete_file", path="out.txt")
    assert not (base / "out.txt").is_symlink()
    assert (tmp_path / "target.txt").read_text() == "keep"


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read_file", {}),
        ("read_lines", {}),
        ("write_file", {"content": "x"}),
        ("write_in_between", {"content": "x", "linebefore": "0"}),
        ("copy_file", {}),
    ],
)
def test_symlink_loops_and_long_names_get_a_clear_error(
    root_executer: KyronixExecuter, base: Path, tool: str, args: dict[str, str]
) -> None:
    (base / "a").symlink_to("b")
    (base / "b").symlink_to("a")
    key = "source" if tool == "copy_file" else "path"
    extra = {"destination": "dst"} if tool == "copy_file" else {}
    r = run(root_executer, base, tool, **{key: "a"}, **args, **extra)
    assert not r["success"]
    assert "unexpectedly" not in r["error"]
    assert "loop" in r["error"] or "symbolic link" in r["error"], r
    long = "n" * 300
    r = run(root_executer, base, tool, **{key: f"d/{long}"}, **args, **extra)
    assert not r["success"]
    assert "unexpectedly" not in r["error"]
    assert "too long" in r["error"], r


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read_lines", {"start": "٣"}),
        ("write_in_between", {"content": "x", "linebefore": "\u0661"}),
        ("delete_line", {"line": "٣"}),
        ("delete_line", {"line": "1-٣"}),
        ("modify_line_between", {"content": "x", "startline": "1", "endline": "²"}),
    ],
)
def test_line_numbers_are_ascii_digits_only(
    root_executer: KyronixExecuter, base: Path, tool: str, args: dict[str, str]
) -> None:
    (base / "f.txt").write_text("1\n2\n3\n4\n")
    r = fail(root_executer, base, tool, path="f.txt", **args)
    assert r["errorType"] == "InvalidArguments", r
    assert (base / "f.txt").read_text() == "1\n2\n3\n4\n"
