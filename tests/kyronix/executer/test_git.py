"""git_clone, git_commit and git_branch with real git, real repositories and a real HTTP server
on loopback (git's dumb HTTP protocol)."""

from __future__ import annotations

import functools
import os
import re
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kyronix.executer import KyronixExecuter
from kyronix.executer.permissions import (
    ROOT_POLICIES,
    SAFE_POLICIES,
    PermissionManager,
    allow,
    deny,
)
from kyronix.executer.tools import git as gitmod
from kyronix.executer.tools.base import Call, SecurityError, ToolFailure
from kyronix.executer.tools.git import (
    default_directory,
    git_branch,
    git_clone,
    git_commit,
    git_env,
    parse_clone_source,
    run_git,
)

ROOT = PermissionManager(ROOT_POLICIES)
SAFE_GIT = PermissionManager(SAFE_POLICIES).with_policies(
    allow("tool:git_clone"), allow("tool:git_commit"), allow("tool:git_branch")
)
CANARIES = {
    "OPENAI_API_KEY": "sk-canary-openai",
    "ANTHROPIC_API_KEY": "sk-canary-anthropic",
    "GITHUB_TOKEN": "ghp_canary",
    "MY_SERVICE_AUTH_TOKEN": "canary-auth-token",
}


# -- fixtures: an isolated git home, repositories, an HTTP server -------------------------------


@dataclass
class World:
    root: Path
    base: Path
    home: Path
    env: dict[str, str]

    def git(self, *args: str, cwd: Path | None = None, check: bool = True) -> str:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd or self.base,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"git {args} failed: {done.stderr}")
        return done.stdout.strip()

    def call(
        self,
        tool: str,
        permissions: PermissionManager = ROOT,
        env: dict[str, str] | None = None,
        **args: Any,
    ) -> Call:
        return Call(
            tool=tool,
            execution_id="e1",
            args=args,
            base=self.base,
            permissions=permissions,
            env=env if env is not None else self.env,
        )

    def set_global(self, key: str, value: str) -> None:
        self.git("config", "--global", key, value, cwd=self.root)


@pytest.fixture
def world(tmp_path: Path) -> World:
    root = tmp_path.resolve()
    base = root / "base"
    home = root / "home"
    base.mkdir()
    home.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("GIT_") and "proxy" not in k.lower()
    }
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), GIT_CONFIG_NOSYSTEM="1")
    env.update(CANARIES)
    env["KYRONIX_CANARY"] = "visible"
    w = World(root, base, home, env)
    w.set_global("init.defaultBranch", "main")
    w.set_global("user.name", "Test User")
    w.set_global("user.email", "test@example.com")
    return w


