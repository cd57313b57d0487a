"""``terminal``: a shell command, run by the runtime's one shell runner.

The command runs in its own process group with stdin closed, a timeout that kills the whole group,
a cap on the output kept (head and tail), and an environment with credentials removed
(:func:`kiso.tools.env.child_env`; the names the executer was given as ``pass_env`` are passed
through). The command inherits the execution's liveness guard, so while any of its processes
lives the execution is reported *running*; when the executer is killed (``kill -9`` included)
the shell supervisor kills them. ``cwd`` is sandboxed like any path, but the command itself can
do anything the executer's user can, except what the executer's OS sandbox
(:mod:`kiso.tools.sandbox`, on by default: the base writable, the rest read-only, credentials
hidden, no network) takes away: path checks cannot contain a shell, the sandbox does. A command is
never run unsandboxed because bubblewrap is missing: it fails and says so, unless the executer
was started with ``--sandbox off``. ``SAFE_POLICIES`` still refuse ``terminal`` until allowed.

While the command runs, what it prints is handed, chunk by chunk, to the callable in
:data:`OUTPUT_SINK` when the executer set one (``execute(on_progress=...)``); it is called from
the reader thread, for display only, and what it raises is ignored.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path

from kiso.tools.env import child_env
from kiso.tools.sandbox import denial
from kiso.tools.shell import DEFAULT_OUTPUT_LIMIT, run_command
from kyronix.executer.tools.base import Call, Param, ToolFailure, ToolOutput, ToolSpec

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_TIMEOUT_S", "OUTPUT_SINK", "TOOLS"]

DEFAULT_TIMEOUT_S = 120
MAX_TIMEOUT_S = 3600

OUTPUT_SINK: ContextVar[Callable[[str], None] | None] = ContextVar(
    "kyronix_terminal_output", default=None
)
"""Where the running command's output goes as it is printed (set by the executer around one
call; the worker thread the handler runs in inherits it with the context)."""


def _shell_path(name: str) -> str:
    """The absolute path of the shell the caller named (``bash``, ``/bin/sh``, ``zsh``)."""
    found = name if os.path.isabs(name) else shutil.which(name)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise ToolFailure(
            f"the shell {name!r} was not found or is not executable; leave shell out to use "
            f"bash, or name an installed shell such as 'sh'",
            error_type="InvalidArguments",
        )
    return found


def terminal(call: Call) -> ToolOutput:
    command: str = call.args["command"]
    cwd: Path = call.args["cwd"]
    if not command.strip():
        raise ToolFailure("the command is empty", error_type="InvalidArguments")
    if "\x00" in command:
        raise ToolFailure("the command contains a NUL byte", error_type="InvalidArguments")
    shell = _shell_path(call.args["shell"]) if "shell" in call.args else None
    timeout_s = call.args.get("timeout", DEFAULT_TIMEOUT_S)
    if not 1 <= timeout_s <= MAX_TIMEOUT_S:
        raise ToolFailure(
            f"timeout is in seconds, from 1 to {MAX_TIMEOUT_S}; got {timeout_s}",
            error_type="InvalidArguments",
        )
    sandbox = call.sandbox
    if sandbox is not None and not sandbox.available:
        raise ToolFailure(
            f"the command was not run: the executer's sandbox cannot be made here "
            f"({sandbox.reason}). Install bubblewrap, or start the executer with --sandbox off "
            f"(KyronixExecuter(sandbox='off')) to run commands with the executer's full access",
            error_type="SandboxUnavailable",
        )
    try:
        result = run_command(
            command,
            cwd=cwd,
            env=child_env(call.env, keep=call.pass_env),
            timeout_ms=timeout_s * 1000,
            output_limit=DEFAULT_OUTPUT_LIMIT,
            shell=shell,
            pass_fds=call.inherit_fds,
            on_output=OUTPUT_SINK.get(),
            sandbox=sandbox,
        )
    except OSError as exc:
        raise ToolFailure(f"could not start the shell in {call.rel(cwd)}: {exc.strerror}") from None
    # The output is what the command printed, as it printed it; how it ended is in data/error.
    data = {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "bytes": result.total_bytes,
        "cwd": str(cwd),
        "strays_killed": result.strays_killed,
    }
    if result.timed_out or result.exit_code != 0:
        if result.timed_out:
            why = f"the command timed out after {timeout_s} s; its process group was killed"
        elif result.exit_code is not None and result.exit_code < 0:
            why = f"the command was killed by signal {-result.exit_code}"
        else:
            why = f"the command exited with status {result.exit_code}"
        if sandbox is not None and not result.timed_out:
            denied = denial(sandbox, result.exit_code, result.output)
            if denied is not None:
                why += (
                    f"; it ran in the {sandbox.mode} sandbox and probably failed because {denied}"
                )
                data["sandbox"] = sandbox.mode
        raise ToolFailure(
            why,
            error_type="Timeout" if result.timed_out else "CommandFailed",
            data=data,
            output=result.output,
            truncated=result.truncated,
        )
    return ToolOutput(result.output, data, truncated=result.truncated)


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "terminal",
        (
            Param("command", "string"),
            Param("cwd", "dir", required=False),
            Param("shell", "string", required=False),
            Param("timeout", "integer", required=False),
        ),
        terminal,
        "Run a shell command (own process group, timeout, output cap, no credentials).",
        writes=True,
        read_only=False,
        idempotent=False,
    ),
)
