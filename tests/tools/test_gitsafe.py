"""kiso's one git hardening: real repositories whose config names programs, a marker file for
each program that must not run, and the settings checked as git itself reads them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kiso.tools import gitsafe

ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "t",
    "GIT_COMMITTER_NAME": "t",
    "EMAIL": "t@example.com",
}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=ENV, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    ws = tmp_path / "r"
    ws.mkdir()
    git(ws, "init", "-q")
    (ws / "a.txt").write_text("one\n")
    git(ws, "add", "a.txt")
    git(ws, "commit", "-qm", "one")
    return ws


def dirty(ws: Path) -> None:
    (ws / "a.txt").write_text("two\n")
    os.utime(ws / "a.txt", (0, 0))  # stat-dirty: git must run the clean filter to compare


def payload(tmp_path: Path, name: str) -> str:
    marker = tmp_path / f"ran-{name}"
    return f"sh -c 'touch {marker}'; cat"


def ran(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("ran-*"))


def test_the_hardening_is_command_line_scope_and_wins_over_the_repository(repo: Path) -> None:
    git(repo, "config", "core.fsmonitor", "evil")
    git(repo, "config", "core.hooksPath", "/tmp/evil-hooks")
    env = gitsafe.safe_git_env(ENV)
    shown = subprocess.run(
        ["git", "config", "--show-scope", "--get", "core.fsmonitor"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert shown == ["command", "false"]
    for key, value in gitsafe.HARDENING:
        got = subprocess.run(
            ["git", "config", "--get", key],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert got.stdout.rstrip("\n") == value, key
    assert env["GIT_CONFIG_GLOBAL"] == os.devnull and env["GIT_CONFIG_NOSYSTEM"] == "1"


def test_variables_that_move_the_repository_or_inject_config_are_dropped() -> None:
    hostile = {
        "GIT_DIR": "/elsewhere",
        "GIT_WORK_TREE": "/elsewhere",
        "GIT_CONFIG_PARAMETERS": "'core.fsmonitor=evil'",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "core.pager",
        "GIT_CONFIG_VALUE_0": "evil",
        "GIT_SSH_COMMAND": "evil",
        "GIT_EXTERNAL_DIFF": "evil",
        "GIT_ASKPASS": "evil",
        "PATH": "/usr/bin:/bin",
    }
    env = gitsafe.safe_git_env(hostile)
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_CONFIG_PARAMETERS", "GIT_SSH_COMMAND"):
        assert name not in env
    assert "evil" not in env.values()
    assert env["PATH"] == "/usr/bin:/bin" and env["GIT_TERMINAL_PROMPT"] == "0"


@pytest.mark.parametrize("name", ["p", "a=b", "dotted.name", "Case"])
def test_every_filter_the_repository_defines_is_neutralised(
    repo: Path, tmp_path: Path, name: str
) -> None:
    """A filter named ``a=b`` cannot be overridden with ``-c`` (it splits at the first '='):
    the overrides go through GIT_CONFIG_COUNT, which takes any key."""
    git(repo, "config", f"filter.{name}.clean", payload(tmp_path, "clean"))
    git(repo, "config", f"filter.{name}.process", payload(tmp_path, "process"))
    (repo / ".git" / "info" / "attributes").write_text(f"* filter={name}\n")
    dirty(repo)
    subprocess.run(["git", "status"], cwd=repo, env=ENV, capture_output=True, check=False)
    assert ran(tmp_path), "control: plain git must run the filter"
    for made in tmp_path.glob("ran-*"):
        made.unlink()
    result = gitsafe.safe_git(["status", "--short"], repo)
    assert result.returncode == 0 and b"a.txt" in result.stdout
    result = gitsafe.safe_git(["add", "-A"], repo)
    assert ran(tmp_path) == []


def test_filters_pulled_in_by_include_and_include_if_are_found(repo: Path, tmp_path: Path) -> None:
    inside = repo / ".git" / "extra.cfg"
    inside.write_text(f'[filter "inc"]\n\tclean = {payload(tmp_path, "include")}\n')
    outside = tmp_path / "outside.cfg"
    outside.write_text(f'[filter "cond"]\n\tclean = {payload(tmp_path, "includeif")}\n')
    git(repo, "config", "include.path", "extra.cfg")
    git(repo, "config", f"includeIf.gitdir:{repo}/.git.path", str(outside))
    (repo / ".git" / "info" / "attributes").write_text("*.txt filter=inc\na.txt filter=cond\n")
    names = gitsafe.read_driver_names(repo, gitsafe.safe_git_env(ENV), 5)
    assert {"filter.inc.clean", "filter.cond.clean"} <= set(names)
    dirty(repo)
    gitsafe.safe_git(["add", "-A"], repo)
    assert ran(tmp_path) == []


def test_driver_overrides_cover_filters_diffs_and_merges() -> None:
    overrides = dict(
        gitsafe.driver_overrides(
            ["filter.x.clean", "filter.a=b.smudge", "diff.tc.textconv", "merge.m.driver", "core.x"]
        )
    )
    assert overrides["filter.x.clean"] == "cat" and overrides["filter.x.process"] == ""
    assert overrides["filter.a=b.smudge"] == "cat"
    assert overrides["diff.tc.textconv"] == "cat" and overrides["merge.m.driver"] == "false"
    assert not any(k.startswith("core.") for k in overrides)


def test_config_env_takes_keys_with_equals_signs() -> None:
    env = gitsafe.config_env([("filter.a=b.clean", "cat"), ("x.y", "")])
    assert env == {
        "GIT_CONFIG_KEY_0": "filter.a=b.clean",
        "GIT_CONFIG_VALUE_0": "cat",
        "GIT_CONFIG_KEY_1": "x.y",
        "GIT_CONFIG_VALUE_1": "",
        "GIT_CONFIG_COUNT": "2",
    }


def test_locate_sees_core_worktree_and_git_files(repo: Path, tmp_path: Path) -> None:
    env = gitsafe.safe_git_env(ENV)
    found = gitsafe.locate(repo, env, 5)
    assert isinstance(found, gitsafe.GitLocation)
    assert found.work_tree == repo.resolve() and found.git_dir == (repo / ".git").resolve()
    other = tmp_path / "elsewhere"
    other.mkdir()
    git(repo, "config", "core.worktree", str(other))
    found = gitsafe.locate(repo, env, 5)
    assert isinstance(found, gitsafe.GitLocation) and found.work_tree == other.resolve()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ".git").write_text(f"gitdir: {repo / '.git'}\n")
    found = gitsafe.locate(linked, env, 5)
    assert isinstance(found, gitsafe.GitLocation) and found.git_dir == (repo / ".git").resolve()


def test_a_directory_that_only_looks_like_a_bare_repository_is_refused(tmp_path: Path) -> None:
    x = tmp_path / "x"
    for d in ("objects", "refs/heads"):
        (x / d).mkdir(parents=True)
    (x / "HEAD").write_text("ref: refs/heads/main\n")
    (x / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tworktree = ..\n")
    found = gitsafe.locate(x, gitsafe.safe_git_env(ENV), 5)
    assert not isinstance(found, gitsafe.GitLocation)
    assert b"safe.bareRepository" in found.stderr


def test_outside_alternates_are_reported(repo: Path, tmp_path: Path) -> None:
    info = repo / ".git" / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "alternates").write_text(f"# comment\n{tmp_path / 'other' / 'objects'}\n")
    assert gitsafe.outside_alternates(repo / ".git", repo) == [str(tmp_path / "other/objects")]
    (info / "alternates").write_text("../../sub/objects\n")
    assert gitsafe.outside_alternates(repo / ".git", repo) == []