def make_repo(w: World, path: Path, files: dict[str, str] | None = None) -> str:
    path.mkdir(parents=True, exist_ok=True)
    w.git("init", "-q", cwd=path)
    for name, text in (files or {"README.md": "hello\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    w.git("add", "-A", cwd=path)
    w.git("commit", "-q", "-m", "first commit", cwd=path)
    return w.git("rev-parse", "HEAD", cwd=path)


@dataclass
class Served:
    port: int
    requests: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"


@pytest.fixture
def http_server() -> Iterator[Callable[[Path | None], Served]]:
    """Serve a directory (git's dumb HTTP protocol), or answer 401 to everything (None)."""
    servers: list[ThreadingHTTPServer] = []

    def start(directory: Path | None) -> Served:
        served = Served(0)

        class Files(SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                served.requests.append(self.path)
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Locked(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served.requests.append(self.path)
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        handler: Any = functools.partial(Files, directory=str(directory)) if directory else Locked
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        served.port = httpd.server_address[1]
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(httpd)
        return served

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def published(world: World, http_server: Callable[[Path | None], Served]) -> tuple[Served, str]:
    """A bare repository served over HTTP at /repo.git; returns the server and its HEAD."""
    head = make_repo(world, world.root / "src", {"README.md": "hello\n", "lib/a.py": "x = 1\n"})
    srv = world.root / "srv"
    srv.mkdir()
    world.git("clone", "-q", "--bare", str(world.root / "src"), str(srv / "repo.git"))
    world.git("update-server-info", cwd=srv / "repo.git")
    return http_server(srv), head


def entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


# -- git_clone ----------------------------------------------------------------------------------


def test_clone_over_http_into_the_default_directory(
    world: World, published: tuple[Served, str]
) -> None:
    server, head = published
    url = server.url("repo.git")
    out = git_clone(world.call("git_clone", repository=url, cwd=world.base))
    target = world.base / "repo"
    assert (target / "README.md").read_text() == "hello\n"
    assert (target / "lib" / "a.py").read_text() == "x = 1\n"
    assert world.git("rev-parse", "HEAD", cwd=target) == head
    assert out.data == {"path": "repo", "head": head, "branch": "main"}
    assert out.output.splitlines() == [
        f"cloned {url} into repo",
        f"HEAD {head[:12]} (main): first commit",
    ]
    assert "/repo.git/info/refs" in "".join(server.requests)


def test_clone_into_a_directory_relative_to_cwd(
    world: World, published: tuple[Served, str]
) -> None:
    server, head = published
    cwd = world.base / "work"
    cwd.mkdir()
    out = git_clone(
        world.call(
            "git_clone", repository=server.url("repo.git"), cwd=cwd, directory=cwd / "checkout"
        )
    )
    assert world.git("rev-parse", "HEAD", cwd=cwd / "checkout") == head
    assert out.data is not None and out.data["path"] == "work/checkout"
    assert entries(world.base) == ["work"]


def test_clone_refuses_a_non_empty_target_and_leaves_it_alone(
    world: World, published: tuple[Served, str]
) -> None:
    server, _ = published
    (world.base / "repo").mkdir()
    (world.base / "repo" / "mine.txt").write_text("keep me")
    with pytest.raises(ToolFailure) as info:
        git_clone(world.call("git_clone", repository=server.url("repo.git")))
    assert "not empty" in info.value.message
    assert entries(world.base / "repo") == ["mine.txt"]
    assert server.requests == []


def test_clone_into_an_existing_empty_directory_works(
    world: World, published: tuple[Served, str]
) -> None:
    server, head = published
    (world.base / "repo").mkdir()
    out = git_clone(world.call("git_clone", repository=server.url("repo.git")))
    assert out.data is not None and out.data["head"] == head


def test_clone_runs_no_hook_from_the_template_directory(
    world: World, published: tuple[Served, str]
) -> None:
    server, _ = published
    marker = world.root / "hook-ran"
    hooks = world.root / "template" / "hooks"
    hooks.mkdir(parents=True)
    hook = hooks / "post-checkout"
    hook.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
    hook.chmod(0o755)
    world.set_global("init.templateDir", str(world.root / "template"))
    # Control: a plain clone in the same environment runs the hook.
    world.git("clone", "-q", server.url("repo.git"), str(world.root / "plain"), cwd=world.root)
    assert marker.exists()
    marker.unlink()

    git_clone(world.call("git_clone", repository=server.url("repo.git")))
    assert (world.base / "repo" / "README.md").exists()
    assert not marker.exists()


def test_clone_of_a_private_address_is_refused_under_safe_policies(
    world: World, published: tuple[Served, str]
) -> None:
    server, _ = published
    with pytest.raises(SecurityError) as info:
        git_clone(world.call("git_clone", SAFE_GIT, repository=server.url("repo.git")))
    assert f"allow('net:private', '127.0.0.1:{server.port}')" in info.value.message
    assert server.requests == []
    assert entries(world.base) == []


def test_clone_of_an_allowed_private_address_works_under_safe_policies(
    world: World, published: tuple[Served, str]
) -> None:
    server, head = published
    permissions = SAFE_GIT.with_policies(allow("net:private", f"127.0.0.1:{server.port}"))
    out = git_clone(world.call("git_clone", permissions, repository=server.url("repo.git")))
    assert out.data is not None and out.data["head"] == head


def test_git_does_not_follow_a_redirect_past_the_guard(
    world: World, published: tuple[Served, str]
) -> None:
    """The guard checked A; A redirects git to B (private, not allowed). git must not follow."""
    b, _ = published
    redirected: list[str] = []

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            redirected.append(self.path)
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{b.port}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    a = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=a.serve_forever, args=(0.05,), daemon=True).start()
    a_port = a.server_address[1]
    try:
        permissions = SAFE_GIT.with_policies(allow("net:private", f"127.0.0.1:{a_port}"))
        with pytest.raises(ToolFailure) as info:
            git_clone(
                world.call(
                    "git_clone", permissions, repository=f"http://127.0.0.1:{a_port}/repo.git"
                )
            )
    finally:
        a.shutdown()
        a.server_close()
    assert redirected, "git never asked A, so the test proves nothing"
    assert "git clone" in info.value.message
    assert b.requests == []
    assert entries(world.base) == []


@pytest.mark.parametrize(
    "repository",
    [
        "git://127.0.0.1/repo.git",
        "ssh://git@localhost/repo.git",
        "git@127.0.0.1:team/repo.git",
        "localhost:repo.git",
        "[git@127.0.0.1:2222]:repo.git",
        "https://169.254.169.254/repo.git",
        "https://metadata.google.internal/repo.git",
        "http://2130706433/repo.git",
    ],
)
def test_every_transport_is_checked_by_the_network_guard(world: World, repository: str) -> None:
    with pytest.raises(SecurityError) as info:
        git_clone(world.call("git_clone", SAFE_GIT, repository=repository))
    assert "allow('net:private'" in info.value.message
    assert entries(world.base) == []


def test_the_clone_target_is_checked_against_the_policies(
    world: World, published: tuple[Served, str]
) -> None:
    server, _ = published
    permissions = ROOT.with_policies(deny("tool:git_clone", "vendor*"))
    with pytest.raises(SecurityError):
        git_clone(
            world.call(
                "git_clone", permissions, repository=f"http://127.0.0.1:{server.port}/vendor.git"
            )
        )
    assert server.requests == []


@pytest.fixture
def marker(world: World) -> Path:
    return world.root / "pwned"


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("file://{src}", "file:// URL"),
        ("FILE://{src}", "file:// URL"),
        ("{src}", "local path"),
        ("./src", "local path"),
        ("../src", "local path"),
        ("src/.git", "local path"),
        ("ext::sh -c touch% {marker}", "'ext::' transport"),
        ("ext::sh -c 'touch {marker}'", "'ext::' transport"),
        ("fd::17", "'fd::' transport"),
        ("custom+helper::https://example.com/x", "'custom+helper::' transport"),
        ("-u touch {marker}", "starts with '-'"),
        ("--upload-pack=touch {marker}", "starts with '-'"),
        ("ssh://-oProxyCommand=touch {marker}/x", "starting with '-'"),
        ("-oProxyCommand=touch {marker}:x", "starts with '-'"),
        ("git@-oProxyCommand=x:repo", "starting with '-'"),
    ],
)
def test_dangerous_repositories_are_refused_and_nothing_happens(
    world: World, marker: Path, template: str, needle: str
) -> None:
    make_repo(world, world.root / "src")
    repository = template.format(src=world.root / "src", marker=marker)
    with pytest.raises(SecurityError) as info:
        git_clone(world.call("git_clone", repository=repository, cwd=world.base))
    assert needle in info.value.message
    assert entries(world.base) == []
    assert not marker.exists()


@pytest.mark.parametrize(
    "repository",
    ["ftp://example.com/r.git", "rsync://example.com/r", "", "[git@example.com:²]:r.git"],
)
def test_unsupported_repositories_fail_clearly(world: World, repository: str) -> None:
    with pytest.raises(ToolFailure) as info:
        git_clone(world.call("git_clone", repository=repository))
    assert info.value.error_type == "InvalidArguments"
    assert entries(world.base) == []


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("file://{src}", "file"),
        ("{src}", "file"),
        ("ext::sh -c touch% {marker}", "ext"),
    ],
)
def test_git_itself_refuses_file_and_ext_even_if_the_user_config_allows_them(
    world: World, marker: Path, url: str, kind: str
) -> None:
    """The second line of defence: the -c options and GIT_ALLOW_PROTOCOL of every invocation."""
    make_repo(world, world.root / "src")
    world.set_global("protocol.file.allow", "always")
    world.set_global("protocol.ext.allow", "always")
    world.set_global("protocol.allow", "always")
    hostile_env = {**world.env, "GIT_ALLOW_PROTOCOL": "file:ext"}
    url = url.format(src=world.root / "src", marker=marker)
    call = world.call("git_clone", env=hostile_env)
    # Control: without our options, this environment really clones and runs the payload.
    plain = subprocess.run(
        ["git", "clone", "-q", "--", url, str(world.root / "control")],
        env=hostile_env,
        cwd=world.root,
        capture_output=True,
        check=False,
    )
    if kind == "ext":
        assert marker.exists()
        marker.unlink()
    else:
        assert plain.returncode == 0 and (world.root / "control" / "README.md").exists()

    result = run_git(
        ["clone", "--", url, str(world.base / "out")], cwd=world.base, env=git_env(call)
    )
    assert result.returncode != 0
    assert f"transport '{kind}' not allowed" in result.stderr
    assert not (world.base / "out").exists()
    assert not marker.exists()


