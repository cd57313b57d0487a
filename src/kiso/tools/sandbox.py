"""The OS sandbox for commands a model can drive: ``shell``, MCP stdio servers, the Kyronix
executer's ``terminal``. On Linux it is `bubblewrap <https://github.com/containers/bubblewrap>`_
(``bwrap``): the command gets a mount namespace of its own in which

* ``workspace-write``: the whole file system is mounted read-only, except the workspace, a
  private temporary directory that ``$TMPDIR`` names (``/tmp`` itself is read-only, and the
  sockets other programs keep there are hidden) and the writable parts of the workspace's git
  directory (objects, refs, the index; never ``hooks/`` or ``config``, which run code on the
  user's next ``git``). The workspace's ``.kiso/`` stays read-only too;
* ``read-only``: everything read-only, with no temporary directory either;
* in both, the places credentials live (:data:`HIDDEN_IN_HOME`: ``~/.ssh``, ``~/.gnupg``,
  ``~/.aws``, ``~/.config/gh``, ``~/.kiso``... and ``$KISO_HOME``/``$KYRONIX_HOME`` wherever they
  are) and the sockets of services that would run a command outside it (:data:`HIDDEN_SOCKETS`)
  are replaced by empty read-only directories, or for a file by an unreadable one; the
  network is a private namespace with only a loopback of its own unless ``network`` allows it; the
  command gets ``/dev``, IPC and a hostname of its own. It shares the host's PID namespace (so a
  pid it prints is the pid everyone else sees): it can see your processes, but the process that
  sandboxes it is made non-dumpable (:func:`keep_out`), so its environment and memory are not
  readable;
* ``--die-with-parent``: when whoever started ``bwrap`` (the shell supervisor) dies, everything in
  the sandbox dies with it.

``off`` runs the command as before. What is not contained is in docs/sandbox.md.

Everything here is pure except :func:`probe` (runs ``bwrap`` once per process) and
:meth:`Sandbox.for_workspace` (looks at which of the hidden paths exist).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kiso.kernel.errors import UsageError

__all__ = [
    "HIDDEN_IN_HOME",
    "MODES",
    "Sandbox",
    "SandboxPolicy",
    "check_mode",
    "denial",
    "keep_out",
    "probe",
    "stricter",
]

MODES = ("workspace-write", "read-only", "off")
"""From the loosest that still contains something to none at all; :func:`stricter` orders them."""
_STRICTNESS = {"off": 0, "workspace-write": 1, "read-only": 2}

HIDDEN_IN_HOME = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".kiso",
    ".kyronix",
    ".password-store",
    ".config/gh",
    ".config/hub",
    ".config/gcloud",
    ".config/kiso",
    ".config/op",
    ".local/share/keyrings",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".terraform.d/credentials.tfrc.json",
)
"""Where credentials live under the home directory; each is hidden when it exists."""

HIDDEN_SOCKETS = (
    "/run/user",
    "/run/dbus",
    "/run/docker.sock",
    "/run/containerd",
    "/run/podman",
    "/run/snapd.socket",
    "/run/snapd-snap.socket",
    "/run/systemd/private",
)
"""Sockets of services that run commands outside the sandbox for whoever asks (the user's
systemd and D-Bus, Docker, Podman...): a Unix socket stays reachable on a read-only mount."""

_TEMP_SOCKETS = (".X11-unix", ".ICE-unix", "tmux-*", "ssh-*", "dbus-*", ".s.PGSQL.*", "*.sock")
"""Sockets and socket directories programs keep in ``/tmp`` (a display, a terminal multiplexer,
an SSH agent, a session bus) through which a command could act outside the sandbox."""

_GIT_READ_ONLY = ("hooks", "config", "info")
"""Parts of a git directory that run code or change what the user's next ``git`` does."""


