"""A corpus of malicious repositories, each trying one way to make git run a program (or leave
the base), against git_commit and git_branch (and git_clone for what a clone can bring).

Every payload does two things: it creates a marker file and it makes an HTTP request to a canary
server on 127.0.0.1. A case passes only when neither happened (never just by the return value).
Where a plain ``git`` can be made to run the payload, a control proves the repository really is
hostile (the case would mean nothing otherwise).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kyronix.executer import KyronixExecuter
from kyronix.executer.permissions import ROOT_POLICIES, SAFE_POLICIES, PermissionManager, allow
from kyronix.executer.tools.base import Call, SecurityError, ToolFailure
from kyronix.executer.tools.git import git_branch, git_clone, git_commit
from kyronix.kml import Plan, ToolCall, serialize

ROOT = PermissionManager(ROOT_POLICIES)


@dataclass
class Canary:
    port: int
    hits: list[str] = field(default_factory=list)


@pytest.fixture
def canary() -> Iterator[Canary]:
    seen = Canary(0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.hits.append(self.path)
            if "locked" in self.path:  # a repository that asks for credentials
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
            else:
                self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    seen.port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield seen
    httpd.shutdown()
    httpd.server_close()


@dataclass
class Lab:
    root: Path
    base: Path
    markers: Path
    canary: Canary
    env: dict[str, str]

    def git(self, *args: str, cwd: Path | None = None, check: bool = True) -> str:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd or self.base,
            env=self.env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"git {args} failed: {done.stderr}")
        return done.stdout.strip()

    def payload(self, case: str) -> str:
        """An executable that marks ``case`` and calls the canary."""
        script = self.root / "payloads" / case
        script.parent.mkdir(exist_ok=True)
        request = (
            f"import urllib.request; urllib.request.urlopen("
            f"'http://127.0.0.1:{self.canary.port}/{case}', timeout=3)"
        )
        script.write_text(
            f"#!/bin/sh\ntouch '{self.markers}/{case}'\n"
            f"'{sys.executable}' -c \"{request}\" 2>/dev/null\nexit 0\n"
        )
        script.chmod(0o755)
        return str(script)

    def fired(self) -> set[str]:
        """What payloads ran: their markers, and their requests to the canary (a request git
        itself makes to a 'locked' remote is not a payload's)."""
        hits = {h.strip("/") for h in self.canary.hits if "locked" not in h}
        return {p.name for p in self.markers.iterdir()} | hits

    def reset(self) -> None:
        for made in self.markers.iterdir():
            made.unlink()
        self.canary.hits.clear()

    def call(self, tool: str, **args: Any) -> Call:
        return Call(tool, "e1", args, self.base, ROOT, env=self.env)


@pytest.fixture
def lab(tmp_path: Path, canary: Canary) -> Lab:
    root = tmp_path.resolve()
    base, home, markers = root / "base", root / "home", root / "markers"
    for d in (base, home, markers):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), GIT_CONFIG_NOSYSTEM="1")
    env.update(GIT_AUTHOR_NAME="t", GIT_COMMITTER_NAME="t", EMAIL="t@example.com")
    lab = Lab(root, base, markers, canary, env)
    lab.git("config", "--global", "init.defaultBranch", "main", cwd=root)
    lab.git("init", "-q")
    (base / "a.txt").write_text("one\n")
    lab.git("add", "-A")
    lab.git("commit", "-q", "-m", "one")
    return lab


_changes = iter(range(1_000_000))


def change(lab: Lab) -> None:
    """A change for git to look at (stat-dirty, so the content is read)."""
    n = next(_changes)
    (lab.base / "a.txt").write_text(f"changed {n}\n")
    os.utime(lab.base / "a.txt", (0, 0))
    (lab.base / f"new{n}.txt").write_text("new\n")


# Each case: (name, setup(lab, payload) -> None, control git args or None).
Setup = Callable[[Lab, str], object]


def _filter(lab: Lab, p: str, *, name: str = "p", key: str = "clean") -> None:
    lab.git("config", f"filter.{name}.{key}", p)
    (lab.base / ".git" / "info" / "attributes").write_text(f"* filter={name}\n")


def _hooks(lab: Lab, p: str) -> None:
    for hook in ("pre-commit", "commit-msg", "prepare-commit-msg", "post-commit", "post-checkout"):
        target = lab.base / ".git" / "hooks" / hook
        target.write_text(f"#!/bin/sh\nexec '{p}'\n")
        target.chmod(0o755)