def test_git_children_get_no_credentials_never_prompt_and_run_no_helper(
    world: World, http_server: Callable[[Path | None], Served]
) -> None:
    """A credential helper in the user's global config would run inside git's environment (and
    see it): the global config is not read, credential.helper is reset, and no prompt opens."""
    locked = http_server(None)
    dump = world.root / "helper-env"
    helper = world.root / "helper.sh"
    helper.write_text(f"#!/bin/sh\nenv > {dump}\ncat > /dev/null\n")
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    world.set_global("credential.helper", str(helper))
    call = world.call("git_clone")
    assert call.env["OPENAI_API_KEY"] == "sk-canary-openai"  # given to us

    with pytest.raises(ToolFailure) as info:
        git_clone(world.call("git_clone", repository=locked.url("private.git")))
    assert "terminal prompts disabled" in info.value.message
    assert not dump.exists()  # the helper never ran
    seen = git_env(call, clone=True)
    assert seen["KYRONIX_CANARY"] == "visible"
    assert seen["GIT_TERMINAL_PROMPT"] == "0"
    assert seen["GCM_INTERACTIVE"] == "never"
    assert seen["GIT_CONFIG_NOSYSTEM"] == "1"
    assert seen["GIT_CONFIG_GLOBAL"] == os.devnull
    for name, value in CANARIES.items():
        assert name not in seen
        assert value not in seen.values()
    assert locked.requests
    assert entries(world.base) == []