def check_mode(mode: str, where: str = "sandbox") -> str:
    if mode not in MODES:
        raise UsageError(f"{where}: must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def stricter(a: str, b: str) -> bool:
    """Is mode ``a`` stricter than mode ``b``?"""
    return _STRICTNESS[a] > _STRICTNESS[b]


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """What a person chose: the mode, the network, extra writable directories."""

    mode: str = "workspace-write"
    network: bool = False
    writable_roots: tuple[str, ...] = ()
    """Directories writable besides the workspace and the temporary ones (``workspace-write``)."""
    source: str = "default"
    """Where the mode came from: "flag", "environment", a config file's path or "default"."""

    @property
    def on(self) -> bool:
        return self.mode != "off"


@functools.lru_cache(maxsize=4)
def probe(bwrap: str | None = None) -> str | None:
    """None when a bubblewrap sandbox can be made here, else why not (one sentence saying what to
    do). Runs ``bwrap`` once per process (about 5 ms) and remembers the answer."""
    path = bwrap or shutil.which("bwrap")
    if path is None:
        return (
            "bubblewrap (bwrap) is not installed: install it (apt-get install bubblewrap, "
            "dnf install bubblewrap) to run commands in the sandbox"
        )
    try:
        done = subprocess.run(
            [path, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-net",
             "--die-with-parent", "--", "/bin/sh", "-c", "exit 0"],
            capture_output=True, timeout=30, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap ({path}) could not be started: {exc}"
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        why = said[-1] if said else f"exit {done.returncode}"
        return (
            f"bubblewrap ({path}) cannot make a sandbox here ({why}); user namespaces may be "
            f"off (sysctl kernel.unprivileged_userns_clone=1, or an AppArmor profile for bwrap)"
        )
    return None


@dataclass(frozen=True, slots=True)
class Sandbox:
    """A policy made concrete for one workspace: the paths to bind, hide and protect."""

    mode: str
    network: bool
    workspace: Path
    writable: tuple[Path, ...] = ()
    """Directories mounted writable (``workspace-write``), the workspace first."""
    temp: Path | None = None
    """A private directory, writable, that ``TMPDIR`` names inside (``workspace-write``): it
    lives as long as this process, so one command can leave a file there for the next."""
    protected: tuple[Path, ...] = ()
    """Paths inside writable ones that stay read-only (``.git/hooks``, ``.kiso``)."""
    hidden: tuple[Path, ...] = ()
    """Where credentials may live, replaced by empty, unreadable directories (or files) when
    they exist (:meth:`present_hidden`)."""
    sockets: tuple[Path, ...] = ()
    """Sockets kept reachable though a hidden directory holds them (the SSH agent's, when
    ``shell.passEnv`` keeps ``SSH_AUTH_SOCK``)."""
    bwrap: str = "bwrap"
    reason: str | None = field(default=None, compare=False)
    """Why the sandbox cannot be used here (bubblewrap missing or refused), else None."""

    @property
    def available(self) -> bool:
        return self.reason is None

    @classmethod
    def for_workspace(
        cls,
        policy: SandboxPolicy,
        workspace: Path,
        *,
        environ: Mapping[str, str] | None = None,
        home: Path | None = None,
        bwrap: str | None = None,
        temp_parent: Path | None = None,
        reachable: Sequence[str] = (),
    ) -> Sandbox | None:
        """The sandbox for ``workspace`` under ``policy``, or None when the policy is ``off``.

        ``temp_parent``: where the private temporary directory is made (kiso passes its home,
        so a killed kiso's is found and removed by the next one; default: the system's).
        ``reachable``: the names of variables the command keeps (``shell.passEnv``): an
        ``SSH_AUTH_SOCK`` among them leaves the agent's socket reachable."""
        if not policy.on:
            return None
        env = os.environ if environ is None else environ
        home = home if home is not None else Path(env.get("HOME") or os.path.expanduser("~"))
        ws = Path(os.path.realpath(workspace))
        writable: list[Path] = []
        protected: list[Path] = []
        if policy.mode == "workspace-write":
            writable.append(ws)
            for root in policy.writable_roots:
                path = Path(os.path.realpath(os.path.expanduser(root)))
                if path.is_dir():
                    writable.append(path)
            for gitdir in _git_dirs(ws):
                writable.append(gitdir)
                protected += _git_protected(gitdir)
            protected += _nested_git_protected(ws)
            if (ws / ".kiso").exists():
                protected.append(ws / ".kiso")
        hidden: list[Path] = []
        for name in HIDDEN_IN_HOME:
            hidden.append(home / name)
        for var in ("KISO_HOME", "KYRONIX_HOME"):
            if env.get(var):
                hidden.append(Path(os.path.expanduser(env[var])))
        hidden += [Path(p) for p in HIDDEN_SOCKETS]
        agent = env.get("SSH_AUTH_SOCK", "")
        agent_kept = "SSH_AUTH_SOCK" in {n.upper() for n in reachable} and os.path.isabs(agent)
        hidden += _temp_sockets(env, None if agent_kept else agent)
        binary = bwrap or shutil.which("bwrap") or "bwrap"
        reason = probe(bwrap)
        temp = None
        if reason is None:
            keep_out()
            if policy.mode == "workspace-write":
                temp = _private_tmp(temp_parent)
        shown = [Path(os.path.abspath(path)) for path in dict.fromkeys(hidden)]
        return cls(
            policy.mode,
            policy.network,
            ws,
            tuple(dict.fromkeys(writable)),
            temp,
            tuple(dict.fromkeys(protected)),
            tuple(shown),
            (Path(os.path.realpath(agent)),) if agent_kept and os.path.exists(agent) else (),
            binary,
            reason,
        )

    def wrap(self, argv: Sequence[str], cwd: Path) -> list[str]:
        """``bwrap`` and its arguments, then ``argv``: the command line that runs ``argv`` in
        ``cwd`` inside this sandbox. Order matters: later mounts cover earlier ones."""
        # No PID namespace: a command's pid is the one the host sees, so the supervisor, a
        # liveness guard and a person reading a pid file all mean the same process by it.
        args = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev"]
        # --new-session: the shell leads a session and process group of its own, as it does
        # unsandboxed (its pid is its group's id), and cannot type into a terminal (TIOCSTI)
        args += ["--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"]
        args += ["--cap-drop", "ALL"]
        if not self.network:
            args.append("--unshare-net")
        # Mounts go shallowest first, so a deeper one lands on top of what contains it: the
        # workspace (or the private TMPDIR) inside a hidden $KISO_HOME stays there, ~/.ssh inside
        # a workspace that is the home stays hidden. Hidden directories turn read-only last, once
        # what lies inside them is mounted.
        mounts: list[tuple[Path, list[str]]] = []
        if self.temp is not None and _make_private_tmp(self.temp):
            args += ["--setenv", "TMPDIR", str(self.temp)]
            mounts.append((self.temp, ["--bind", str(self.temp), str(self.temp)]))
        mounts += [(path, ["--bind", str(path), str(path)]) for path in self.writable]
        mounts += [(path, ["--ro-bind", str(path), str(path)]) for path in self.protected]
        mounts += [(path, ["--bind", str(path), str(path)]) for path in self.sockets]
        present = self.present_hidden()
        hidden_dirs = [path for path in present if path.is_dir()]
        for path in present:
            how = ["--tmpfs", str(path)] if path in hidden_dirs else ["--ro-bind", "/dev/null"]
            mounts.append((path, how if path in hidden_dirs else [*how, str(path)]))
        for _, mount in sorted(mounts, key=lambda m: len(m[0].parts)):
            args += mount
        for path in hidden_dirs:
            args += ["--remount-ro", str(path)]
        args += ["--chdir", str(cwd), "--", *argv]
        return args

    def present_hidden(self) -> list[Path]:
        """The hidden places that exist now, resolved: looked at for every command, so a
        ``$KISO_HOME`` made after the sandbox was (a first run) is hidden all the same."""
        found: list[Path] = []
        for path in self.hidden:
            if os.path.lexists(path):
                real = Path(os.path.realpath(path))
                if real not in found and real != self.workspace:
                    found.append(real)
        return found

    def describe(self) -> str:
        network = "network on" if self.network else "network off"
        if not self.available:
            return f"unavailable, commands run unsandboxed: {self.reason}"
        return f"{self.mode} (bubblewrap), {network}"


def _temp_sockets(env: Mapping[str, str], agent: str | None) -> list[Path]:
    """The sockets of :data:`_TEMP_SOCKETS` in ``/tmp`` and ``$TMPDIR``, and the SSH agent's
    socket (``agent``; None: it is kept reachable, so its ``ssh-*`` directory is too)."""
    found: list[Path] = []
    for top in dict.fromkeys(["/tmp", env.get("TMPDIR") or "/tmp"]):
        for pattern in _TEMP_SOCKETS:
            found += sorted(Path(top).glob(pattern))
    if agent and os.path.isabs(agent):
        found.append(Path(agent))
    return found


@functools.cache
def keep_out() -> None:
    """Make this process non-dumpable (Linux ``PR_SET_DUMPABLE`` 0): a sandboxed command runs as
    the same user and sees its processes, but can then neither read this one's
    ``/proc/<pid>/environ`` or memory (the model's API key) nor attach to it."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE


def _private_tmp(parent: Path | None) -> Path:
    """Where this process's own ``TMPDIR`` goes: ``<parent>/sandbox-tmp/<pid>-<random>``, made
    by the first command that needs it (:func:`_make_private_tmp`), so a run that starts no
    command leaves nothing behind."""
    root = (parent if parent is not None else Path(tempfile.gettempdir())) / "sandbox-tmp"
    return Path(os.path.realpath(root)) / f"{os.getpid()}-{secrets.token_hex(6)}"


_made: set[Path] = set()
_made_lock = threading.Lock()


def _make_private_tmp(path: Path) -> bool:
    """Make ``path`` (0700) once, removed at exit with its parent when that is empty; remove what
    killed processes left beside it. False when it cannot be made (a full disk): the command
    then has no writable temporary directory rather than no sandbox."""
    with _made_lock:
        if path in _made:
            return True
        root = path.parent
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            for old in root.iterdir():
                pid = old.name.split("-", 1)[0]
                if pid.isascii() and pid.isdigit() and not _alive(int(pid)):
                    shutil.rmtree(old, ignore_errors=True)
            path.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            return False
        _made.add(path)
        atexit.register(_remove_private_tmp, path)
        return True


def _remove_private_tmp(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # only when no other process's is there


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _inside(parent: Path, path: Path) -> bool:
    return path == parent or parent in path.parents


def _git_dirs(workspace: Path) -> list[Path]:
    """The git directories a ``git commit`` in ``workspace`` writes: the repository's, and for a
    worktree its own and the common one.

    Anything in the workspace may have been written by a command, so a ``.git`` there is
    believed only as far as git's own bookkeeping outside it confirms: a ``.git`` directory in
    the workspace is in it (only its protected parts matter), a symlink is ignored, and a
    ``.git`` file counts only when it names a linked worktree's directory
    (``<common>/worktrees/<name>``, outside the workspace) whose ``gitdir`` file names this very
    ``.git`` file back."""
    for top in (workspace, *workspace.parents):
        dotgit = top / ".git"
        inside = top == workspace
        if dotgit.is_symlink():
            if inside:
                continue
        elif dotgit.is_dir():
            return [Path(os.path.realpath(dotgit))]
        if dotgit.is_file():
            return _linked_worktree(dotgit, workspace)
    return []


def _linked_worktree(dotgit: Path, workspace: Path) -> list[Path]:
    """The worktree's git directory and the common one, when git's records confirm them."""
    try:
        text = dotgit.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    m = re.match(r"gitdir:\s*(.+)", text.strip())
    if m is None:
        return []
    gitdir = Path(os.path.realpath(dotgit.parent / m.group(1).strip()))
    common = Path(os.path.realpath(gitdir.parent.parent))
    try:
        back = (gitdir / "gitdir").read_text(encoding="utf-8").strip()
    except OSError:
        return []
    confirmed = (
        gitdir.parent.name == "worktrees"
        and not _inside(workspace, gitdir)
        and not _inside(workspace, common)
        and os.path.realpath(back) == os.path.realpath(dotgit)
        and (common / "HEAD").is_file()
        and (common / "objects").is_dir()
    )
    return [gitdir, common] if confirmed else []


def _git_protected(gitdir: Path) -> list[Path]:
    """What of a git directory runs code or changes what the user's next ``git`` does: its
    ``hooks/``, ``config`` and ``info/`` (made when missing, so a command cannot create them),
    and the same of every submodule's directory under ``modules/``."""
    found: list[Path] = []
    dirs = [gitdir]
    modules = gitdir / "modules"
    if modules.is_dir() and not modules.is_symlink():
        heads = {Path(p).parent for p in modules.rglob("HEAD")}
        dirs += sorted(d for d in heads if (d / "objects").is_dir())
    for each in dirs:
        for part in _GIT_READ_ONLY:
            path = each / part
            if not os.path.lexists(path):
                try:
                    if part == "config":
                        path.touch()
                    else:
                        path.mkdir()
                except OSError:
                    continue
            found.append(path)
    return found


def _nested_git_protected(workspace: Path) -> list[Path]:
    """The submodules checked out in the workspace with a ``.git`` directory of their own (the
    old layout): git enters them on the user's ``git status``, so theirs are protected too."""
    try:
        text = (workspace / ".gitmodules").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found: list[Path] = []
    for m in re.finditer(r"^\s*path\s*=\s*(.+?)\s*$", text, re.MULTILINE):
        dotgit = workspace / m.group(1) / ".git"
        if dotgit.is_dir() and not dotgit.is_symlink() and _inside(workspace, dotgit.resolve()):
            found += _git_protected(dotgit)
    return found


_DENIAL_MARKERS = (
    ("Read-only file system", "it tried to write outside the places the sandbox lets it write"),
    ("Network is unreachable", "it tried to reach the network, which the sandbox cuts off"),
    ("Could not resolve host", "it tried to reach the network, which the sandbox cuts off"),
    ("Temporary failure in name resolution", "it tried to reach the network (no DNS here)"),
    ("Name or service not known", "it tried to reach the network (no DNS here)"),
    ("getaddrinfo", "it tried to reach the network, which the sandbox cuts off"),
    ("Operation not permitted", "the sandbox does not allow that operation"),
    ("Device or resource busy", "it tried to replace a file the sandbox protects"),
    ("remote unpack failed", "it tried to write outside the places the sandbox lets it write"),
)


_OFFLINE_MARKERS = (
    ("Connection refused", "it tried to reach a server, and the sandbox has no network"),
    ("Failed to connect", "it tried to reach a server, and the sandbox has no network"),
)


def denial(sandbox: Sandbox, exit_code: int | None, output: str) -> str | None:
    """Why a failed command probably failed because of ``sandbox``, or None. A heuristic on what
    it printed (like Codex's): a write refused as a read-only file system, a network that is not
    there, or a path the sandbox hides."""
    if exit_code == 0 or exit_code is None:
        return None
    for marker, why in _DENIAL_MARKERS + (() if sandbox.network else _OFFLINE_MARKERS):
        if marker in output:
            return why
    for path in sandbox.present_hidden():
        if str(path) in output:
            return f"it reached for {path}, which the sandbox hides"
    return None
