"""Running git in a repository nobody vouched for, without running a program it names.

A repository's configuration can name programs git runs on its own: filter drivers (``clean``,
``smudge``, ``process``), diff and merge drivers, hooks, ``core.fsmonitor``, a pager, an editor,
an external diff, ssh and credential helpers, a signing program. A repository that arrived as an
archive (or was written by a model) brings its ``.git/config`` with it, and ``include.path`` /
``includeIf`` can pull more configuration in from anywhere. This module is the one hardening
every git kiso or Kyronix runs goes through:

- :data:`HARDENING`: every program-naming setting switched off, given as *command-line scope*
  configuration (which outranks every config file, included ones too). It is passed through
  ``GIT_CONFIG_COUNT`` / ``GIT_CONFIG_KEY_<n>`` / ``GIT_CONFIG_VALUE_<n>`` rather than ``-c``:
  ``-c`` splits at the first ``=``, so ``-c filter.a=b.clean=cat`` would not reach a filter
  named ``a=b``; the environment form takes any key;
- :func:`driver_overrides`: the driver names the repository's config defines (``filter.<x>.*``,
  ``diff.<x>.*``, ``merge.<x>.*``), read *with* includes, exactly as git will see them, each
  replaced by a harmless one (``clean=cat``, ``smudge=cat``, ``process=`` (empty),
  ``textconv=cat``, ...). An attributes file can only name a driver; a driver without a
  command in config does nothing;
- :func:`safe_git_env`: no system or global config (``GIT_CONFIG_NOSYSTEM``,
  ``GIT_CONFIG_GLOBAL=/dev/null``), none of the variables that move the repository, inject
  configuration or name a program, never a prompt, no lazy fetch;
- ``safe.bareRepository=explicit``: a bare repository is used only when named explicitly, so a
  directory written to *look* like one (``x/HEAD``, ``x/config``, ``x/objects/``) is refused;
- ``protocol.allow=never``: nothing reaches the network (a partial clone's lazy fetch included)
  unless the caller allows protocols (a clone).

:func:`locate` says where a repository really is (its git dir, common dir and work tree, with
``core.worktree`` and ``.git`` files applied), for callers that must keep git inside a
directory (Kyronix's git tools refuse a repository any of whose parts lies outside the base).

It is for running git's own operations on a repository kiso did not create (the status the
system prompt shows, a commit); it does not make a hostile repository safe to *build* or *test*.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DRIVER_OVERRIDES",
    "DRIVER_QUERY",
    "HARDENING",
    "LOCATE_QUERY",
    "GitLocation",
    "SafeGitResult",
    "config_env",
    "config_names",
    "driver_overrides",
    "locate",
    "outside_alternates",
    "parse_location",
    "read_driver_names",
    "safe_git",
    "safe_git_env",
]

HARDENING: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.pager", "cat"),
    ("core.editor", "true"),
    ("sequence.editor", "true"),
    ("core.sshCommand", "false"),
    ("core.askPass", ""),
    ("credential.helper", ""),
    ("diff.external", ""),
    ("gpg.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    ("gpg.ssh.defaultKeyCommand", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("safe.bareRepository", "explicit"),
    ("protocol.allow", "never"),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("core.splitIndex", "false"),
)
"""Settings that switch off every program a repository's config can name (but drivers, whose
names the repository chooses: :func:`driver_overrides` neutralises those one by one)."""

DRIVER_OVERRIDES: Mapping[str, tuple[tuple[str, str], ...]] = {
    "filter": (("clean", "cat"), ("smudge", "cat"), ("process", ""), ("required", "false")),
    "diff": (("textconv", "cat"), ("command", "true"), ("cachetextconv", "false")),
    "merge": (("driver", "false"),),
}
"""For each driver kind: the settings that make a driver of that kind run nothing but ``cat``
(an empty ``clean`` does *not* disable a filter; ``cat`` does)."""

_DROPPED = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_DISCOVERY_ACROSS_FILESYSTEM",
        "GIT_CEILING_DIRECTORIES",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_CONFIG_SYSTEM",
        "GIT_CONFIG_GLOBAL",
        "GIT_EXTERNAL_DIFF",
        "GIT_EDITOR",
        "GIT_SEQUENCE_EDITOR",
        "GIT_PAGER",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_SSH_VARIANT",
        "GIT_PROXY_COMMAND",
        "GIT_EXEC_PATH",
        "GIT_TEMPLATE_DIR",
        "GIT_PROTOCOL_FROM_USER",
        "GIT_ALLOW_PROTOCOL",
        "GIT_REPLACE_REF_BASE",
        "PAGER",
        "EDITOR",
        "VISUAL",
    }
)

SafeGitResult = subprocess.CompletedProcess


def config_env(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``GIT_CONFIG_COUNT`` and its ``GIT_CONFIG_KEY_<n>`` / ``GIT_CONFIG_VALUE_<n>`` for
    ``pairs``: command-line scope configuration that takes any key (``filter.a=b.clean``)."""
    env: dict[str, str] = {}
    count = 0
    for key, value in pairs:
        env[f"GIT_CONFIG_KEY_{count}"] = key
        env[f"GIT_CONFIG_VALUE_{count}"] = value
        count += 1
    env["GIT_CONFIG_COUNT"] = str(count)
    return env


