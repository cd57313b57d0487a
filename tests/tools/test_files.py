"""The five file tools on real files: windows, revisions, sandboxing, atomic writes, true totals."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from kiso.tools import (
    EDIT_FILE,
    LIST_DIR,
    READ_FILE,
    SEARCH_TEXT,
    WRITE_FILE,
    Tool,
    ToolContext,
    ToolResult,
    builtin_tools,
)


def call(tool: Tool, ctx: ToolContext, **input: Any) -> ToolResult:
    return asyncio.run(tool.run(input, ctx))


def rev(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def lines_file(path: Path, count: int) -> bytes:
    data = "".join(f"line {n}\n" for n in range(1, count + 1)).encode()
    path.write_bytes(data)
    return data


def tree(root: Path) -> set[str]:
    """Every path under ``root``, relative, so a test can prove nothing else was created."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return ToolContext(workspace=workspace, execution_id="k9:1")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("needle secret\n")
    return out


# --- the set -----------------------------------------------------------------------------------


def test_builtin_tools_are_the_six_in_order_with_valid_strict_schemas() -> None:
    tools = builtin_tools()
    assert [t.name for t in tools] == [
        "read_file",
        "list_dir",
        "search_text",
        "write_file",
        "edit_file",
        "shell",
    ]
    assert [t.effects.value for t in tools] == ["read", "read", "read", "edit", "edit", "shell"]
    assert WRITE_FILE.idempotent and WRITE_FILE.rerunnable
    assert not EDIT_FILE.idempotent
    for tool in tools:
        Draft202012Validator.check_schema(tool.parameters)
        assert tool.parameters["additionalProperties"] is False
        assert len(tool.description) > 100
    edits = EDIT_FILE.parameters["properties"]["edits"]
    assert (edits["minItems"], edits["maxItems"]) == (1, 50)
    assert edits["items"]["additionalProperties"] is False
    assert builtin_tools() is not tools


# --- read_file ---------------------------------------------------------------------------------


def test_read_file_windows_continue_exactly_and_end_with_the_revision(ctx: ToolContext) -> None:
    data = lines_file(ctx.workspace / "big.txt", 450)
    first = call(READ_FILE, ctx, path="big.txt")
    body = first.content.splitlines()
    assert not first.is_error
    assert body[0] == "     1\tline 1"
    assert body[199] == "   200\tline 200"
    assert body[200:] == ["[lines 1-200 of 450; continue with offset=201]", f"[rev:{rev(data)}]"]
    second = call(READ_FILE, ctx, path="big.txt", offset=201).content.splitlines()
    assert second[0] == "   201\tline 201"
    assert second[200] == "[lines 201-400 of 450; continue with offset=401]"
    last = call(READ_FILE, ctx, path="big.txt", offset=401).content.splitlines()
    assert len(last) == 52
    assert last[49] == "   450\tline 450"
    assert last[50] == "[lines 401-450 of 450 (end of file)]"
    small = call(READ_FILE, ctx, path="big.txt", offset=10, limit=3).content.splitlines()
    assert small == [
        "    10\tline 10",
        "    11\tline 11",
        "    12\tline 12",
        "[lines 10-12 of 450; continue with offset=13]",
        f"[rev:{rev(data)}]",
    ]


def test_read_file_a_whole_small_file_and_an_empty_one(ctx: ToolContext) -> None:
    (ctx.workspace / "s.txt").write_bytes(b"a\nb\r\nlast without newline")
    content = call(READ_FILE, ctx, path="s.txt").content
    assert content.splitlines()[:4] == [
        "     1\ta",
        "     2\tb",
        "     3\tlast without newline",
        "[lines 1-3 of 3 (end of file)]",
    ]
    (ctx.workspace / "empty.txt").write_bytes(b"")
    assert (
        call(READ_FILE, ctx, path="empty.txt").content == f"[empty file: 0 lines]\n[rev:{rev(b'')}]"
    )