def _hooks_path(lab: Lab, p: str) -> None:
    hooks = lab.root / "evil-hooks"
    hooks.mkdir()
    for hook in ("pre-commit", "post-commit", "post-checkout"):
        (hooks / hook).write_text(f"#!/bin/sh\nexec '{p}'\n")
        (hooks / hook).chmod(0o755)
    lab.git("config", "core.hooksPath", str(hooks))


def _include(lab: Lab, p: str) -> None:
    included = lab.base / ".git" / "more.cfg"
    included.write_text(f'[filter "inc"]\n\tclean = {p}\n')
    lab.git("config", "include.path", "more.cfg")
    (lab.base / ".git" / "info" / "attributes").write_text("* filter=inc\n")


def _include_if(lab: Lab, p: str) -> None:
    outside = lab.root / "outside.cfg"
    outside.write_text(f'[filter "cond"]\n\tsmudge = {p}\n\tclean = {p}\n')
    lab.git("config", f"includeIf.gitdir:{lab.base}/.git.path", str(outside))
    (lab.base / ".git" / "info" / "attributes").write_text("* filter=cond\n")


def _textconv(lab: Lab, p: str) -> None:
    lab.git("config", "diff.tc.textconv", p)
    lab.git("config", "diff.tc.command", p)
    (lab.base / ".git" / "info" / "attributes").write_text("* diff=tc\n")


def _gpg(lab: Lab, p: str) -> None:
    lab.git("config", "commit.gpgSign", "true")
    lab.git("config", "gpg.program", p)


def _ssh_signing(lab: Lab, p: str) -> None:
    lab.git("config", "commit.gpgSign", "true")
    lab.git("config", "gpg.format", "ssh")
    lab.git("config", "gpg.ssh.program", p)
    lab.git("config", "user.signingKey", "key::ssh-ed25519 AAAA")


def _ssh_remote(lab: Lab, p: str) -> None:
    lab.git("config", "core.sshCommand", p)
    lab.git("remote", "add", "origin", "ssh://127.0.0.1/repo.git")
    lab.git("config", "branch.main.remote", "origin")
    lab.git("config", "submodule.recurse", "true")


def _credential(lab: Lab, p: str) -> None:
    lab.git("config", "credential.helper", p)
    lab.git("remote", "add", "origin", f"http://127.0.0.1:{lab.canary.port}/locked.git")


def _editor(lab: Lab, p: str) -> None:
    lab.git("config", "core.editor", p)
    lab.git("config", "sequence.editor", p)


def _pager(lab: Lab, p: str) -> None:
    lab.git("config", "core.pager", p)
    for command in ("status", "diff", "log", "branch", "switch", "commit"):
        lab.git("config", f"pager.{command}", p)


CASES: list[tuple[str, Setup, list[str] | None]] = [
    ("filter-clean", _filter, ["add", "-A"]),
    ("filter-process", functools.partial(_filter, key="process"), ["add", "-A"]),
    ("filter-named-with-equals", functools.partial(_filter, name="a=b"), ["add", "-A"]),
    ("filter-from-include", _include, ["add", "-A"]),
    ("filter-from-includeif-outside", _include_if, ["add", "-A"]),
    ("fsmonitor", lambda lab, p: lab.git("config", "core.fsmonitor", p), ["status"]),
    ("hooks", _hooks, ["commit", "-qam", "x"]),
    ("hooks-path", _hooks_path, ["commit", "-qam", "x"]),
    ("diff-external", lambda lab, p: lab.git("config", "diff.external", p), ["diff"]),
    ("diff-textconv", _textconv, ["diff"]),
    ("gpg-program", _gpg, ["commit", "-qam", "x"]),
    ("gpg-ssh-program", _ssh_signing, ["commit", "-qam", "x"]),
    ("editor", _editor, ["commit", "-a"]),
    ("pager", _pager, None),  # git pages only to a terminal
    ("ssh-command", _ssh_remote, ["fetch", "origin"]),
    ("credential-helper", _credential, ["fetch", "origin"]),
]


@pytest.mark.parametrize(("case", "setup", "control"), CASES, ids=[c[0] for c in CASES])
def test_no_program_the_repository_names_runs(
    lab: Lab, case: str, setup: Setup, control: list[str] | None
) -> None:
    setup(lab, lab.payload(case))
    if control is not None:
        change(lab)
        lab.git(*control, check=False)
        assert case in lab.fired(), f"control: plain git did not run the {case} payload"
        lab.git("reset", "-q", "--hard", "HEAD", check=False)
        lab.reset()
    change(lab)
    outcome = git_commit(lab.call("git_commit", message="through the tool"))
    assert outcome.data is not None and outcome.data["files_changed"] >= 1
    git_branch(lab.call("git_branch", name="feature", create=True))
    git_branch(lab.call("git_branch", name="main"))
    change(lab)
    git_commit(lab.call("git_commit", message="again"))
    assert lab.fired() == set()
    assert lab.git("log", "-1", "--format=%s") == "again"