def safe_git_env(
    environ: Mapping[str, str] | None = None, *, config: Iterable[tuple[str, str]] = ()
) -> dict[str, str]:
    """The environment for a hardened git: no variable that moves the repository, injects
    configuration or names a program; no system or global config; never a prompt; the
    :data:`HARDENING` settings and then ``config`` (later settings win) in command-line scope."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k not in _DROPPED and not k.startswith("GIT_CONFIG_")}
    env.update(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",  # reading never rewrites the index
            "GIT_NO_LAZY_FETCH": "1",  # git >= 2.44; protocol.allow=never covers older ones
            "GCM_INTERACTIVE": "never",
            "LC_ALL": "C",
        }
    )
    env.update(config_env([*HARDENING, *config]))
    return env


def driver_overrides(config_names: Iterable[str]) -> list[tuple[str, str]]:
    """The settings that neutralise every driver whose keys appear in ``config_names`` (names
    as ``git config --name-only`` prints them: ``filter.<name>.<key>``)."""
    drivers: set[tuple[str, str]] = set()
    for key in config_names:
        section, _, rest = key.partition(".")
        name, dot, _last = rest.rpartition(".")
        if dot and section.lower() in DRIVER_OVERRIDES:
            drivers.add((section.lower(), name))
    out: list[tuple[str, str]] = []
    for section, name in sorted(drivers):
        out += [(f"{section}.{name}.{k}", v) for k, v in DRIVER_OVERRIDES[section]]
    return out


DRIVER_QUERY: tuple[str, ...] = (
    "config",
    "--null",
    "--name-only",
    "--get-regexp",
    r"^(filter|diff|merge)\.",
)
"""``git`` arguments that print every driver key git sees in a repository, includes followed
(``git config`` reads them by default, exactly as git will; reading config runs no program)."""


def config_names(stdout: bytes | str) -> list[str]:
    """The keys ``git`` :data:`DRIVER_QUERY` printed (NUL-separated)."""
    text = stdout.decode("utf-8", "surrogateescape") if isinstance(stdout, bytes) else stdout
    return [k for k in text.split("\0") if k]


def read_driver_names(
    cwd: str | os.PathLike[str], env: Mapping[str, str], timeout: float
) -> list[str]:
    """Every ``filter.*``, ``diff.*`` and ``merge.*`` key git sees in ``cwd``'s repository."""
    found = subprocess.run(
        ["git", *DRIVER_QUERY],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return config_names(found.stdout)


@dataclass(frozen=True, slots=True)
class GitLocation:
    """Where a repository's parts really are (absolute, symlinks resolved)."""

    git_dir: Path
    common_dir: Path
    work_tree: Path | None
    """None for a bare repository (only ever used when named explicitly)."""


LOCATE_QUERY: tuple[str, ...] = (
    "rev-parse",
    "--path-format=absolute",
    "--git-dir",
    "--git-common-dir",
    "--is-bare-repository",
    "--show-toplevel",
)
"""``git`` arguments that print where the repository of the current directory really is."""


def parse_location(stdout: bytes | str) -> GitLocation | None:
    """What ``git`` :data:`LOCATE_QUERY` printed, resolved; None when it printed too little."""
    text = stdout.decode("utf-8", "surrogateescape") if isinstance(stdout, bytes) else stdout
    lines = text.splitlines()
    if len(lines) < 3:
        return None
    git_dir, common_dir, bare = lines[0], lines[1], lines[2] == "true"
    top = lines[3] if len(lines) > 3 and not bare else None
    return GitLocation(
        Path(os.path.realpath(git_dir)),
        Path(os.path.realpath(common_dir)),
        Path(os.path.realpath(top)) if top else None,
    )


def locate(
    cwd: str | os.PathLike[str], env: Mapping[str, str], timeout: float
) -> GitLocation | subprocess.CompletedProcess[bytes]:
    """The repository git would use in ``cwd`` (``.git`` files, ``core.worktree`` and
    ``commondir`` applied), or git's failed process (not a repository, a bare repository that
    ``safe.bareRepository=explicit`` refuses, ...). Runs no program the repository names."""
    done = subprocess.run(
        ["git", *LOCATE_QUERY],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    found = parse_location(done.stdout) if done.returncode == 0 else None
    return found if found is not None else done


def outside_alternates(common_dir: Path, inside: Path) -> list[str]:
    """The object directories ``objects/info/alternates`` borrows from outside ``inside``
    (a repository can read another's objects through them)."""
    alternates = common_dir / "objects" / "info" / "alternates"
    try:
        text = alternates.read_text("utf-8", "surrogateescape")
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError:
        return [str(alternates)]
    outside: list[str] = []
    for line in text.splitlines():
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        entry = entry.strip('"')
        real = os.path.realpath(os.path.join(common_dir / "objects", entry))
        if real != str(inside) and os.path.commonpath((str(inside), real)) != str(inside):
            outside.append(entry)
    return outside


def safe_git(
    args: Sequence[str], cwd: str | os.PathLike[str], *, timeout: float = 5.0
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git <args>`` in ``cwd`` with nothing the repository names able to run. Raises
    ``OSError`` (git missing) or ``subprocess.TimeoutExpired``; a git error is a non-zero
    ``returncode``, never an exception."""
    where = Path(cwd)
    env = safe_git_env()
    drivers = driver_overrides(read_driver_names(where, env, timeout))
    if drivers:
        env = safe_git_env(config=drivers)
    return subprocess.run(
        ["git", "--no-pager", *args],
        cwd=where,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