def test_read_file_an_offset_past_the_end_says_so(ctx: ToolContext) -> None:
    lines_file(ctx.workspace / "f.txt", 12)
    result = call(READ_FILE, ctx, path="f.txt", offset=50)
    assert not result.is_error
    assert "offset 50 is past the end of the file: it has 12 lines" in result.content


def test_read_file_cuts_long_lines_with_a_marker(ctx: ToolContext) -> None:
    (ctx.workspace / "wide.txt").write_text("x" * 5000 + "\nshort\n")
    first, second = call(READ_FILE, ctx, path="wide.txt").content.splitlines()[:2]
    assert first == "     1\t" + "x" * 2000 + " [... line cut at 2,000 of 5,000 chars]"
    assert second == "     2\tshort"


def test_read_file_refusals_are_error_results(ctx: ToolContext, outside: Path) -> None:
    (ctx.workspace / "dir").mkdir()
    (ctx.workspace / "blob.bin").write_bytes(b"PK\x03\x04\x00\x00binary")
    (ctx.workspace / "escape").symlink_to(outside / "secret.txt")
    cases = {
        "dir": "use list_dir",
        "blob.bin": "binary",
        "nope/missing.txt": "'nope/missing.txt' does not exist",
        "../outside/secret.txt": "outside the workspace",
        "escape": "outside the workspace",
        str(outside / "secret.txt"): "outside the workspace",
    }
    for path, expected in cases.items():
        result = call(READ_FILE, ctx, path=path)
        assert result.is_error, path
        assert result.error_kind == "invalid_input", path
        assert expected in result.content, (path, result.content)
        assert "secret" not in result.content.replace("secret.txt", ""), path


@pytest.mark.parametrize(
    "bad", [{"path": 3}, {"path": "f.txt", "offset": "x"}, {"path": "f.txt", "limit": 5000}, {}]
)
def test_read_file_odd_input_is_an_error_result(ctx: ToolContext, bad: dict[str, Any]) -> None:
    lines_file(ctx.workspace / "f.txt", 3)
    result = call(READ_FILE, ctx, **bad)
    assert result.is_error
    assert result.error_kind == "invalid_input"


def test_read_file_refuses_a_fifo_instead_of_blocking_on_it(ctx: ToolContext) -> None:
    os.mkfifo(ctx.workspace / "pipe")
    result = call(READ_FILE, ctx, path="pipe")
    assert result.is_error
    assert "not a regular file" in result.content
    # search_text walks past it too (opening it would block forever).
    assert call(SEARCH_TEXT, ctx, pattern="x").content == "[no matches in 0 files searched]"


# --- list_dir ----------------------------------------------------------------------------------


