"""safe-defaults: ask before a shell command reaches the network; never write a lockfile.

Install it as a user extension (docs/extensions.md walks through it):

    mkdir -p ~/.kiso/extensions && cp examples/extensions/safe_defaults.py ~/.kiso/extensions/

An extension can only make kiso stricter: in ``bypass`` mode a ``curl`` still asks, and in every
mode a write to ``uv.lock`` is denied; it can never make the default mode's question go away.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePath

from kiso.runtime.extensions import Extension
from kiso.runtime.hooks import CallContext, Hook, Verdict

NETWORK_PROGRAMS = {"curl", "wget", "ssh", "scp", "sftp", "rsync", "nc", "ncat", "telnet", "ftp"}
NETWORK_SUBCOMMANDS = {
    "git": {"push", "pull", "fetch", "clone", "ls-remote", "submodule"},
    "pip": {"install", "download"},
    "pip3": {"install", "download"},
    "uv": {"add", "sync", "lock", "pip"},
    "npm": {"install", "i", "ci", "add", "update", "publish"},
    "pnpm": {"install", "i", "add", "update", "publish"},
    "yarn": {"install", "add", "upgrade", "publish"},
    "cargo": {"install", "update", "fetch", "publish"},
    "poetry": {"install", "add", "update", "lock", "publish"},
}
LOCKFILES = {
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "poetry.lock",
    "Cargo.lock",
    "uv.lock",
    "Pipfile.lock",
    "Gemfile.lock",
    "composer.lock",
    "go.sum",
}
WRITE_TOOLS = {"write_file", "edit_file"}


def network_program(command: str) -> str | None:
    """The first network program (or subcommand) the command runs, e.g. ``git push``."""
    for segment in re.split(r"&&|\|\||[;|&\n]", command):
        try:
            words = shlex.split(segment)
        except ValueError:
            words = segment.split()
        while words and ("=" in words[0] or words[0] in {"sudo", "env", "command", "exec"}):
            words = words[1:]  # FOO=1 curl..., sudo curl...
        if not words:
            continue
        program = PurePath(words[0]).name
        if program in NETWORK_PROGRAMS:
            return program
        if program in {"python", "python3"} and words[1:3] == ["-m", "pip"]:
            program, words = "pip", words[2:]
        sub = next((w for w in words[1:] if not w.startswith("-")), None)
        if sub is not None and sub in NETWORK_SUBCOMMANDS.get(program, set()):
            return f"{program} {sub}"
    return None


def is_lockfile(path: str) -> bool:
    name = PurePath(path).name
    return name in LOCKFILES or name.endswith(".lock")


class SafeDefaults(Hook):
    name = "safe-defaults"

    def before_tool(self, ctx: CallContext) -> Verdict | None:
        data = ctx.call.input
        if ctx.call.name == "shell" and isinstance(data.get("command"), str):
            found = network_program(data["command"])
            if found is not None:
                return Verdict("ask", self.name, f"this command uses the network ({found})")
        path = data.get("path")
        if ctx.call.name in WRITE_TOOLS and isinstance(path, str) and is_lockfile(path):
            return Verdict(
                "deny",
                self.name,
                f"{path} is a lockfile: change the manifest and let the package manager "
                f"regenerate it (ask the user to run it)",
            )
        return None  # abstain: the mode, the floor and the rules decide


extension = Extension(
    name="safe-defaults",
    description="ask before network commands; deny writes to lockfiles",
    hooks=[SafeDefaults()],
)