def test_a_clone_that_hangs_is_killed_with_its_whole_process_group(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    monkeypatch.setattr(gitmod, "CLONE_TIMEOUT_S", 1.5)
    try:
        started = time.monotonic()
        with pytest.raises(ToolFailure) as info:
            git_clone(world.call("git_clone", repository=f"http://127.0.0.1:{port}/stall.git"))
        elapsed = time.monotonic() - started
        assert info.value.error_type == "Timeout"
        assert elapsed >= 1.4, elapsed
        assert held, "git never connected, so the timeout proves nothing"
        assert _live_processes_mentioning(f"127.0.0.1:{port}") == []
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for conn in held:
            conn.close()


def _live_processes_mentioning(text: str) -> list[int]:
    """Live descendants of this test process whose arguments mention ``text`` (only processes
    this test started can be counted: nothing else on the machine is looked at by name)."""
    parents: dict[int, int] = {}
    states: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        states[int(entry)], parents[int(entry)] = fields[0], int(fields[1])
    mine = {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in mine} - mine
        grew = bool(more)
        mine |= more
    found = []
    for pid in sorted(mine - {os.getpid()}):
        try:
            args = Path(f"/proc/{pid}/cmd" + "line").read_bytes().replace(b"\x00", b" ")
        except OSError:
            continue
        if text.encode() in args and states.get(pid) != "Z":
            found.append(pid)
    return found


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://github.com/user/project.git", "project"),
        ("https://github.com/user/project", "project"),
        ("https://github.com/user/project/", "project"),
        ("https://github.com/user/project.git/", "project"),
        ("https://github.com/user/project/.git", "project"),
        ("https://user:pw@example.com:8443/a/b.git", "b"),
        ("https://example.com", "example.com"),
        ("https://example.com:8443/", "example.com"),
        ("git@github.com:user/thing.git", "thing"),
        ("github.com:thing.git", "thing"),
        ("ssh://git@host.xz:2222/~user/dotted.name.git", "dotted.name"),
        ("git://host.xz/path/to/repo.git", "repo"),
    ],
)
def test_default_directory_follows_git(url: str, name: str) -> None:
    assert default_directory(url) == name