# -- repositories that reach outside the base ---------------------------------------------------


def _outside_repo(lab: Lab) -> tuple[Path, str]:
    outside = lab.root / "outside"
    outside.mkdir()
    lab.git("init", "-q", cwd=outside)
    (outside / "o.txt").write_text("outside\n")
    lab.git("add", "-A", cwd=outside)
    lab.git("commit", "-q", "-m", "outside", cwd=outside)
    return outside, lab.git("rev-parse", "HEAD", cwd=outside)


def _assert_refused(lab: Lab, cwd: Path | None = None) -> None:
    args = {"cwd": cwd} if cwd is not None else {}
    with pytest.raises(SecurityError):
        git_commit(lab.call("git_commit", message="escape", **args))
    with pytest.raises(SecurityError):
        git_branch(lab.call("git_branch", name="escape", create=True, **args))


def test_a_work_tree_outside_the_base_is_refused(lab: Lab) -> None:
    outside, head = _outside_repo(lab)
    lab.git("config", "core.worktree", str(outside))
    _assert_refused(lab)
    lab.git("config", "core.worktree", "../..")
    _assert_refused(lab)
    assert lab.git("rev-list", "--count", "HEAD") == "1"
    assert lab.git("rev-parse", "HEAD", cwd=outside) == head


def test_a_git_file_pointing_outside_is_refused(lab: Lab) -> None:
    outside, head = _outside_repo(lab)
    sub = lab.base / "sub"
    sub.mkdir()
    (sub / ".git").write_text(f"gitdir: {outside / '.git'}\n")
    (sub / "x.txt").write_text("x\n")
    _assert_refused(lab, sub)
    assert lab.git("rev-parse", "HEAD", cwd=outside) == head
    assert lab.git("status", "--porcelain", cwd=outside) == ""


def test_a_commondir_outside_is_refused(lab: Lab) -> None:
    outside, head = _outside_repo(lab)
    (lab.base / ".git" / "commondir").write_text(str(outside / ".git") + "\n")
    change(lab)
    with pytest.raises((SecurityError, ToolFailure)) as info:
        git_commit(lab.call("git_commit", message="escape"))
    assert info.type is SecurityError or "not a git repository" in info.value.message
    assert lab.git("rev-parse", "HEAD", cwd=outside) == head


def test_object_alternates_outside_are_refused(lab: Lab) -> None:
    outside, _head = _outside_repo(lab)
    (lab.base / ".git" / "objects" / "info" / "alternates").write_text(
        str(outside / ".git" / "objects") + "\n"
    )
    change(lab)
    with pytest.raises(SecurityError, match="alternates"):
        git_commit(lab.call("git_commit", message="borrow"))


def test_the_issue_attack_a_bare_repository_written_by_file_tools(lab: Lab, tmp_path: Path) -> None:
    """With only tool:git_commit allowed beside SAFE's file tools: write a small bare repository
    (x/config with worktree = .. and a clean filter, x/info/attributes, x/HEAD, objects/,
    refs/heads/), then git_commit with cwd=x. Refused; the filter never runs."""
    payload = lab.payload("bare-x")
    config = (
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = ..\n"
        f'[filter "p"]\n\tclean = {payload}\n\tsmudge = {payload}\n'
        f"[core]\n\tfsmonitor = {payload}\n"
    )
    files = {
        "x/config": config,
        "x/info/attributes": "* filter=p\n",
        "x/HEAD": "ref: refs/heads/main\n",
        "x/objects/info/.keep": "",
        "x/refs/heads/.keep": "",
        "x/description": "x\n",
    }
    calls = [
        ToolCall("write_file", {"path": path, "content": text}, f"w{i}")
        for i, (path, text) in enumerate(files.items())
    ]
    calls.append(ToolCall("git_commit", {"message": "pwn", "cwd": "x"}, "commit"))
    permissions = PermissionManager(SAFE_POLICIES).with_policies(allow("tool:git_commit"))
    executer = KyronixExecuter(permissions=permissions, receipts=tmp_path / "receipts.sqlite3")
    with executer:
        results = executer.execute_sync(serialize(Plan(tuple(calls))), lab.base)
    assert all(r["result"]["success"] for r in results[:-1])
    commit = results[-1]["result"]
    assert commit["success"] is False
    assert commit["errorType"] == "SecurityError" and "bare repository" in commit["error"]
    assert lab.fired() == set()
    assert lab.git("rev-list", "--count", "HEAD") == "1"


