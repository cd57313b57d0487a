"""The eleven filesystem tools, end to end through ``execute_sync`` (real files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kyronix.executer import KyronixExecuter

from .kmlkit import fail, ok


def test_write_read_roundtrip_creates_parents_and_keeps_bytes(
    root_executer: KyronixExecuter, base: Path
) -> None:
    text = "<div>&amp; </content> ]]> é\r\nline2\n"
    r = ok(root_executer, base, "write_file", path="src/a/b.tsx", content=text)
    assert r["data"]["created"] is True
    assert (base / "src/a/b.tsx").read_bytes() == text.encode()
    assert ok(root_executer, base, "read_file", path="src/a/b.tsx")["output"] == text
    r = ok(root_executer, base, "write_file", path="src/a/b.tsx", content="x")
    assert "overwrote" in r["output"]
    assert (base / "src/a/b.tsx").read_text() == "x"
    # no temporary files left beside it
    assert sorted(os.listdir(base / "src/a")) == ["b.tsx"]


def test_write_file_keeps_mode_and_refuses_directory(
    root_executer: KyronixExecuter, base: Path
) -> None:
    script = base / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    ok(root_executer, base, "write_file", path="run.sh", content="new")
    assert script.stat().st_mode & 0o777 == 0o755
    (base / "d").mkdir()
    assert "directory" in fail(root_executer, base, "write_file", path="d", content="x")["error"]
    (base / "f").write_text("")
    r = fail(root_executer, base, "write_file", path="f/child.txt", content="x")
    assert "is a file" in r["error"]


def test_read_file_refuses_binary_missing_and_directories(
    root_executer: KyronixExecuter, base: Path
) -> None:
    (base / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert "binary" in fail(root_executer, base, "read_file", path="img.png")["error"]
    (base / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert "UTF-8" in fail(root_executer, base, "read_file", path="latin1.txt")["error"]
    r = fail(root_executer, base, "read_file", path="nope.txt")
    assert r["errorType"] == "NotFound" and "list_dir" in r["error"]
    (base / "dir").mkdir()
    assert "directory" in fail(root_executer, base, "read_file", path="dir")["error"]


def test_delete_file_and_directory(root_executer: KyronixExecuter, base: Path) -> None:
    (base / "tree/sub").mkdir(parents=True)
    (base / "tree/sub/x.txt").write_text("x")
    (base / "one.txt").write_text("1")
    ok(root_executer, base, "delete_file", path="one.txt")
    assert not (base / "one.txt").exists()
    r = ok(root_executer, base, "delete_file", path="tree")
    assert r["data"]["directory"] is True
    assert not (base / "tree").exists()
    assert fail(root_executer, base, "delete_file", path="tree")["errorType"] == "NotFound"
    r = fail(root_executer, base, "delete_file", path=".")
    assert r["errorType"] == "SecurityError"
    assert base.is_dir()


def test_delete_removes_a_symlink_not_its_target(
    root_executer: KyronixExecuter, base: Path
) -> None:
    (base / "real.txt").write_text("keep")
    (base / "link.txt").symlink_to(base / "real.txt")
    ok(root_executer, base, "delete_file", path="link.txt")
    assert not (base / "link.txt").is_symlink()
    assert (base / "real.txt").read_text() == "keep"


def test_move_and_copy(root_executer: KyronixExecuter, base: Path) -> None:
    (base / "a.txt").write_text("A")
    ok(root_executer, base, "copy_file", source="a.txt", destination="deep/b.txt")
    assert (base / "a.txt").read_text() == "A" and (base / "deep/b.txt").read_text() == "A"
    ok(root_executer, base, "move_file", source="a.txt", destination="moved/c.txt")
    assert not (base / "a.txt").exists() and (base / "moved/c.txt").read_text() == "A"
    # a file may be replaced by a file ...
    (base / "x.txt").write_text("new")
    ok(root_executer, base, "move_file", source="x.txt", destination="deep/b.txt")
    assert (base / "deep/b.txt").read_text() == "new"
    # ... but never a directory, silently
    (base / "y.txt").write_text("y")
    r = fail(root_executer, base, "move_file", source="y.txt", destination="moved")
    assert "existing directory" in r["error"]
    assert (base / "y.txt").exists() and sorted(os.listdir(base / "moved")) == ["c.txt"]
    # directories copy recursively, and cannot go into themselves
    ok(root_executer, base, "copy_file", source="moved", destination="moved2")
    assert (base / "moved2/c.txt").read_text() == "A"
    r = fail(root_executer, base, "move_file", source="moved", destination="moved/inner")
    assert "into itself" in r["error"]


def test_list_dir_sorted_with_dir_slashes(root_executer: KyronixExecuter, base: Path) -> None:
    for name in ("b.txt", "A.md", "c"):
        (base / name).write_text("")
    (base / "zdir").mkdir()
    (base / "adir").mkdir()
    r = ok(root_executer, base, "list_dir", path=".")
    assert r["output"].splitlines() == ["A.md", "adir/", "b.txt", "c", "zdir/"]
    assert r["data"]["entries"] == ["A.md", "adir/", "b.txt", "c", "zdir/"]
    assert fail(root_executer, base, "list_dir", path="b.txt")["error"]


def test_create_dir_is_mkdir_p(root_executer: KyronixExecuter, base: Path) -> None:
    ok(root_executer, base, "create_dir", path="a/b/c")
    assert (base / "a/b/c").is_dir()
    assert ok(root_executer, base, "create_dir", path="a/b")["data"]["created"] is False
    (base / "file").write_text("")
    assert "is a file" in fail(root_executer, base, "create_dir", path="file")["error"]


@pytest.mark.parametrize(
    ("before", "after", "content", "expected"),
    [
        ("a\nb\nc\n", 0, "top\n", "top\na\nb\nc\n"),
        ("a\nb\nc\n", 1, "x\ny", "a\nx\ny\nb\nc\n"),
        ("a\nb\nc\n", 3, "end\n", "a\nb\nc\nend\n"),
        # no final newline: the file still ends without one
        ("a\nb", 2, "z\n", "a\nb\nz"),
        # CRLF files stay CRLF, whatever the content used
        ("a\r\nb\r\n", 1, "m1\nm2\n", "a\r\nm1\r\nm2\r\nb\r\n"),
        ("", 0, "only\n", "only\n"),
    ],
)
def test_write_in_between(
    *,
    root_executer: KyronixExecuter,
    base: Path,
    before: str,
    after: int,
    content: str,
    expected: str,
) -> None:
    (base / "f.txt").write_bytes(before.encode())
    ok(
        root_executer,
        base,
        "write_in_between",
        path="f.txt",
        content=content,
        linebefore=str(after),
    )
    assert (base / "f.txt").read_bytes() == expected.encode()


def test_write_in_between_out_of_range(root_executer: KyronixExecuter, base: Path) -> None:
    (base / "f.txt").write_text("a\nb\n")
    r = fail(root_executer, base, "write_in_between", path="f.txt", content="x", linebefore="3")
    assert "between 0" in r["error"] and "2" in r["error"]
    assert (base / "f.txt").read_text() == "a\nb\n"
    r = fail(root_executer, base, "write_in_between", path="f.txt", content="x", linebefore="two")
    assert r["errorType"] == "InvalidArguments" and "whole number" in r["error"]


def test_modify_line_between_inclusive(root_executer: KyronixExecuter, base: Path) -> None:
    (base / "f.txt").write_bytes(b"1\r\n2\r\n3\r\n4")
    ok(
        root_executer,
        base,
        "modify_line_between",
        path="f.txt",
        content="two\nthree\nextra",
        startline="2",
        endline="3",
    )
    assert (base / "f.txt").read_bytes() == b"1\r\ntwo\r\nthree\r\nextra\r\n4"
    ok(root_executer, base, "modify_line_between", path="f.txt", content="LAST", startline="5",
       endline="5")  # fmt: skip
    assert (base / "f.txt").read_bytes() == b"1\r\ntwo\r\nthree\r\nextra\r\nLAST"
    r = fail(root_executer, base, "modify_line_between", path="f.txt", content="x", startline="0",
             endline="1")  # fmt: skip
    assert "numbered from 1" in r["error"]
    fail(root_executer, base, "modify_line_between", path="f.txt", content="x", startline="3",
         endline="9")  # fmt: skip
    assert (base / "f.txt").read_bytes() == b"1\r\ntwo\r\nthree\r\nextra\r\nLAST"


def test_delete_line_single_and_range(root_executer: KyronixExecuter, base: Path) -> None:
    (base / "f.txt").write_text("1\n2\n3\n4\n5\n")
    ok(root_executer, base, "delete_line", path="f.txt", line="2")
    assert (base / "f.txt").read_text() == "1\n3\n4\n5\n"
    ok(root_executer, base, "delete_line", path="f.txt", line="2-3")
    assert (base / "f.txt").read_text() == "1\n5\n"
    ok(root_executer, base, "delete_line", path="f.txt", line="2")
    assert (base / "f.txt").read_text() == "1\n"
    assert "range" in fail(root_executer, base, "delete_line", path="f.txt", line="x")["error"]
    fail(root_executer, base, "delete_line", path="f.txt", line="4")
    # deleting the last line of a file without a final newline keeps it without one
    (base / "g.txt").write_text("a\nb\nc")
    ok(root_executer, base, "delete_line", path="g.txt", line="3")
    assert (base / "g.txt").read_text() == "a\nb"


def test_read_lines_numbered_and_clamped(root_executer: KyronixExecuter, base: Path) -> None:
    (base / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 13)))
    r = ok(root_executer, base, "read_lines", path="f.txt", start="9", end="99")
    assert r["output"].splitlines() == [" 9\tline 9", "10\tline 10", "11\tline 11", "12\tline 12"]
    assert (r["data"]["start"], r["data"]["end"], r["data"]["total"]) == (9, 12, 12)
    assert (
        "past the end" in fail(root_executer, base, "read_lines", path="f.txt", start="13")["error"]
    )
    r = fail(root_executer, base, "read_lines", path="f.txt", start="5", end="2")
    assert "before start" in r["error"]


def test_results_have_the_documented_shape(root_executer: KyronixExecuter, base: Path) -> None:
    text = (
        '<tool name="write_file" executionId="w1"><path>src/x.ts</path>'
        "<content>export {}</content></tool>"
    )
    [entry] = root_executer.execute_sync(text, base)
    assert set(entry) == {"tool", "args", "result"}
    assert entry["tool"] == "write_file"
    assert entry["args"] == {"path": str(base / "src/x.ts"), "content": "export {}"}
    result = entry["result"]
    assert result["success"] is True and result["executionId"] == "w1"
    assert isinstance(result["output"], str) and isinstance(result["ms"], int)
