"""Running git in a repository nobody vouched for, without running a program it names.

A repository's configuration can name programs git runs on its own: filter drivers (``clean``,
``smudge``, ``process``), hooks, ``core.fsmonitor``, a pager, an editor, an external diff, ssh and
credential helpers, a signing program. A repository that arrived as an archive (or was written by
a model) brings its ``.git/config`` with it. :func:`safe_git` runs git with every one of those
turned off on the command line (which outranks every config file), with system and global config
ignored, and every filter driver the repository defines replaced by ``cat``.

It is for reading a repository kiso did not create (the branch and status the system prompt
shows); it does not make a hostile repository safe to *build* or *test*.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["HARDENING", "SafeGitResult", "safe_git", "safe_git_env"]

HARDENING: tuple[str, ...] = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.pager=cat",
    "-c",
    "core.editor=true",
    "-c",
    "core.sshCommand=false",
    "-c",
    "core.askPass=",
    "-c",
    "credential.helper=",
    "-c",
    "diff.external=",
    "-c",
    "gpg.program=false",
    "-c",
    "sequence.editor=true",
    "-c",
    "safe.bareRepository=explicit",
    "-c",
    "protocol.allow=never",
)
"""``-c`` options that switch off every program a repository's config can name (but filters,
whose names the repository chooses: :func:`safe_git` neutralises those one by one)."""

_DROPPED = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_CONFIG_SYSTEM",
        "GIT_EXTERNAL_DIFF",
        "GIT_EDITOR",
        "GIT_SEQUENCE_EDITOR",
        "GIT_PAGER",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "GIT_SSH",
        "GIT_SSH_COMMAND",
        "GIT_EXEC_PATH",
        "GIT_TEMPLATE_DIR",
        "PAGER",
        "EDITOR",
        "VISUAL",
    }
)

SafeGitResult = subprocess.CompletedProcess


def safe_git_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a hardened git: no variable that moves the repository, injects
    configuration or names a program; no system or global config; never a prompt."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k not in _DROPPED and not k.startswith("GIT_CONFIG_")}
    env.update(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",  # reading never rewrites the index
            "GCM_INTERACTIVE": "never",
            "LC_ALL": "C",
        }
    )
    return env


def _filter_overrides(cwd: Path, env: Mapping[str, str], timeout: float) -> list[str]:
    """``-c filter.<name>.clean=cat ...`` for every filter driver the repository's config names
    (reading config runs no program)."""
    found = subprocess.run(
        ["git", *HARDENING, "config", "--null", "--name-only", "--get-regexp", r"^filter\."],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    names: set[str] = set()
    for key in found.stdout.decode("utf-8", "replace").split("\0"):
        parts = key.split(".")
        if len(parts) >= 3 and parts[0] == "filter":
            names.add(".".join(parts[1:-1]))
    out: list[str] = []
    for name in sorted(names):
        for setting, value in (
            ("clean", "cat"),
            ("smudge", "cat"),
            ("process", ""),
            ("required", "false"),
        ):
            out += ["-c", f"filter.{name}.{setting}={value}"]
    return out


def safe_git(
    args: Sequence[str], cwd: str | os.PathLike[str], *, timeout: float = 5.0
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git <args>`` in ``cwd`` with nothing the repository names able to run. Raises
    ``OSError`` (git missing) or ``subprocess.TimeoutExpired``; a git error is a non-zero
    ``returncode``, never an exception."""
    where = Path(cwd)
    env = safe_git_env()
    filters = _filter_overrides(where, env, timeout)
    return subprocess.run(
        ["git", "--no-pager", *HARDENING, *filters, *args],
        cwd=where,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