def test_a_non_bare_repository_in_a_subdirectory_with_a_work_tree_above(lab: Lab) -> None:
    """x/.git/config with core.worktree pointing at the base's parent: refused."""
    sub = lab.base / "x"
    sub.mkdir()
    lab.git("init", "-q", cwd=sub)
    lab.git("config", "core.worktree", "../../..", cwd=sub)
    _assert_refused(lab, sub)


# -- clones --------------------------------------------------------------------------------------


@pytest.fixture
def served(lab: Lab) -> Iterator[tuple[str, Path]]:
    """A repository whose .gitattributes names a filter (as git-lfs repositories do), served
    over git's dumb HTTP protocol on 127.0.0.1."""
    src = lab.root / "src"
    src.mkdir()
    lab.git("init", "-q", cwd=src)
    (src / ".gitattributes").write_text("* filter=lfs diff=lfs\n")
    (src / "data.bin").write_text("payload\n")
    lab.git("add", "-A", cwd=src)
    lab.git("commit", "-q", "-m", "data", cwd=src)
    srv = lab.root / "srv"
    srv.mkdir()
    lab.git("clone", "-q", "--bare", str(src), str(srv / "repo.git"), cwd=lab.root)
    lab.git("update-server-info", cwd=srv / "repo.git")

    class Files(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Files, directory=str(srv)))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/repo.git", srv
    httpd.shutdown()
    httpd.server_close()


def test_a_clone_runs_no_program_from_the_users_global_config(
    lab: Lab, served: tuple[str, Path]
) -> None:
    url, _srv = served
    p = lab.payload("global")
    hooks = lab.root / "global-hooks"
    hooks.mkdir()
    (hooks / "post-checkout").write_text(f"#!/bin/sh\nexec '{p}'\n")
    (hooks / "post-checkout").chmod(0o755)
    for key, value in (
        ("filter.lfs.smudge", p),
        ("filter.lfs.process", p),
        ("filter.lfs.required", "true"),
        ("core.hooksPath", str(hooks)),
        ("core.fsmonitor", p),
        ("credential.helper", p),
    ):
        lab.git("config", "--global", key, value, cwd=lab.root)
    subprocess.run(
        ["git", "clone", "-q", url, str(lab.root / "control")],
        env=lab.env,
        cwd=lab.root,
        capture_output=True,
        check=False,
    )
    assert "global" in lab.fired()
    lab.reset()
    out = git_clone(lab.call("git_clone", repository=url, directory=lab.base / "cloned"))
    assert out.data is not None and out.data["head"]
    assert (lab.base / "cloned" / "data.bin").read_text() == "payload\n"
    (lab.base / "cloned" / "data.bin").write_text("changed\n")
    os.utime(lab.base / "cloned" / "data.bin", (0, 0))
    git_commit(lab.call("git_commit", message="after the clone", cwd=lab.base / "cloned"))
    assert lab.fired() == set()


def test_a_clone_into_dot_git_is_refused_under_safe_policies(
    lab: Lab, served: tuple[str, Path], tmp_path: Path
) -> None:
    url, _srv = served
    before = (lab.base / ".git" / "config").read_bytes()
    permissions = PermissionManager(SAFE_POLICIES).with_policies(
        allow("tool:git_clone"), allow("net:private")
    )
    executer = KyronixExecuter(permissions=permissions, receipts=tmp_path / "r.sqlite3")
    targets = [".git", ".git/modules/x", "sub/.git", ".env"]
    calls = [
        ToolCall("git_clone", {"repository": url, "directory": t}, f"c{i}")
        for i, t in enumerate(targets)
    ]
    with executer:
        results = executer.execute_sync(
            serialize(Plan(tuple(calls))), lab.base, continue_on_denial=True
        )
        ok = executer.execute_sync(
            serialize(Plan((ToolCall("git_clone", {"repository": url, "directory": "v"}, "ok"),))),
            lab.base,
        )
    for entry in results:
        assert entry["result"]["errorType"] == "SecurityError", entry
        assert "denied" in entry["result"]["error"]
    assert (lab.base / ".git" / "config").read_bytes() == before
    assert not (lab.base / ".git" / "modules").exists() and not (lab.base / "sub").exists()
    assert not (lab.base / ".env").exists()
    # the same clone elsewhere in the base works
    assert ok[0]["result"]["success"], ok
    assert lab.fired() == set()
