"""Issue 12, the low ones: SAFE's protected names match whatever their case; a relative path is
judged exactly as the same path made absolute; an empty path is an argument error for that tool
(the envelope goes on); line numbers are ASCII digits only. Each checked on the filesystem too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kyronix.executer import (
    ROOT_POLICIES,
    SAFE_POLICIES,
    KyronixExecuter,
    PermissionManager,
    allow,
    deny,
)

from .kmlkit import fail, kml, ok

PROTECTED = [
    ".GIT/config",
    ".Git/HEAD",
    "sub/.GIT/hooks/pre-commit",
    ".ENV",
    ".Env.Local",
    "config/.ENV.production",
    "ID_RSA",
    "Id_Ed25519.pub",
    "keys/SERVER.PEM",
    "tls/Site.Key",
    ".NETRC",
    ".NPMRC",
]


@pytest.mark.parametrize("path", PROTECTED)
def test_safe_protects_names_whatever_their_case(
    safe_executer: KyronixExecuter, base: Path, path: str
) -> None:
    assert not safe_executer.permissions.check("tool:write_file", path)
    result = fail(safe_executer, base, "write_file", path=path, content="owned")
    assert result["errorType"] == "SecurityError"
    assert not (base / path).exists()
    # reading them is still allowed (as for the lower-case names)
    assert safe_executer.permissions.check("tool:read_file", path)


def test_a_deny_ignores_case_and_an_allow_does_not() -> None:
    pm = PermissionManager([allow("tool:write_file", "src/*"), deny("tool:write_file", "*.lock")])
    assert pm.check("tool:write_file", "src/a.py")
    assert not pm.check("tool:write_file", "SRC/a.py")  # an allow too narrow is safe
    assert not pm.check("tool:write_file", "src/Cargo.LOCK")  # a deny too broad is safe
    assert PermissionManager(SAFE_POLICIES).check("tool:write_file", "src/git.py")
    assert PermissionManager(SAFE_POLICIES).check("tool:write_file", "environment.md")


CASES = [
    "a.txt",
    "./a.txt",
    "src/../a.txt",
    ".git/config",
    "x/../.git/config",
    "sub/.env",
    "link/.env",  # through a symlink to a directory inside the base
    "outlink/x",  # through a symlink that leaves the base
    "../outside.txt",
    "src/../../outside.txt",
    ".",
    "",
]


@pytest.mark.parametrize("policies", [SAFE_POLICIES, ROOT_POLICIES], ids=["safe", "root"])
@pytest.mark.parametrize("path", CASES)
def test_a_relative_path_is_judged_as_the_same_path_made_absolute(
    tmp_path: Path, policies: tuple[object, ...], path: str
) -> None:
    base = tmp_path / "project"
    (base / "src").mkdir(parents=True)
    (base / "sub").mkdir()
    (base / "link").symlink_to("sub")
    (tmp_path / "elsewhere").mkdir()
    (base / "outlink").symlink_to(tmp_path / "elsewhere")
    pm = PermissionManager(policies, base=base)  # type: ignore[arg-type]
    absolute = os.path.join(base, path)
    for action in ("tool:write_file", "tool:read_file", "tool:terminal"):
        relative = pm.decide(action, path)
        assert relative.allowed == pm.decide(action, absolute).allowed, (action, path)
        assert relative.policy == pm.decide(action, absolute).policy
    if policies is SAFE_POLICIES and path in ("link/.env", "x/../.git/config", ".git/config"):
        assert not pm.check("tool:write_file", path)
    if policies is SAFE_POLICIES and ("outside" in path or path == "outlink/x"):
        assert not pm.check("tool:read_file", path)


def test_without_a_base_dot_dot_is_collapsed_in_a_relative_path() -> None:
    pm = PermissionManager(SAFE_POLICIES)
    assert not pm.check("tool:write_file", "x/../.env")
    assert not pm.check("tool:write_file", "a/b/../../../outside")
    assert pm.check("tool:write_file", "a/./b/../c.txt")


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("write_file", {"path": "", "content": "x"}),
        ("write_file", {"path": "   \n", "content": "x"}),
        ("read_file", {"path": ""}),
        ("delete_file", {"path": " "}),
        ("move_file", {"source": "", "destination": "b"}),
        ("copy_file", {"source": "keep.txt", "destination": ""}),
        ("terminal", {"command": "true", "cwd": ""}),
        ("write_in_between", {"path": "", "content": "x", "linebefore": "0"}),
    ],
)
def test_an_empty_path_is_an_argument_error_and_the_envelope_goes_on(
    root_executer: KyronixExecuter, base: Path, tool: str, args: dict[str, str]
) -> None:
    (base / "keep.txt").write_text("kept")
    before = sorted(p.name for p in base.iterdir())
    first, after = root_executer.execute_sync(
        kml((tool, args), ("write_file", {"path": "after.txt", "content": "ran"})), base
    )
    assert first["result"]["errorType"] == "InvalidArguments", first
    assert "is empty" in first["result"]["error"]
    assert after["result"]["success"], after  # not a SecurityError: the envelope went on
    assert sorted(p.name for p in base.iterdir()) == sorted([*before, "after.txt"])
    assert (base / "keep.txt").read_text() == "kept"


def test_self_closing_path_is_empty_too(root_executer: KyronixExecuter, base: Path) -> None:
    [entry] = root_executer.execute_sync("<tool name='read_file'><path/></tool>", base)
    assert entry["result"]["errorType"] == "InvalidArguments"


@pytest.mark.parametrize("number", ["\u0663", "\uff13", "\U0001d7d1", "\u00b3", "1\u0663"])
def test_line_numbers_are_ascii_digits_only(
    root_executer: KyronixExecuter, base: Path, number: str
) -> None:
    (base / "f.txt").write_text("a\nb\nc\nd\n")
    result = fail(
        root_executer, base, "write_in_between", path="f.txt", content="x\n", linebefore=number
    )
    assert result["errorType"] == "InvalidArguments"
    assert (base / "f.txt").read_text() == "a\nb\nc\nd\n"
    ok(root_executer, base, "write_in_between", path="f.txt", content="x\n", linebefore="3")
    assert (base / "f.txt").read_text() == "a\nb\nc\nx\nd\n"