@pytest.mark.parametrize(
    "path", ["a/b.git", "a/b", "a/b/", "a/b.git/", "a/b/.git", "x.y.git", "weird%20name.git"]
)
def test_default_directory_matches_what_git_prints(world: World, path: str) -> None:
    # Nothing listens on port 1: git says where it would clone, then fails to connect.
    url = f"http://127.0.0.1:1/{path}"
    done = subprocess.run(
        ["git", "clone", url],
        cwd=world.root,
        env=world.env,
        capture_output=True,
        text=True,
        check=False,
    )
    match = re.search(r"Cloning into '([^']*)'", done.stderr)
    assert match, done.stderr
    assert default_directory(url) == match.group(1)


def test_parse_clone_source_reports_host_and_port() -> None:
    source = parse_clone_source("ssh://git@example.com:2222/r.git")
    assert (source.protocol, source.host, source.port) == ("ssh", "example.com", 2222)
    source = parse_clone_source("[git@example.com:2200]:r.git")
    assert (source.protocol, source.host, source.port) == ("ssh", "example.com", 2200)
    source = parse_clone_source("git@example.com:r.git")
    assert (source.protocol, source.host, source.port) == ("ssh", "example.com", 22)
    source = parse_clone_source("git://example.com/r.git")
    assert (source.protocol, source.port) == ("git", 9418)
    assert parse_clone_source("HTTPS://Example.com/r").host == "example.com"


# -- git_commit ---------------------------------------------------------------------------------


@pytest.fixture
def repo(world: World) -> World:
    make_repo(world, world.base)
    return world


def test_commit_stages_everything_and_reports_the_commit(repo: World) -> None:
    (repo.base / "README.md").write_text("changed\n")
    (repo.base / "new dir").mkdir()
    (repo.base / "new dir" / "file.txt").write_text("new\n")
    message = "Update the readme\n\n# this line is kept\n-m --amend is just text"
    out = git_commit(repo.call("git_commit", message=message))
    head = repo.git("rev-parse", "HEAD")
    assert out.data == {
        "commit": head,
        "branch": "main",
        "files_changed": 2,
        "files": ["README.md", "new dir/file.txt"],
    }
    assert out.output == f"[main {head[:7]}] Update the readme\n2 files changed"
    assert repo.git("log", "-1", "--format=%B") == message
    assert repo.git("status", "--porcelain") == ""
    assert repo.git("rev-list", "--count", "HEAD") == "2"


def test_commit_from_a_subdirectory_commits_the_whole_tree(repo: World) -> None:
    (repo.base / "sub").mkdir()
    (repo.base / "sub" / "x.txt").write_text("x\n")
    (repo.base / "top.txt").write_text("top\n")
    out = git_commit(repo.call("git_commit", message="both", cwd=repo.base / "sub"))
    assert out.data is not None and out.data["files"] == ["sub/x.txt", "top.txt"]


def test_commit_deletions_count(repo: World) -> None:
    (repo.base / "README.md").unlink()
    out = git_commit(repo.call("git_commit", message="remove readme"))
    assert out.data is not None and out.data["files"] == ["README.md"]
    assert out.output.endswith("\n1 file changed")
    assert repo.git("ls-files") == ""


def test_nothing_to_commit_is_a_failure_that_says_so(repo: World) -> None:
    head = repo.git("rev-parse", "HEAD")
    with pytest.raises(ToolFailure) as info:
        git_commit(repo.call("git_commit", message="nothing"))
    assert "nothing to commit" in info.value.message
    assert info.value.error_type == "NothingToCommit"
    assert repo.git("rev-parse", "HEAD") == head


def test_the_first_commit_of_a_new_repository(world: World) -> None:
    world.git("init", "-q")
    (world.base / "a.txt").write_text("a\n")
    out = git_commit(world.call("git_commit", message="initial"))
    assert out.data is not None
    assert out.data["files"] == ["a.txt"]
    assert out.data["commit"] == world.git("rev-parse", "HEAD")


def test_commit_outside_a_repository_says_what_to_do(world: World) -> None:
    (world.base / "a.txt").write_text("a\n")
    with pytest.raises(ToolFailure) as info:
        git_commit(world.call("git_commit", message="x"))
    assert info.value.message == "not a git repository: . (git_clone or `git init` first)"


