"""``git_clone``, ``git_commit`` and ``git_branch``: the git command line, run without a shell.

Every git process runs under kiso's one git hardening (:mod:`kiso.tools.gitsafe`):

- an argument list (never a shell) and ``--`` before anything a model wrote that git could read
  as an option; URLs and branch names starting with ``-`` are refused outright;
- every program a repository's config can name switched off in command-line scope (hooks,
  ``core.fsmonitor``, pager, editor, ``core.sshCommand``, credential helpers, ``diff.external``,
  signing programs, ...), and every filter, diff and merge driver the repository's config
  defines (includes followed) replaced by ``cat``; no system or global config is read (only
  ``user.name`` and ``user.email`` are taken from your global config, as values);
  ``safe.bareRepository=explicit``; no network (``protocol.allow=never``) except for a clone;
- the repository is located first (``git rev-parse``, hardened) and refused unless its git dir,
  common dir, work tree and object alternates all lie inside the base; every later command is
  pinned to what was checked (``GIT_DIR``, ``GIT_WORK_TREE``), and ``GIT_CEILING_DIRECTORIES``
  is the base's parent, so a repository above the base is never found;
- for a clone, only ``https``, ``http``, ``ssh`` and ``git`` (``protocol.<name>.allow`` and
  ``GIT_ALLOW_PROTOCOL``), ``http.followRedirects=false`` (git cannot be redirected to an address
  the guard never saw), and a destination that goes through the same protected-path denials as
  ``write_file`` (under ``SAFE_POLICIES`` a clone into ``.git/`` is refused);
- an environment from :func:`kiso.tools.env.child_env` (credentials removed), never a prompt;
- its own process group, stdin closed (or the commit message), a timeout that kills the group,
  and a cap on the output kept.

Before a clone, the URL's host is resolved and checked by the network guard (``net:private``, as
for ``http_request``). git resolves the name again itself, so a DNS answer that changes between
the check and the connection (rebinding) is not caught; ``http.followRedirects=false`` closes the
redirect route. An ssh host name that only exists in ``~/.ssh/config`` does not resolve and is
refused.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from kiso.tools import gitsafe
from kiso.tools.env import child_env
from kyronix.executer.tools.base import (
    Call,
    Param,
    SecurityError,
    ToolFailure,
    ToolOutput,
    ToolSpec,
)
from kyronix.executer.tools.net import DEFAULT_PORTS, guard_host, redact_url

__all__ = [
    "CLONE_TIMEOUT_S",
    "GIT_TIMEOUT_S",
    "OUTPUT_LIMIT",
    "SAFE_CONFIG",
    "TOOLS",
    "CloneSource",
    "GitResult",
    "default_directory",
    "git_env",
    "parse_clone_source",
    "run_git",
]

CLONE_TIMEOUT_S = 300.0
GIT_TIMEOUT_S = 60.0
OUTPUT_LIMIT = 64 * 1024
"""Bytes of stdout (and of stderr) kept from one git process."""

ALLOWED_PROTOCOLS = ("https", "http", "ssh", "git")

CLONE_CONFIG: tuple[tuple[str, str], ...] = (
    *((f"protocol.{p}.allow", "always") for p in ALLOWED_PROTOCOLS),
    ("protocol.file.allow", "never"),
    ("protocol.ext.allow", "never"),
    ("http.followRedirects", "false"),
    ("core.sshCommand", "ssh"),
)
"""What a clone adds to :data:`kiso.tools.gitsafe.HARDENING`: four protocols, no redirects, and
plain ``ssh`` (the hardening's ``core.sshCommand=false`` is for everything else)."""

SAFE_CONFIG: tuple[tuple[str, str], ...] = (*gitsafe.HARDENING, *CLONE_CONFIG)
"""The configuration a clone runs with (command-line scope, via ``GIT_CONFIG_COUNT``)."""

FALLBACK_NAME = "Kyronix"
FALLBACK_EMAIL = "kyronix@localhost"

_TRANSPORT_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SSH_SCHEMES = ("ssh", "git+ssh", "ssh+git")


# ---------------------------------------------------------------------------------------------
# Running git


@dataclass(frozen=True, slots=True)
class GitResult:
    returncode: int
    stdout: str
    stderr: str

    def error_text(self, limit: int = 2000) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        return text[-limit:] if text else f"exit status {self.returncode}"


def git_env(
    call: Call, *, clone: bool = False, config: Sequence[tuple[str, str]] = ()
) -> dict[str, str]:
    """The environment of a git child process (see the module docstring): the credential-
    stripped environment under :func:`kiso.tools.gitsafe.safe_git_env`, plus the clone's
    protocols with ``clone`` and any further ``config`` (a repository's driver overrides, an
    identity)."""
    extra = [*(CLONE_CONFIG if clone else ()), *config]
    env = gitsafe.safe_git_env(child_env(call.env), config=extra)
    if clone:
        env["GIT_ALLOW_PROTOCOL"] = ":".join(ALLOWED_PROTOCOLS)
    parent = call.base.parent
    if parent != call.base:
        env["GIT_CEILING_DIRECTORIES"] = str(parent)
    return env


def run_git(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float = GIT_TIMEOUT_S,
    stdin: bytes | None = None,
    pass_fds: Sequence[int] = (),
) -> GitResult:
    """Run ``git --no-pager args`` in ``env`` (from :func:`git_env`) and return what it did;
    raise :class:`ToolFailure` when git is missing or the timeout passed (the whole process
    group is killed first)."""
    git = shutil.which("git", path=env.get("PATH"))
    if git is None:
        raise ToolFailure(
            "git is not installed (no 'git' on PATH); install git to use the git tools",
            error_type="GitError",
        )
    try:
        proc = subprocess.Popen(
            [git, "--no-pager", *args],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolFailure(
            f"could not start git in {cwd}: {exc.strerror or exc}", error_type="GitError"
        ) from None
    assert proc.stdout is not None and proc.stderr is not None
    captured: dict[str, bytes] = {}
    threads = [
        threading.Thread(target=_drain, args=(proc.stdout, captured, "out"), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, captured, "err"), daemon=True),
    ]
    if stdin is not None:
        assert proc.stdin is not None
        threads.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
    for thread in threads:
        thread.start()
    timed_out = False
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(proc.pid)
        proc.wait()
        for thread in threads:
            thread.join(5)
    if timed_out:
        raise ToolFailure(
            f"git {args[0]} did not finish within {timeout_s:g} s; its processes were killed",
            error_type="Timeout",
        )
    return GitResult(
        proc.returncode,
        captured.get("out", b"").decode("utf-8", "replace"),
        captured.get("err", b"").decode("utf-8", "replace"),
    )


def _drain(stream: IO[bytes], into: dict[str, bytes], key: str) -> None:
    """Read a pipe to its end, keeping the first :data:`OUTPUT_LIMIT` bytes."""
    kept = bytearray()
    try:
        while chunk := stream.read(65536):
            if len(kept) < OUTPUT_LIMIT:
                kept += chunk[: OUTPUT_LIMIT - len(kept)]
    except (OSError, ValueError):
        pass
    finally:
        into[key] = bytes(kept)
        stream.close()


def _feed(stream: IO[bytes], data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        stream.write(data)
    with contextlib.suppress(OSError, ValueError):
        stream.close()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# What may be cloned (pure)


@dataclass(frozen=True, slots=True)
class CloneSource:
    """A repository URL git may fetch: its protocol and the host and port it reaches."""

    url: str
    protocol: str
    """``https``, ``http``, ``ssh`` or ``git``."""
    host: str
    port: int


def parse_clone_source(repository: str) -> CloneSource:
    """Accept https://, http://, ssh://, git:// and scp-like ``user@host:path``; refuse the rest.

    Raises :class:`SecurityError` for what could run a program or read local files (``ext::``
    and every ``<transport>::`` form, ``file://``, local paths, a leading ``-``) and
    :class:`ToolFailure` for other unusable URLs.
    """
    url = repository.strip()
    shown = redact_url(url)
    if not url:
        raise ToolFailure("the repository URL is empty", error_type="InvalidArguments")
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise ToolFailure(
            f"the repository URL {shown!r} contains control characters",
            error_type="InvalidArguments",
        )
    if url.startswith("-"):
        raise SecurityError(
            f"the repository {shown!r} starts with '-', which git would read as an option; "
            f"give an https://, ssh:// or git:// URL"
        )
    if _TRANSPORT_PREFIX.match(url):
        helper = url.split("::", 1)[0]
        raise SecurityError(
            f"the repository {shown!r} uses the '{helper}::' transport form, which runs a remote "
            f"helper program ('ext::' runs any command) and is refused; give an https://, "
            f"ssh:// or git:// URL"
        )
    scheme_match = _URL_SCHEME.match(url)
    if scheme_match:
        scheme = scheme_match.group(1).lower()
        if scheme == "file":
            raise SecurityError(
                f"the repository {shown!r} is a file:// URL; cloning local repositories is "
                f"refused (it can read any file the executer can). Give an https://, ssh:// "
                f"or git:// URL"
            )
        if scheme not in ("https", "http", "git", *_SSH_SCHEMES):
            raise ToolFailure(
                f"the repository {shown!r} uses the scheme {scheme!r}; only https://, http://, "
                f"ssh:// and git:// URLs (or scp-like user@host:path) are accepted",
                error_type="InvalidArguments",
            )
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ToolFailure(
                f"the repository URL {shown!r} is malformed ({exc})",
                error_type="InvalidArguments",
            ) from None
        host = parts.hostname or ""
        protocol = "ssh" if scheme in _SSH_SCHEMES else scheme
        _check_host_and_user(shown, host, parts.username)
        return CloneSource(url, protocol, host, port or DEFAULT_PORTS[protocol])
    colon, slash = url.find(":"), url.find("/")
    if (colon > 0 and (slash == -1 or colon < slash)) or url.startswith("["):
        return _parse_scp(url, shown)
    raise SecurityError(
        f"the repository {shown!r} is a local path; cloning local repositories is refused. "
        f"Give an https://, ssh:// or git:// URL, or scp-like user@host:path"
    )


def _parse_scp(url: str, shown: str) -> CloneSource:
    user: str | None = None
    rest = url
    if rest.startswith("["):
        close = rest.find("]:")
        if close == -1:
            raise ToolFailure(
                f"the repository {shown!r} is not a valid scp-like address ([user@host:port]:path)",
                error_type="InvalidArguments",
            )
        inner, path = rest[1:close], rest[close + 2 :]
        if "@" in inner:
            user, inner = inner.rsplit("@", 1)
        host, port = inner, DEFAULT_PORTS["ssh"]
        if inner.count(":") == 1:
            host, port_text = inner.split(":")
            if not (port_text.isascii() and port_text.isdigit()):
                raise ToolFailure(
                    f"the port in {shown!r} is not a number", error_type="InvalidArguments"
                )
            port = int(port_text)
    elif (at := rest.find("@[")) != -1 and rest.find("]:", at) != -1 and ":" not in rest[:at]:
        # user@[host]:path, as ssh writes an IPv6 literal: git@[::1]:repo is host ::1
        close = rest.find("]:", at)
        user, host, path = rest[:at], rest[at + 2 : close], rest[close + 2 :]
        port = DEFAULT_PORTS["ssh"]
    else:
        hostpart, path = rest.split(":", 1)
        if "@" in hostpart:
            user, hostpart = hostpart.rsplit("@", 1)
        host, port = hostpart, DEFAULT_PORTS["ssh"]
    if not path:
        raise ToolFailure(
            f"the repository {shown!r} has no path after the ':' (user@host:path)",
            error_type="InvalidArguments",
        )
    _check_host_and_user(shown, host, user)
    return CloneSource(url, "ssh", host, port)


def _check_host_and_user(shown: str, host: str, user: str | None) -> None:
    if not host:
        raise ToolFailure(
            f"the repository URL {shown!r} has no host", error_type="InvalidArguments"
        )
    if host.startswith("-") or (user or "").startswith("-"):
        raise SecurityError(
            f"the repository {shown!r} has a host or user name starting with '-', which ssh "
            f"would read as an option; this is refused"
        )


def default_directory(repository: str) -> str:
    """The directory ``git clone`` would create for ``repository`` (git's own rule): the last
    path component without ``.git``; for a bare host, the host without its port."""
    start = repository
    scheme_end = start.find("://")
    if scheme_end != -1:
        start = start[scheme_end + 3 :]
    slash = start.find("/")
    head = start if slash == -1 else start[:slash]
    if "@" in head:
        start = start[head.rfind("@") + 1 :]
    end = start.rstrip("/ \t\n")
    if len(end) > 5 and end.endswith("/.git"):
        end = end[:-5].rstrip("/")
    if "/" not in end:
        end = re.sub(r":\d*$", "", end)
    name = re.split(r"[/:]", end)[-1]
    name = name.removesuffix(".git")
    name = re.sub(r"[\x00-\x20\x7f]+", " ", name).strip()
    return name


# ---------------------------------------------------------------------------------------------
# The tools


def git_clone(call: Call) -> ToolOutput:
    repository: str = call.args["repository"]
    cwd: Path = call.args.get("cwd", call.base)
    source = parse_clone_source(repository)
    shown = redact_url(source.url)
    target: Path | None = call.args.get("directory")
    if target is None:
        name = default_directory(source.url)
        if name in ("", ".", ".."):
            raise ToolFailure(
                f"no directory name can be taken from {shown!r}; pass directory",
                error_type="InvalidArguments",
            )
        target = call.resolve(name, relative_to=cwd)
    decision = call.permissions.decide("tool:git_clone", call.rel(target))
    if not decision.allowed:
        raise SecurityError(decision.reason)
    _refuse_protected_destination(call, target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        what = "a directory that is not empty" if target.is_dir() else "a file"
        raise ToolFailure(
            f"cannot clone into {call.rel(target)}: it is {what}; pass another directory",
            error_type="InvalidArguments",
        )
    guard_host(call, source.host, source.port, what=f"git_clone of {shown}")
    result = run_git(
        ["clone", "--quiet", "--", source.url, str(target)],
        cwd=cwd,
        env=git_env(call, clone=True),
        timeout_s=CLONE_TIMEOUT_S,
        pass_fds=_inherited(call),
    )
    if result.returncode != 0:
        raise ToolFailure(
            f"git clone of {shown} failed: {_redact_text(result.error_text(), source.url)}",
            error_type="GitError",
        )
    repo = _repository(call, target)
    head = repo.out(["rev-parse", "--verify", "-q", "HEAD"])
    branch = repo.out(["symbolic-ref", "--short", "-q", "HEAD"])
    lines = [f"cloned {shown} into {call.rel(target)}"]
    if head:
        subject = repo.out(["log", "-1", "--format=%s", "HEAD"]) or ""
        lines.append(f"HEAD {head[:12]} ({branch or 'detached'}): {subject}")
    else:
        lines.append("the repository is empty (no commits yet)")
    return ToolOutput(
        "\n".join(lines),
        data={"path": call.rel(target), "head": head, "branch": branch},
    )


def git_commit(call: Call) -> ToolOutput:
    message: str = call.args["message"]
    cwd: Path = call.args.get("cwd", call.base)
    if not message.strip():
        raise ToolFailure(
            "the commit message is empty; say what changed", error_type="InvalidArguments"
        )
    if "\x00" in message:
        raise ToolFailure("the commit message contains a NUL byte", error_type="InvalidArguments")
    repo = _repository(call, cwd)
    _check(repo.run(["add", "-A"]), "git add -A")
    staged = repo.run(["diff", "--cached", "--quiet", "--no-ext-diff", "--no-textconv"])
    if staged.returncode == 0:
        raise ToolFailure(
            f"nothing to commit in {call.rel(cwd)}: no file changed since the last commit",
            error_type="NothingToCommit",
        )
    if staged.returncode != 1:
        _check(staged, "git diff --cached")
    committed = repo.with_config(_identity(call, repo)).run(
        ["commit", "--quiet", "--no-verify", "--cleanup=whitespace", "-F", "-"],
        stdin=message.encode("utf-8"),
    )
    _check(committed, "git commit")
    commit = repo.out(["rev-parse", "HEAD"]) or ""
    branch = repo.out(["symbolic-ref", "--short", "-q", "HEAD"])
    changed = repo.run(["diff-tree", "-r", "--root", "--no-commit-id", "--name-only", "-z", "HEAD"])
    files = [f for f in changed.stdout.split("\x00") if f]
    summary = message.strip().splitlines()[0]
    noun = "file" if len(files) == 1 else "files"
    return ToolOutput(
        f"[{branch or 'detached HEAD'} {commit[:7]}] {summary}\n{len(files)} {noun} changed",
        data={"commit": commit, "branch": branch, "files_changed": len(files), "files": files},
    )


def git_branch(call: Call) -> ToolOutput:
    name: str = call.args["name"]
    create: bool = call.args.get("create", False)
    cwd: Path = call.args.get("cwd", call.base)
    if "\x00" in name:
        raise ToolFailure("the branch name contains a NUL byte", error_type="InvalidArguments")
    if name.startswith("-"):
        raise ToolFailure(
            f"the branch name {name!r} starts with '-', which git would read as an option; "
            f"choose another name",
            error_type="InvalidArguments",
        )
    repo = _repository(call, cwd)
    valid = repo.run(["check-ref-format", "--branch", name])
    # --branch expands @{-1} to the previous branch; a name must stand for itself ("@" is HEAD).
    expanded = valid.stdout.strip()
    if valid.returncode != 0 or expanded != name or name == "@":
        raise ToolFailure(
            f"{name!r} is not a valid branch name (no spaces, '..', '~', '^', ':', '?', '*', "
            f"'[', '\\', '@{{', or trailing '.lock'; not '@'); choose another name",
            error_type="InvalidArguments",
        )
    ref = f"refs/heads/{name}"
    existed = repo.run(["show-ref", "--verify", "--quiet", ref]).returncode == 0
    switched = repo.run(["switch", "-c", name] if create else ["switch", name])
    if switched.returncode != 0:
        if create and existed:
            hint = "; it exists already: pass create=false to switch to it"
        elif not create and not existed:
            hint = "; pass create=true to create it"
        else:
            hint = ""
        raise ToolFailure(
            f"could not switch to the branch {name!r}: {switched.error_text()}{hint}",
            error_type="GitError",
        )
    created = not existed
    head = repo.out(["rev-parse", "--verify", "-q", "HEAD"])
    verb = "created and switched to" if created else "switched to"
    return ToolOutput(
        f"{verb} branch {name!r}" + (f" at {head[:7]}" if head else ""),
        data={"branch": name, "created": created, "head": head},
    )


# ---------------------------------------------------------------------------------------------
# The repository, checked and pinned


@dataclass(frozen=True, slots=True)
class Repository:
    """A repository whose parts were checked to lie inside the base, and the environment that
    pins every later git command to exactly those parts (``GIT_DIR``, ``GIT_WORK_TREE``), with
    the repository's drivers neutralised."""

    call: Call
    cwd: Path
    location: gitsafe.GitLocation
    config: tuple[tuple[str, str], ...]

    def env(self) -> dict[str, str]:
        env = git_env(self.call, config=self.config)
        env["GIT_DIR"] = str(self.location.git_dir)
        if self.location.work_tree is not None:
            env["GIT_WORK_TREE"] = str(self.location.work_tree)
        return env

    def with_config(self, extra: Sequence[tuple[str, str]]) -> Repository:
        return Repository(self.call, self.cwd, self.location, (*self.config, *extra))

    def run(self, args: Sequence[str], *, stdin: bytes | None = None) -> GitResult:
        return run_git(
            args, cwd=self.cwd, env=self.env(), stdin=stdin, pass_fds=_inherited(self.call)
        )

    def out(self, args: Sequence[str]) -> str | None:
        result = self.run(args)
        text = result.stdout.strip()
        return text if result.returncode == 0 and text else None


def _repository(call: Call, cwd: Path) -> Repository:
    """Locate the repository of ``cwd`` with hardened git and refuse it unless its git dir,
    common dir, work tree and object alternates all lie inside the base."""
    env = git_env(call)
    found = run_git(gitsafe.LOCATE_QUERY, cwd=cwd, env=env, pass_fds=_inherited(call))
    location = gitsafe.parse_location(found.stdout) if found.returncode == 0 else None
    if location is None:
        if "safe.bareRepository" in found.stderr:
            raise SecurityError(
                f"{call.rel(cwd)} is a bare repository (a directory holding HEAD, config, "
                f"objects/ and refs/ itself); bare repositories are only used when named "
                f"explicitly, so the git tools refuse it. Use a repository with a .git directory"
            )
        raise ToolFailure(
            f"not a git repository: {call.rel(cwd)} (git_clone or `git init` first)",
            error_type="NotARepository",
        )
    parts = [("git directory", location.git_dir), ("common directory", location.common_dir)]
    if location.work_tree is None:
        raise SecurityError(
            f"the repository of {call.rel(cwd)} has no work tree; the git tools refuse it"
        )
    parts.append(("work tree", location.work_tree))
    for what, where in parts:
        if not _inside(call.base, where):
            raise SecurityError(
                f"the repository of {call.rel(cwd)} has its {what} at {where}, outside the base "
                f"{call.base} (through a .git file, core.worktree or commondir); the git tools "
                f"only work on repositories that lie wholly inside the base"
            )
    borrowed = gitsafe.outside_alternates(location.common_dir, call.base)
    if borrowed:
        raise SecurityError(
            f"the repository of {call.rel(cwd)} reads objects from outside the base "
            f"(objects/info/alternates: {', '.join(borrowed[:3])}); the git tools refuse it"
        )
    pinned = Repository(call, cwd, location, ())
    names = run_git(gitsafe.DRIVER_QUERY, cwd=cwd, env=pinned.env(), pass_fds=_inherited(call))
    drivers = gitsafe.driver_overrides(gitsafe.config_names(names.stdout))
    return pinned.with_config(drivers)


def _inside(base: Path, path: Path) -> bool:
    return path == base or base in path.parents


def _inherited(call: Call) -> tuple[int, ...]:
    return tuple(getattr(call, "inherit_fds", ()) or ())


def _refuse_protected_destination(call: Call, target: Path) -> None:
    """A clone writes its destination: the policies that deny ``write_file`` a path (under
    ``SAFE_POLICIES``: ``.git/``, ``.env*``, key files) deny the clone that path too, by the
    same matching (:meth:`Policy.matches`)."""
    rel = call.rel(target)
    for policy in call.permissions.policies:
        if policy.effect == "deny" and policy.matches("tool:write_file", rel):
            why = policy.reason or f"a policy denies {policy.action}"
            raise SecurityError(
                f"tool:git_clone is denied on {rel!r}: a clone writes there, and writing it is "
                f"denied ({why})"
            )


def _identity(call: Call, repo: Repository) -> list[tuple[str, str]]:
    """``user.name`` / ``user.email`` for whichever the repository does not configure: your
    global git config's value (read as a value; nothing else of it is used), else the fallback
    (unless the environment names one)."""
    out: list[tuple[str, str]] = []
    env = call.env
    for key, fallback, from_env in (
        ("user.name", FALLBACK_NAME, env.get("GIT_AUTHOR_NAME") and env.get("GIT_COMMITTER_NAME")),
        (
            "user.email",
            FALLBACK_EMAIL,
            env.get("EMAIL") or (env.get("GIT_AUTHOR_EMAIL") and env.get("GIT_COMMITTER_EMAIL")),
        ),
    ):
        if repo.run(["config", key]).returncode == 0:
            continue
        user = _user_global(call, key)
        if user:
            out.append((key, user))
        elif not from_env:
            out.append((key, fallback))
    return out


def _user_global(call: Call, key: str) -> str | None:
    """One value of the user's global git config (``--global`` reads no include), read outside
    any repository."""
    env = {
        k: v
        for k, v in child_env(call.env).items()
        if (k not in ("GIT_DIR", "GIT_WORK_TREE") and not k.startswith("GIT_CONFIG_"))
        or k == "GIT_CONFIG_GLOBAL"
    }
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    result = run_git(["config", "--global", "--get", key], cwd=Path("/"), env=env)
    value = result.stdout.strip()
    return value if result.returncode == 0 and value and "\n" not in value else None


def _check(result: GitResult, what: str) -> None:
    if result.returncode != 0:
        raise ToolFailure(f"{what} failed: {result.error_text()}", error_type="GitError")


def _redact_text(text: str, url: str) -> str:
    try:
        password = urlsplit(url).password
    except ValueError:
        return text
    return text.replace(password, "***") if password else text


_WRITE_NOTE = " (hooks disabled)"

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="git_clone",
        params=(
            Param("repository", "string", description="https://, ssh://, git:// or user@host:path"),
            Param(
                "directory",
                "path",
                required=False,
                relative_to="cwd",
                description="where to clone (default: the repository's name, in cwd)",
            ),
            Param("cwd", "dir", required=False, description="the directory to clone in"),
        ),
        handler=git_clone,
        description="Clone a repository with git" + _WRITE_NOTE,
        writes=True,
        # A second clone refuses the non-empty directory the first made.
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        name="git_commit",
        params=(
            Param("message", "string", description="the commit message"),
            Param("cwd", "dir", required=False, description="a directory in the repository"),
        ),
        handler=git_commit,
        description="Stage every change (git add -A) and commit it" + _WRITE_NOTE,
        writes=True,
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        name="git_branch",
        params=(
            Param("name", "string", description="the branch name"),
            Param("create", "boolean", required=False, description="create it (default false)"),
            Param("cwd", "dir", required=False, description="a directory in the repository"),
        ),
        handler=git_branch,
        description="Switch to a branch, or create it and switch to it" + _WRITE_NOTE,
        writes=True,
        # create=true a second time fails: the branch exists.
        read_only=False,
        idempotent=False,
    ),
)
