"""Hostile paths and plans: every one is refused with a clear error, and the filesystem outside
the base is byte-for-byte what it was (checked on disk, not from the return value).

The layout each case runs in::

    tmp/
      outside/secret.txt            TOP-SECRET content, a subdir, a victim file
      project-evil/victim.txt        a sibling whose name starts with the base's name
      project/                       the base
        escape -> ../outside         a symlinked directory leaving the base
        secret_link -> ../outside/secret.txt
        dangling -> ../outside/created-through-dangling-link
        inner/ok.txt

Network and git cases live with their tools' own hostile corpora in test_http.py, test_net.py
and test_git.py; the ones here go through the whole executer (KML in, results out).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kyronix.executer import ROOT_POLICIES, SAFE_POLICIES, KyronixExecuter, PermissionManager

from .kmlkit import kml

SECRET = "TOP-SECRET-3f9a"


def _layout(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.txt").write_text(f"{SECRET}\nline 2\n")
    (outside / "victim.txt").write_text("victim\n")
    (tmp_path / "project-evil").mkdir()
    (tmp_path / "project-evil/victim.txt").write_text("evil victim\n")
    base = tmp_path / "project"
    (base / "inner").mkdir(parents=True)
    (base / "inner/ok.txt").write_text("ok\n")
    (base / "escape").symlink_to("../outside")
    (base / "secret_link").symlink_to("../outside/secret.txt")
    (base / "dangling").symlink_to("../outside/created-through-dangling-link")
    (base / "inner/up").symlink_to("..")  # stays inside: inner/up -> project
    return base.resolve()


def _snapshot(tmp_path: Path) -> dict[str, Any]:
    """Everything under tmp_path except the base itself and the executer's own files."""
    seen: dict[str, Any] = {}
    for root, dirs, files in os.walk(tmp_path):
        rel_root = os.path.relpath(root, tmp_path)
        if rel_root.split(os.sep)[0] in ("project", "kyronix-home"):
            continue
        for name in sorted(dirs + files):
            full = os.path.join(root, name)
            rel = os.path.normpath(os.path.join(rel_root, name))
            if rel.startswith(("project", "receipts.", "kyronix-home")):
                continue
            st = os.lstat(full)
            if os.path.islink(full):
                seen[rel] = ("link", os.readlink(full))
            elif os.path.isdir(full):
                seen[rel] = ("dir", st.st_mode)
            else:
                with open(full, "rb") as f:
                    seen[rel] = ("file", st.st_mode, f.read())
    return seen


HOSTILE_PATHS = [
    "../outside/secret.txt",
    "../../../../../../../../tmp/kyronix-nope",
    "{tmp}/outside/secret.txt",
    "../project-evil/victim.txt",
    "{tmp}/project-evil/victim.txt",
    "escape/secret.txt",
    "escape/sub/new.txt",
    "secret_link",
    "dangling",
    "inner/../../outside/secret.txt",
    "inner/up/../outside/secret.txt",
    "escape/../escape/victim.txt",
    "./" + "/".join([".."] * 40) + "/outside/secret.txt",
    "  ../outside/secret.txt  ",
    "inner/\x00/../../outside/secret.txt",
    "\uff0e\uff0e/outside/secret.txt",  # fullwidth dots
    "\u2025/outside/secret.txt",  # two-dot leader
    "..\u2215outside\u2215secret.txt",  # division slash
    "..\\..\\outside\\secret.txt",  # windows-style
    "~/.ssh/authorized_keys",
]

WRITE_TOOLS: list[tuple[str, dict[str, str]]] = [
    ("write_file", {"content": "pwned\n"}),
    ("delete_file", {}),
    ("create_dir", {}),
    ("write_in_between", {"content": "pwned\n", "linebefore": "0"}),
    ("modify_line_between", {"content": "pwned\n", "startline": "1", "endline": "1"}),
    ("delete_line", {"line": "1"}),
]
READ_TOOLS: list[tuple[str, dict[str, str]]] = [
    ("read_file", {}),
    ("read_lines", {"start": "1", "end": "2"}),
    ("list_dir", {}),
]


def _expand(path: str, tmp_path: Path) -> str:
    return path.replace("{tmp}", str(tmp_path.resolve()))


def _refused(entry: dict[str, Any]) -> None:
    result = entry["result"]
    assert result["success"] is False, entry
    assert result["errorType"] == "SecurityError", entry
    assert "refused" in result["error"] or "denied" in result["error"], entry
    assert SECRET not in json.dumps(entry), "secret content leaked into the result"


@pytest.mark.parametrize("policies", [ROOT_POLICIES, SAFE_POLICIES], ids=["root", "safe"])
@pytest.mark.parametrize("tool_args", WRITE_TOOLS + READ_TOOLS, ids=lambda t: t[0])
@pytest.mark.parametrize("hostile", HOSTILE_PATHS)
def test_hostile_path(
    tmp_path: Path, hostile: str, tool_args: tuple[str, dict[str, str]], policies: Any
) -> None:
    base = _layout(tmp_path)
    before = _snapshot(tmp_path)
    inside_before = sorted(p.name for p in base.iterdir())
    tool, extra = tool_args
    ex = KyronixExecuter(permissions=PermissionManager(policies), receipts=":memory:")
    with ex:
        [entry] = ex.execute_sync(kml((tool, {"path": _expand(hostile, tmp_path), **extra})), base)
    if tool == "delete_file" and hostile in LINKS_OUT:
        # A link inside the base that points out is removed itself; what it names is untouched.
        assert entry["result"]["success"] is True, entry
        assert not os.path.lexists(base / hostile)
        assert _snapshot(tmp_path) == before
        return
    _refused(entry)
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in base.iterdir()) == inside_before
    assert os.readlink(base / "dangling") == "../outside/created-through-dangling-link"