def test_a_repository_above_the_base_is_never_used(world: World) -> None:
    outer = world.base
    head = make_repo(world, outer)
    inner = outer / "project"
    inner.mkdir()
    (inner / "secret-change.txt").write_text("x\n")
    call = Call(
        tool="git_commit",
        execution_id="e1",
        args={"message": "escape"},
        base=inner,
        permissions=ROOT,
        env=world.env,
    )
    with pytest.raises(ToolFailure) as info:
        git_commit(call)
    assert "not a git repository" in info.value.message
    assert world.git("rev-parse", "HEAD", cwd=outer) == head
    assert world.git("diff", "--cached", "--name-only", cwd=outer) == ""


def test_commit_runs_no_hooks_and_no_fsmonitor(repo: World) -> None:
    marker = repo.root / "markers"
    marker.mkdir()
    hooks = repo.base / ".git" / "hooks"
    for name in ("pre-commit", "commit-msg", "post-commit", "prepare-commit-msg"):
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\ntouch {marker}/{name}\n")
        hook.chmod(0o755)
    monitor = repo.root / "fsmonitor.sh"
    monitor.write_text(f"#!/bin/sh\ntouch {marker}/fsmonitor\n")
    monitor.chmod(0o755)
    repo.git("config", "core.fsmonitor", str(monitor))
    # Control: plain git in the same repository runs all of them.
    (repo.base / "a.txt").write_text("a\n")
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "control")
    assert entries(marker) == sorted(
        ["commit-msg", "fsmonitor", "post-commit", "pre-commit", "prepare-commit-msg"]
    )
    for made in marker.iterdir():
        made.unlink()

    (repo.base / "b.txt").write_text("b\n")
    out = git_commit(repo.call("git_commit", message="through the tool"))
    assert out.data is not None and out.data["files"] == ["b.txt"]
    assert entries(marker) == []


def test_a_fallback_identity_is_used_only_when_none_is_configured(world: World) -> None:
    world.git("config", "--global", "--unset", "user.name")
    world.git("config", "--global", "--unset", "user.email")
    world.git("init", "-q")
    (world.base / "a.txt").write_text("a\n")
    git_commit(world.call("git_commit", message="anonymous"))
    assert world.git("log", "-1", "--format=%an <%ae>|%cn <%ce>") == (
        "Kyronix <kyronix@localhost>|Kyronix <kyronix@localhost>"
    )
    world.git("config", "user.name", "Repo Person")
    world.git("config", "user.email", "repo@example.com")
    (world.base / "b.txt").write_text("b\n")
    git_commit(world.call("git_commit", message="named"))
    assert world.git("log", "-1", "--format=%an <%ae>") == "Repo Person <repo@example.com>"


def test_the_configured_identity_wins(repo: World) -> None:
    (repo.base / "a.txt").write_text("a\n")
    git_commit(repo.call("git_commit", message="mine"))
    assert repo.git("log", "-1", "--format=%an <%ae>") == "Test User <test@example.com>"


@pytest.mark.parametrize("message", ["", "   \n\t"])
def test_an_empty_message_is_refused(repo: World, message: str) -> None:
    (repo.base / "a.txt").write_text("a\n")
    with pytest.raises(ToolFailure) as info:
        git_commit(repo.call("git_commit", message=message))
    assert "empty" in info.value.message
    assert repo.git("rev-list", "--count", "HEAD") == "1"


def test_environment_variables_cannot_point_git_at_another_repository(
    repo: World, world: World
) -> None:
    other = world.root / "other"
    other_head = make_repo(world, other)
    (repo.base / "a.txt").write_text("a\n")
    env = {**repo.env, "GIT_DIR": str(other / ".git"), "GIT_WORK_TREE": str(other)}
    git_commit(repo.call("git_commit", env=env, message="here"))
    assert world.git("rev-parse", "HEAD", cwd=other) == other_head
    assert repo.git("log", "-1", "--format=%s") == "here"


# -- git_branch ---------------------------------------------------------------------------------


def test_create_and_switch_branches(repo: World) -> None:
    out = git_branch(repo.call("git_branch", name="feature/x", create=True))
    assert repo.git("symbolic-ref", "--short", "HEAD") == "feature/x"
    assert out.data is not None and out.data["created"] is True
    assert out.data["branch"] == "feature/x"
    assert out.output.startswith("created and switched to branch 'feature/x'")
    out = git_branch(repo.call("git_branch", name="main"))
    assert repo.git("symbolic-ref", "--short", "HEAD") == "main"
    assert out.data is not None and out.data["created"] is False


