"""The path sandbox: real directories and real symlinks, resolved and never string-matched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiso.kernel.errors import KisoError
from kiso.tools.paths import PathOutsideWorkspace, display_path, resolve_in_workspace


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace, holding a secret."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("secret")
    return out


def real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def test_a_relative_path_resolves_inside_the_workspace(workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("x")
    assert resolve_in_workspace(workspace, "src/a.py") == real(workspace) / "src" / "a.py"
    assert resolve_in_workspace(workspace, "./src/../src/a.py") == real(workspace) / "src" / "a.py"


def test_an_absolute_path_inside_is_accepted_and_the_root_itself_too(workspace: Path) -> None:
    (workspace / "a.txt").write_text("x")
    assert resolve_in_workspace(workspace, str(workspace / "a.txt")) == real(workspace) / "a.txt"
    assert resolve_in_workspace(workspace, ".") == real(workspace)
    assert resolve_in_workspace(workspace, str(workspace)) == real(workspace)


@pytest.mark.parametrize(
    "escape", ["..", "../outside/secret.txt", "a/../../outside", "src/../../x"]
)
def test_dot_dot_escapes_are_refused(workspace: Path, outside: Path, escape: str) -> None:
    with pytest.raises(PathOutsideWorkspace):
        resolve_in_workspace(workspace, escape)


def test_absolute_paths_elsewhere_are_refused(workspace: Path, outside: Path) -> None:
    for path in ("/etc/passwd", "/", str(outside / "secret.txt")):
        with pytest.raises(PathOutsideWorkspace):
            resolve_in_workspace(workspace, path)


def test_a_sibling_sharing_the_workspace_prefix_is_refused(workspace: Path) -> None:
    sibling = workspace.parent / (workspace.name + "2")
    sibling.mkdir()
    (sibling / "f").write_text("x")
    with pytest.raises(PathOutsideWorkspace):
        resolve_in_workspace(workspace, str(sibling / "f"))
    with pytest.raises(PathOutsideWorkspace):
        resolve_in_workspace(workspace, f"../{workspace.name}2/f")


def test_a_file_symlink_pointing_outside_is_refused(workspace: Path, outside: Path) -> None:
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(PathOutsideWorkspace, match="symlink"):
        resolve_in_workspace(workspace, "link.txt")


def test_a_directory_symlink_pointing_outside_is_refused(workspace: Path, outside: Path) -> None:
    (workspace / "out").symlink_to(outside, target_is_directory=True)
    for path in ("out", "out/secret.txt", "out/new/file.txt", str(workspace / "out" / "x")):
        with pytest.raises(PathOutsideWorkspace):
            resolve_in_workspace(workspace, path)


def test_a_dangling_symlink_pointing_outside_is_refused(workspace: Path, outside: Path) -> None:
    (workspace / "dangling").symlink_to(outside / "not-yet-created.txt")
    with pytest.raises(PathOutsideWorkspace):
        resolve_in_workspace(workspace, "dangling")
    assert not (outside / "not-yet-created.txt").exists()


def test_a_symlink_chain_that_ends_outside_is_refused(workspace: Path, outside: Path) -> None:
    (workspace / "one").symlink_to(workspace / "two")
    (workspace / "two").symlink_to(outside)
    with pytest.raises(PathOutsideWorkspace):
        resolve_in_workspace(workspace, "one/secret.txt")


def test_symlinks_inside_resolve_to_their_real_target(workspace: Path) -> None:
    (workspace / "real").mkdir()
    (workspace / "real" / "f.txt").write_text("x")
    (workspace / "alias").symlink_to(workspace / "real")
    (workspace / "later").symlink_to(workspace / "real" / "created-later.txt")
    assert resolve_in_workspace(workspace, "alias/f.txt") == real(workspace) / "real" / "f.txt"
    # A dangling symlink inside resolves to where the file would be created.
    assert (
        resolve_in_workspace(workspace, "later") == real(workspace) / "real" / "created-later.txt"
    )


def test_a_path_that_does_not_exist_yet_is_resolved_from_its_deepest_parent(
    workspace: Path,
) -> None:
    (workspace / "alias").symlink_to(workspace, target_is_directory=True)
    resolved = resolve_in_workspace(workspace, "alias/new/deeper/file.txt")
    assert resolved == real(workspace) / "new" / "deeper" / "file.txt"


def test_a_workspace_reached_through_a_symlink_works(tmp_path: Path, workspace: Path) -> None:
    (workspace / "a.txt").write_text("x")
    via = tmp_path / "via"
    via.symlink_to(workspace, target_is_directory=True)
    assert resolve_in_workspace(via, "a.txt") == real(workspace) / "a.txt"
    assert resolve_in_workspace(via, str(workspace / "a.txt")) == real(workspace) / "a.txt"
    with pytest.raises(PathOutsideWorkspace):
        resolve_in_workspace(via, "../outside")


@pytest.mark.parametrize("bad", ["", "   ", "a\x00b", "\x00"])
def test_empty_paths_and_nul_bytes_are_refused(workspace: Path, bad: str) -> None:
    with pytest.raises(PathOutsideWorkspace):
        resolve_in_workspace(workspace, bad)


def test_a_non_string_path_is_refused(workspace: Path) -> None:
    with pytest.raises(PathOutsideWorkspace):
        resolve_in_workspace(workspace, None)  # type: ignore[arg-type]


def test_the_error_names_the_path_and_workspace_and_says_what_to_do(workspace: Path) -> None:
    with pytest.raises(PathOutsideWorkspace) as caught:
        resolve_in_workspace(workspace, "../../etc/passwd")
    error = caught.value
    assert isinstance(error, KisoError)
    assert isinstance(error, ValueError)
    assert error.path == "../../etc/passwd"
    assert error.workspace == str(real(workspace))
    message = str(error)
    assert "'../../etc/passwd'" in message
    assert str(real(workspace)) in message
    assert "relative to the workspace root" in message


def test_must_exist_raises_file_not_found_inside_and_still_refuses_outside(
    workspace: Path, outside: Path
) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.txt"):
        resolve_in_workspace(workspace, "missing.txt", must_exist=True)
    (workspace / "dangling").symlink_to(workspace / "gone")
    with pytest.raises(FileNotFoundError):
        resolve_in_workspace(workspace, "dangling", must_exist=True)
    with pytest.raises(PathOutsideWorkspace):
        resolve_in_workspace(workspace, "../outside/secret.txt", must_exist=True)
    (workspace / "here.txt").write_text("x")
    assert resolve_in_workspace(workspace, "here.txt", must_exist=True).read_text() == "x"


def test_display_path_is_workspace_relative(workspace: Path) -> None:
    assert display_path(workspace, real(workspace)) == "."
    assert display_path(workspace, real(workspace) / "a" / "b.txt") == "a/b.txt"


@pytest.mark.parametrize(
    "path",
    [
        "~/.ssh/id_rsa",
        "~",
        "\uff0e\uff0e/outside/secret.txt",
        "\u2025/outside",
        "src/\u2024\u2024/x",
        "..\u2215outside",
        "..\\..\\outside",
        "a\uff0f..\uff0fb",
    ],
)
def test_tilde_and_look_alikes_of_dots_and_slashes_are_refused(workspace: Path, path: str) -> None:
    with pytest.raises(PathOutsideWorkspace) as info:
        resolve_in_workspace(workspace, path)
    assert "~" in info.value.reason or "look like" in info.value.reason


@pytest.mark.parametrize("name", ["café.txt", "naïve/ﬁle.py", "a\\b.txt", "日本語.md", "x~y"])
def test_ordinary_unicode_names_still_resolve(workspace: Path, name: str) -> None:
    assert resolve_in_workspace(workspace, name) == real(workspace) / name


def test_a_real_root_skips_resolving_it_again(workspace: Path, tmp_path: Path) -> None:
    link = tmp_path / "link-to-ws"
    link.symlink_to(workspace)
    root = real(workspace)
    assert resolve_in_workspace(root, "a", root_is_real=True) == root / "a"
    assert resolve_in_workspace(link, "a") == root / "a"