LINKS_OUT = ("secret_link", "dangling", "escape")
"""Symlinks inside the base whose targets are outside it."""

MOVES = [
    ("inner/ok.txt", "../outside/moved.txt"),
    ("inner/ok.txt", "{tmp}/project-evil/moved.txt"),
    ("inner/ok.txt", "escape/moved.txt"),
    ("inner/ok.txt", "dangling"),
    ("inner/ok.txt", "escape/victim.txt"),
    ("../outside/secret.txt", "inner/stolen.txt"),
    ("escape/secret.txt", "inner/stolen.txt"),
    ("secret_link", "inner/stolen.txt"),
    ("escape", "inner/stolen-dir"),
    ("{tmp}/outside", "inner/stolen-dir"),
]


@pytest.mark.parametrize("tool", ["move_file", "copy_file"])
@pytest.mark.parametrize(("source", "destination"), MOVES)
def test_move_or_copy_with_one_hostile_end(
    tmp_path: Path, tool: str, source: str, destination: str
) -> None:
    base = _layout(tmp_path)
    before = _snapshot(tmp_path)
    ex = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=":memory:")
    args = {"source": _expand(source, tmp_path), "destination": _expand(destination, tmp_path)}
    with ex:
        [entry] = ex.execute_sync(kml((tool, args)), base)
    if tool == "move_file" and source in LINKS_OUT:
        # move_file of a symlink moves the link (still pointing out): nothing outside is read,
        # moved or changed, and no content comes in.
        assert entry["result"]["success"] is True, entry
        moved = base / destination
        assert moved.is_symlink() and not os.path.lexists(base / source)
        assert SECRET not in json.dumps(entry)
        assert _snapshot(tmp_path) == before
        return
    _refused(entry)
    assert _snapshot(tmp_path) == before
    assert (base / "inner/ok.txt").read_text() == "ok\n"
    assert not (base / "inner/stolen.txt").exists() and not (base / "inner/stolen-dir").exists()


@pytest.mark.parametrize(
    "shot", ["../outside/shot.png", "escape/shot.png", "dangling", "{tmp}/project-evil/s.png"]
)
def test_screenshot_path_is_sandboxed_before_any_browser(tmp_path: Path, shot: str) -> None:
    base = _layout(tmp_path)
    before = _snapshot(tmp_path)
    ex = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=":memory:")
    with ex:
        [entry] = ex.execute_sync(kml(("screenshot", {"path": _expand(shot, tmp_path)})), base)
    _refused(entry)
    assert _snapshot(tmp_path) == before


def test_cwd_of_terminal_cannot_leave_the_base(tmp_path: Path) -> None:
    base = _layout(tmp_path)
    before = _snapshot(tmp_path)
    ex = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=":memory:")
    with ex:
        for cwd in ("..", "escape", "{tmp}/outside", "../project-evil"):
            args = {"command": "echo pwned > here.txt", "cwd": _expand(cwd, tmp_path)}
            [entry] = ex.execute_sync(kml(("terminal", args)), base)
            _refused(entry)
    assert _snapshot(tmp_path) == before


def test_a_hostile_plan_stops_at_the_first_refusal(tmp_path: Path) -> None:
    base = _layout(tmp_path)
    before = _snapshot(tmp_path)
    plan = (
        "Sure! Here is the plan:\n```xml\n<kyronix><plan>tidy up</plan>"
        '<tool name="write_file"><path>notes.md</path><content>fine</content></tool>'
        '<tool name="delete_file"><path><![CDATA[../outside]]></path></tool>'
        '<tool name="write_file"><path>escape/victim.txt</path><content>x</content></tool>'
        '<tool name="terminal"><command>rm -rf ../outside</command></tool>'
        "<status>complete</status></kyronix>\n```"
    )
    ex = KyronixExecuter(receipts=":memory:")  # the default, SAFE_POLICIES
    with ex:
        results = ex.execute_sync(plan, base)
    assert [r["result"]["success"] for r in results] == [True, False, False, False]
    _refused(results[1])
    assert [r["result"].get("skipped") for r in results[2:]] == [True, True]
    assert (base / "notes.md").read_text() == "fine"
    assert _snapshot(tmp_path) == before


def test_a_plan_of_only_refusals_with_continue(tmp_path: Path) -> None:
    base = _layout(tmp_path)
    before = _snapshot(tmp_path)
    calls = [("write_file", {"path": _expand(p, tmp_path), "content": "x"}) for p in HOSTILE_PATHS]
    ex = KyronixExecuter(permissions=PermissionManager(ROOT_POLICIES), receipts=":memory:")
    with ex:
        results = ex.execute_sync(kml(*calls), base, continue_on_denial=True)
    assert len(results) == len(HOSTILE_PATHS)
    for entry in results:
        _refused(entry)
    assert _snapshot(tmp_path) == before
