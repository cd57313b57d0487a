"""The sandbox through the real `kiso`: on by default in every mode, turned off only by the
person (--sandbox, KISO_SANDBOX, their own config), said plainly when bubblewrap is missing, and
shown by /status."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .test_print import kiso
from .test_repl import ENTER, Term, chat, squash, write_script


def _script(tmp_path: Path, command: str) -> Path:
    return write_script(
        tmp_path / "s.json",
        [{"tool_calls": [{"name": "shell", "input": {"command": command}}]}, {"text": "done"}],
    )


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    work, home, user = tmp_path / "ws", tmp_path / "kiso", tmp_path / "user"
    work.mkdir()
    user.mkdir()
    (user / ".bashrc").write_text("original\n")
    return work, home, user


def test_bypass_mode_still_runs_commands_in_the_sandbox(
    tmp_path: Path, dirs: tuple[Path, Path, Path]
) -> None:
    work, home, user = dirs
    script = _script(tmp_path, "echo made > inside.txt; : > ~/.bashrc")
    env = {"KISO_HOME": str(home), "HOME": str(user), "KISO_FAUX_SCRIPT": str(script)}
    out = kiso(work, "-p", "go", "--mode", "bypass", "--output-format", "stream-json", **env)
    assert out.returncode == 0, out.stderr
    assert (user / ".bashrc").read_text() == "original\n"
    assert (work / "inside.txt").read_text() == "made\n"
    results = [json.loads(line) for line in out.stdout.splitlines()]
    said = json.dumps(results)
    assert "Read-only file system" in said and "workspace-write sandbox" in said


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_the_person_may_turn_it_off(
    tmp_path: Path, dirs: tuple[Path, Path, Path], how: str
) -> None:
    work, home, user = dirs
    script = _script(tmp_path, ": > ~/.bashrc")
    env = {"KISO_HOME": str(home), "HOME": str(user), "KISO_FAUX_SCRIPT": str(script)}
    if how == "flag":
        out = kiso(work, "-p", "go", "--mode", "bypass", "--sandbox", "off", **env)
    else:
        out = kiso(work, "-p", "go", "--mode", "bypass", KISO_SANDBOX="off", **env)
    assert out.returncode == 0, out.stderr
    assert (user / ".bashrc").read_text() == ""
    assert "sandbox off" in out.stderr  # said, not silent


def test_a_bad_sandbox_value_is_a_usage_error(dirs: tuple[Path, Path, Path]) -> None:
    work, home, _ = dirs
    out = kiso(work, "-p", "go", "--sandbox", "loose", KISO_HOME=str(home))
    assert out.returncode == 2 and "--sandbox" in out.stderr and "Traceback" not in out.stderr
    out = kiso(work, "-p", "go", KISO_HOME=str(home), KISO_SANDBOX="loose")
    assert out.returncode == 1 and "KISO_SANDBOX='loose'" in out.stderr
    assert "Traceback" not in out.stderr


def test_without_bubblewrap_kiso_says_so_plainly(
    tmp_path: Path, dirs: tuple[Path, Path, Path]
) -> None:
    work, home, user = dirs
    bare = tmp_path / "bin"  # a PATH with no bwrap on it (kiso's own script is run by path)
    bare.mkdir()
    for tool in ("cat", "echo", "true"):
        found = shutil.which(tool)
        assert found is not None
        os.symlink(found, bare / tool)
    script = _script(tmp_path, "echo ran")
    env = {"KISO_HOME": str(home), "HOME": str(user), "KISO_FAUX_SCRIPT": str(script)}
    out = kiso(work, "-p", "go", "--mode", "bypass", PATH=str(bare), **env)
    assert out.returncode == 0, out.stderr
    assert "sandbox unavailable: bubblewrap (bwrap) is not installed" in out.stderr
    assert "commands run unsandboxed" in out.stderr


def test_status_shows_the_sandbox(tmp_path: Path, dirs: tuple[Path, Path, Path]) -> None:
    work, home, _ = dirs
    term = Term(chat("s"), cwd=work, home=home, script=write_script(tmp_path / "s.json", []))
    try:
        term.wait_for("▸ default")
        term.send("/status" + ENTER)
        term.wait(lambda: "history" in term.text, 10, "/status")
        row = "sandbox workspace-write (bubblewrap), network off (from the default)"
        assert squash(row) in squash(term.text), term.text
        term.send("\x04")
        assert term.exit_status() == 0
    finally:
        term.close()