def test_switching_to_a_missing_branch_suggests_create(repo: World) -> None:
    with pytest.raises(ToolFailure) as info:
        git_branch(repo.call("git_branch", name="nope"))
    assert "pass create=true" in info.value.message
    assert repo.git("branch", "--list", "nope") == ""


def test_creating_an_existing_branch_suggests_switching(repo: World) -> None:
    repo.git("branch", "dev")
    with pytest.raises(ToolFailure) as info:
        git_branch(repo.call("git_branch", name="dev", create=True))
    assert "pass create=false" in info.value.message
    assert repo.git("symbolic-ref", "--short", "HEAD") == "main"


@pytest.mark.parametrize(
    "name",
    ["-D", "--orphan=x", "-", "a..b", "has space", "x.lock", "HEAD", "a~1", "a:b", "@", "@{-1}"],
)
def test_invalid_branch_names_are_refused(repo: World, name: str) -> None:
    before = repo.git("for-each-ref", "--format=%(refname)")
    with pytest.raises(ToolFailure) as info:
        git_branch(repo.call("git_branch", name=name, create=True))
    assert info.value.error_type == "InvalidArguments"
    assert repo.git("for-each-ref", "--format=%(refname)") == before
    assert repo.git("symbolic-ref", "--short", "HEAD") == "main"


def test_branch_outside_a_repository(world: World) -> None:
    with pytest.raises(ToolFailure) as info:
        git_branch(world.call("git_branch", name="x", create=True))
    assert "not a git repository" in info.value.message


# -- the tool specs and the executer ------------------------------------------------------------


def test_tool_specs() -> None:
    specs = {s.name: s for s in gitmod.TOOLS}
    assert list(specs) == ["git_clone", "git_commit", "git_branch"]
    assert all(s.writes for s in gitmod.TOOLS)
    directory = specs["git_clone"].param("directory")
    assert directory is not None and directory.relative_to == "cwd" and directory.type == "path"
    create = specs["git_branch"].param("create")
    assert create is not None and create.type == "boolean" and not create.required


def _kml(*tools: str) -> str:
    return "<kyronix>\n" + "\n".join(tools) + "\n<status>complete</status>\n</kyronix>"


def test_through_the_executer_clone_commit_and_branch(
    world: World, published: tuple[Served, str]
) -> None:
    server, head = published
    (world.base / "work").mkdir()
    kml = _kml(
        '<tool name="git_clone">'
        f"<repository>{server.url('repo.git')}</repository>"
        "<cwd>work</cwd><directory>clone</directory></tool>",
        '<tool name="git_branch"><name>topic</name><create>true</create>'
        "<cwd>work/clone</cwd></tool>",
        '<tool name="write_file"><path>work/clone/new.txt</path><content>n</content></tool>',
        '<tool name="git_commit"><message>Add new.txt</message><cwd>work/clone</cwd></tool>',
    )
    ex = KyronixExecuter(permissions=ROOT, receipts=world.root / "r.sqlite3", env=world.env)
    try:
        results = ex.execute_sync(kml, world.base)
    finally:
        ex.close()
    assert [r["result"]["success"] for r in results] == [True] * 4, results
    assert results[0]["result"]["data"]["head"] == head
    assert results[0]["result"]["data"]["path"] == "work/clone"
    assert results[1]["result"]["data"] == {
        "branch": "topic",
        "created": True,
        "head": head,
    }
    clone = world.base / "work" / "clone"
    assert world.git("log", "-1", "--format=%s", cwd=clone) == "Add new.txt"
    assert world.git("symbolic-ref", "--short", "HEAD", cwd=clone) == "topic"


def test_through_the_executer_safe_policies_refuse_git(
    world: World, published: tuple[Served, str]
) -> None:
    server, _ = published
    kml = _kml(f'<tool name="git_clone"><repository>{server.url("r.git")}</repository></tool>')
    ex = KyronixExecuter(
        permissions=PermissionManager(SAFE_POLICIES), receipts=world.root / "r.db", env=world.env
    )
    try:
        [entry] = ex.execute_sync(kml, world.base)
    finally:
        ex.close()
    assert entry["result"]["errorType"] == "SecurityError"
    assert "tool:git_clone" in entry["result"]["error"]
    assert server.requests == []
    assert entries(world.base) == []