def test_list_dir_is_a_sorted_tree_that_does_not_descend_into_heavy_dirs(ctx: ToolContext) -> None:
    ws = ctx.workspace
    for rel in ("src/pkg/mod.py", "src/a.py", "b.txt", ".git/objects/ab", "node_modules/x/i.js"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text("x")
    (ws / ".venv").mkdir()
    (ws / "src" / "__pycache__").mkdir()
    assert call(LIST_DIR, ctx).content.splitlines() == [
        "./",
        "  .git/ [not expanded]",
        "  .venv/ [not expanded]",
        "  b.txt",
        "  node_modules/ [not expanded]",
        "  src/",
        "    __pycache__/ [not expanded]",
        "    a.py",
        "    pkg/",
        "[8 entries]",
    ]
    deeper = call(LIST_DIR, ctx, path="src", depth=5).content.splitlines()
    assert deeper == [
        "src/",
        "  __pycache__/ [not expanded]",
        "  a.py",
        "  pkg/",
        "    mod.py",
        "[4 entries]",
    ]
    assert call(LIST_DIR, ctx, depth=1).content.splitlines()[-1] == "[5 entries]"


def test_list_dir_caps_at_500_with_the_true_total_shallowest_first(ctx: ToolContext) -> None:
    for d in range(30):
        sub = ctx.workspace / f"d{d:02}"
        sub.mkdir()
        for f in range(20):
            (sub / f"f{f:02}.txt").write_text("")
    lines = call(LIST_DIR, ctx).content.splitlines()
    assert lines[-1].startswith("[showing 500 of 630 entries")
    assert len(lines) == 502
    assert all(f"  d{d:02}/" in lines for d in range(30))


def test_list_dir_shows_symlinks_without_following_them(ctx: ToolContext, outside: Path) -> None:
    (ctx.workspace / "out").symlink_to(outside, target_is_directory=True)
    content = call(LIST_DIR, ctx, depth=3).content
    assert f"  out -> {outside}" in content
    assert "secret.txt" not in content
    refused = call(LIST_DIR, ctx, path="out")
    assert refused.is_error
    assert refused.error_kind == "invalid_input"


def test_list_dir_refusals(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text("x")
    for path, expected in {
        "f.txt": "use read_file",
        "missing": "does not exist",
        "..": "outside the workspace",
    }.items():
        result = call(LIST_DIR, ctx, path=path)
        assert result.is_error
        assert expected in result.content
    assert call(LIST_DIR, ctx, depth=9).error_kind == "invalid_input"


# --- search_text -------------------------------------------------------------------------------


def test_search_text_reports_path_line_and_text(ctx: ToolContext) -> None:
    ws = ctx.workspace
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("import os\ndef Needle():\n    return 1\n")
    (ws / "b.md").write_text("a needle here\nnothing\n")
    (ws / "bin.dat").write_bytes(b"needle\x00needle\n")
    for skipped in (".git", "node_modules", ".venv", "__pycache__"):
        (ws / skipped).mkdir()
        (ws / skipped / "x.py").write_text("needle\n")
    assert call(SEARCH_TEXT, ctx, pattern="needle").content.splitlines() == [
        "b.md:1: a needle here",
        "[1 match in 1 file; 1 binary file skipped]",
    ]
    insensitive = call(SEARCH_TEXT, ctx, pattern=r"needle\b", case_sensitive=False)
    assert insensitive.content.splitlines()[:2] == [
        "b.md:1: a needle here",
        "src/a.py:2: def Needle():",
    ]
    assert insensitive.content.splitlines()[2].startswith("[2 matches in 2 files")
    only_py = call(SEARCH_TEXT, ctx, pattern="(?i)needle", glob="*.py").content
    assert only_py.splitlines()[0] == "src/a.py:2: def Needle():"
    braces = call(SEARCH_TEXT, ctx, pattern="(?i)needle", glob="*.{md,py}").content
    assert braces.splitlines()[-1].startswith("[2 matches in 2 files")
    nested = call(SEARCH_TEXT, ctx, pattern="(?i)needle", glob="src/**/*.py").content
    assert nested.splitlines()[0] == "src/a.py:2: def Needle():"
    in_one_file = call(SEARCH_TEXT, ctx, pattern="return", path="src/a.py").content
    assert in_one_file.splitlines()[0] == "src/a.py:3:     return 1"


def test_search_text_caps_with_true_totals(ctx: ToolContext) -> None:
    for n in range(10):
        (ctx.workspace / f"f{n}.txt").write_text("hit\n" * 50 + "miss\n")
    result = call(SEARCH_TEXT, ctx, pattern="^hit$", max_results=20)
    lines = result.content.splitlines()
    assert len(lines) == 21
    assert lines[0] == "f0.txt:1: hit"
    assert lines[-1] == "[showing 20 of 500 matches in 10 files]"
    none = call(SEARCH_TEXT, ctx, pattern="absent")
    assert none.content == "[no matches in 10 files searched]"
    assert not none.is_error


def test_search_text_cuts_long_lines_around_the_match(ctx: ToolContext) -> None:
    (ctx.workspace / "wide.txt").write_text("a" * 1000 + "TARGET" + "b" * 1000 + "\n")
    line = call(SEARCH_TEXT, ctx, pattern="TARGET").content.splitlines()[0]
    text = line.removeprefix("wide.txt:1: ")
    assert "TARGET" in text
    assert text.startswith("[...]")
    assert text.endswith("[...]")
    assert len(text) == 300 + 10


def test_search_text_never_reads_outside_through_symlinks(ctx: ToolContext, outside: Path) -> None:
    (ctx.workspace / "leak.txt").symlink_to(outside / "secret.txt")
    (ctx.workspace / "leakdir").symlink_to(outside, target_is_directory=True)
    (ctx.workspace / "inside.txt").write_text("needle inside\n")
    (ctx.workspace / "alias.txt").symlink_to(ctx.workspace / "inside.txt")
    content = call(SEARCH_TEXT, ctx, pattern="needle").content
    assert "secret" not in content
    assert content.splitlines() == [
        "alias.txt:1: needle inside",
        "inside.txt:1: needle inside",
        "[2 matches in 2 files]",
    ]
    refused = call(SEARCH_TEXT, ctx, pattern="needle", path="leakdir")
    assert refused.error_kind == "invalid_input"


def test_search_text_an_invalid_regex_names_the_problem(ctx: ToolContext) -> None:
    result = call(SEARCH_TEXT, ctx, pattern="foo(")
    assert result.is_error
    assert result.error_kind == "invalid_input"
    assert "invalid regular expression 'foo('" in result.content
    assert "missing )" in result.content


# --- write_file --------------------------------------------------------------------------------


def test_write_file_creates_parents_and_writes_exact_bytes(ctx: ToolContext) -> None:
    content = "héllo\nwörld\n"
    result = call(WRITE_FILE, ctx, path="new/deep/file.txt", content=content)
    data = content.encode()
    assert result == ToolResult(f"wrote {len(data)} bytes to new/deep/file.txt [rev:{rev(data)}]")
    assert (ctx.workspace / "new" / "deep" / "file.txt").read_bytes() == data
    assert tree(ctx.workspace) == {"new", "new/deep", "new/deep/file.txt"}


def test_write_file_replaces_atomically_keeping_the_mode(ctx: ToolContext) -> None:
    target = ctx.workspace / "run.sh"
    target.write_text("old")
    target.chmod(0o750)
    call(WRITE_FILE, ctx, path="run.sh", content="#!/bin/sh\necho new\n")
    assert target.read_text() == "#!/bin/sh\necho new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert tree(ctx.workspace) == {"run.sh"}


def test_write_file_a_new_file_follows_the_umask(ctx: ToolContext) -> None:
    old = os.umask(0o027)
    try:
        call(WRITE_FILE, ctx, path="f.txt", content="x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((ctx.workspace / "f.txt").stat().st_mode) == 0o640


def test_write_file_through_an_inside_symlink_writes_its_target(ctx: ToolContext) -> None:
    (ctx.workspace / "real.txt").write_text("old")
    (ctx.workspace / "alias.txt").symlink_to(ctx.workspace / "real.txt")
    result = call(WRITE_FILE, ctx, path="alias.txt", content="new")
    assert result.content.startswith("wrote 3 bytes to real.txt")
    assert (ctx.workspace / "alias.txt").is_symlink()
    assert (ctx.workspace / "real.txt").read_text() == "new"


def test_write_file_refuses_escapes_and_leaves_outside_untouched(
    ctx: ToolContext, outside: Path
) -> None:
    (ctx.workspace / "file-link").symlink_to(outside / "secret.txt")
    (ctx.workspace / "dir-link").symlink_to(outside, target_is_directory=True)
    (ctx.workspace / "dangling").symlink_to(outside / "planted.txt")
    for path in ("file-link", "dir-link/secret.txt", "dir-link/new.txt", "dangling", "../x.txt"):
        result = call(WRITE_FILE, ctx, path=path, content="pwned")
        assert result.is_error, path
        assert result.error_kind == "invalid_input", path
    assert tree(outside) == {"secret.txt"}
    assert (outside / "secret.txt").read_text() == "needle secret\n"
    assert not (ctx.workspace.parent / "x.txt").exists()


def test_write_file_refuses_a_directory_and_a_file_in_the_way(ctx: ToolContext) -> None:
    (ctx.workspace / "dir").mkdir()
    (ctx.workspace / "plain").write_text("x")
    assert "is a directory" in call(WRITE_FILE, ctx, path="dir", content="x").content
    blocked = call(WRITE_FILE, ctx, path="plain/child.txt", content="x")
    assert blocked.is_error
    assert "plain" in blocked.content
    assert (ctx.workspace / "plain").read_text() == "x"


def test_a_failed_atomic_write_leaves_the_file_and_no_temp(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = ctx.workspace / "keep.txt"
    target.write_text("original")

    def broken_rename(src: object, dst: object, **_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "rename", broken_rename)
    result = call(WRITE_FILE, ctx, path="keep.txt", content="new content")
    assert result.is_error
    assert "No space left on device" in result.content
    assert target.read_text() == "original"
    assert tree(ctx.workspace) == {"keep.txt"}


# --- edit_file ---------------------------------------------------------------------------------


def read_rev(ctx: ToolContext, path: str) -> str:
    trailer = call(READ_FILE, ctx, path=path).content.splitlines()[-1]
    assert trailer.startswith("[rev:")
    return trailer.removeprefix("[rev:").removesuffix("]")


def test_edit_file_applies_edits_in_order_and_returns_the_new_revision(ctx: ToolContext) -> None:
    target = ctx.workspace / "m.py"
    target.write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    target.chmod(0o644)
    result = call(
        EDIT_FILE,
        ctx,
        path="m.py",
        edits=[
            {"oldText": "    return 1\n", "newText": "    x = 1\n    y = 2\n    return x + y\n"},
            {"oldText": "x + y", "newText": "x * y"},  # applies to the result of the first
            {"oldText": "\n\ndef g():\n    return 2\n", "newText": ""},
        ],
        expectedRevision=read_rev(ctx, "m.py"),
    )
    new = b"def f():\n    x = 1\n    y = 2\n    return x * y\n"
    assert target.read_bytes() == new
    assert result == ToolResult(f"edited m.py: 3 edits, +3 -5 lines [rev:{rev(new)}]")
    assert read_rev(ctx, "m.py") == rev(new)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert tree(ctx.workspace) == {"m.py"}


def test_edit_file_accepts_the_revision_in_the_forms_read_file_shows(ctx: ToolContext) -> None:
    """The bare value, 'rev:...', the whole trailer; a blank one counts as not given."""
    (ctx.workspace / "f.txt").write_text("one\ntwo\n")
    for n, form in enumerate(["{}", "rev:{}", "[rev:{}]", "  "]):
        result = call(
            EDIT_FILE,
            ctx,
            path="f.txt",
            edits=[{"oldText": "two" + "!" * n, "newText": "two" + "!" * (n + 1)}],
            expectedRevision=form.format(read_rev(ctx, "f.txt")),
        )
        assert not result.is_error, result.content
    assert (ctx.workspace / "f.txt").read_text() == "one\ntwo!!!!\n"


def test_edit_file_refuses_a_stale_revision_and_writes_nothing(ctx: ToolContext) -> None:
    target = ctx.workspace / "f.txt"
    target.write_text("alpha\nbeta\n")
    seen = read_rev(ctx, "f.txt")
    target.write_text("alpha\nbeta\ngamma\n")  # someone else changed it
    before = target.read_bytes()
    result = call(
        EDIT_FILE,
        ctx,
        path="f.txt",
        edits=[{"oldText": "beta", "newText": "BETA"}],
        expectedRevision=seen,
    )
    assert result.is_error
    assert result.error_kind == "precondition"
    assert "changed since it was read" in result.content
    assert "read the file again" in result.content.lower()
    assert target.read_bytes() == before
    assert tree(ctx.workspace) == {"f.txt"}


def test_edit_file_ambiguous_old_text_is_refused(ctx: ToolContext) -> None:
    target = ctx.workspace / "f.txt"
    target.write_text("x = 1\ny = 2\nx = 1\n")
    result = call(EDIT_FILE, ctx, path="f.txt", edits=[{"oldText": "x = 1", "newText": "x = 3"}])
    assert result.is_error
    assert result.error_kind == "invalid_input"
    assert "matches 2 places (starting on lines 1, 3)" in result.content
    assert "more surrounding text" in result.content
    assert target.read_text() == "x = 1\ny = 2\nx = 1\n"


def test_edit_file_missing_old_text_quotes_it_and_suggests_reading_again(ctx: ToolContext) -> None:
    target = ctx.workspace / "f.txt"
    target.write_text("hello world\n")
    missing = "this text is not in the file at all and it goes on for quite a while longer"
    result = call(EDIT_FILE, ctx, path="f.txt", edits=[{"oldText": missing, "newText": "x"}])
    assert result.is_error
    assert repr(missing[:60]) + "..." in result.content
    assert "read the file again with read_file" in result.content
    assert target.read_text() == "hello world\n"


def test_edit_file_writes_nothing_unless_every_edit_applies(ctx: ToolContext) -> None:
    target = ctx.workspace / "f.txt"
    target.write_text("a\nb\nc\n")
    result = call(
        EDIT_FILE,
        ctx,
        path="f.txt",
        edits=[{"oldText": "a\n", "newText": "A\n"}, {"oldText": "zzz", "newText": "y"}],
    )
    assert result.is_error
    assert "edit 2 of 2" in result.content
    assert target.read_text() == "a\nb\nc\n"


def test_edit_file_keeps_crlf_and_bytes_that_are_not_utf8(ctx: ToolContext) -> None:
    target = ctx.workspace / "win.txt"
    target.write_bytes(b"caf\xe9\r\nfirst\r\nsecond\r\n")
    result = call(
        EDIT_FILE, ctx, path="win.txt", edits=[{"oldText": "first\nsecond", "newText": "1\n2"}]
    )
    assert not result.is_error, result.content
    assert target.read_bytes() == b"caf\xe9\r\n1\r\n2\r\n"


@pytest.mark.parametrize(
    "edits",
    [
        [],
        "not a list",
        [{"oldText": "", "newText": "x"}],
        [{"oldText": "a", "newText": "a"}],
        [{"oldText": "a"}],
        [["a", "b"]],
        [{"oldText": "a", "newText": "b"}] * 51,
    ],
)
def test_edit_file_odd_edits_are_error_results(ctx: ToolContext, edits: object) -> None:
    (ctx.workspace / "f.txt").write_text("a\n")
    result = call(EDIT_FILE, ctx, path="f.txt", edits=edits)
    assert result.is_error
    assert result.error_kind == "invalid_input"
    assert (ctx.workspace / "f.txt").read_text() == "a\n"


def test_edit_file_refuses_escapes_directories_and_missing_files(
    ctx: ToolContext, outside: Path
) -> None:
    (ctx.workspace / "link").symlink_to(outside / "secret.txt")
    (ctx.workspace / "dir").mkdir()
    edit = [{"oldText": "needle", "newText": "pwned"}]
    for path, expected in {
        "link": "outside the workspace",
        "../outside/secret.txt": "outside the workspace",
        "dir": "is a directory",
        "missing.txt": "'missing.txt' does not exist",
    }.items():
        result = call(EDIT_FILE, ctx, path=path, edits=edit)
        assert result.is_error
        assert expected in result.content
    assert (outside / "secret.txt").read_text() == "needle secret\n"
