"""The one shell runner (:func:`run_command`) and the ``shell`` tool built on it.

Guarantees of :func:`run_command`:

* the command runs as ``/bin/bash -c command`` (``/bin/sh`` when bash is missing) in its own
  process group and session, with stdin from ``/dev/null``, so it can neither read the caller's
  terminal nor wait for input. It is started, watched and stopped by a small supervisor process
  (:mod:`kiso.tools.supervisor`, a stdlib-only script run with ``python -I -S``) that lives in a
  session of its own, so a signal to kiso's process group reaches neither of them;
* stdout and stderr are merged and read by a thread while the command runs, so a chatty child never
  blocks on a full pipe; only the head and the tail of the output are kept (half the limit each),
  the middle is replaced by one ``[... N bytes omitted ...]`` line and the true total is reported;
* ``on_output``, when given, is called from the reader thread with each chunk as it is read,
  decoded incrementally (a character split across reads arrives whole); it is for display only,
  and an exception it raises is swallowed;
* on timeout or cancellation (``cancelled`` is polled every 50 ms) every process of the command is
  killed: SIGTERM, up to 1 s for it to go, then SIGKILL. Processes the command leaves running in
  the background when it exits are killed the same way (``strays_killed``). Either way, when the
  call returns no process of the command is alive (zombies waiting for init to reap them are not
  alive). The exit status is the shell's, ``-signal`` when a signal ended it;
* **a killed kiso leaves nothing running**: the supervisor holds the read end of a pipe whose only
  write end is kiso's, so when kiso dies, by SIGKILL too, it sees end-of-file (on Linux
  ``PR_SET_PDEATHSIG`` tells it as well) and SIGKILLs every process of the command at once;
* "every process of the command" is, on Linux, every descendant of the supervisor: it is a child
  subreaper (``PR_SET_CHILD_SUBREAPER``), so a process that double-forks or calls ``setsid`` to
  leave the group is re-parented to it and found through ``/proc``. Elsewhere (macOS: no
  ``prctl``, no ``/proc``) it is the command's process group, and a process that starts its own
  session escapes; kiso's death is still noticed through the pipe;
* ``pass_fds`` are inherited by the supervisor and the command (and by whatever they start and do
  not close): the runtime passes its liveness guard (:mod:`kiso.runtime.liveness`) this way.

What still escapes is a process started through another service (``systemd-run``, ``at``, a
daemon, ``ssh``, a container engine): it is nobody's descendant. docs/shell.md says what contains
that (bubblewrap).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kiso.kernel.errors import UsageError
from kiso.tools import supervisor
from kiso.tools.base import Effects, Tool, ToolContext, ToolResult, define_tool
from kiso.tools.env import child_env
from kiso.tools.sandbox import Sandbox, denial

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "DEFAULT_TIMEOUT_MS",
    "MAX_TIMEOUT_MS",
    "SHELL",
    "CommandResult",
    "SupervisorError",
    "format_command_result",
    "run_command",
]

DEFAULT_TIMEOUT_MS = 120_000
MAX_TIMEOUT_MS = 600_000
DEFAULT_OUTPUT_LIMIT = 30_000

_POLL_S = 0.05
_TERM_GRACE_S = supervisor.TERM_GRACE_S
_KILL_WAIT_S = supervisor.KILL_WAIT_S
_FINISH_S = supervisor.STRAY_GRACE_S + _TERM_GRACE_S + _KILL_WAIT_S + 5.0
"""How long the supervisor may take, once the shell ended or was stopped, to clear everything."""
_READ_CHUNK = 65_536


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one command did. ``exit_code`` is None when kiso killed it (timeout or cancel)."""

    exit_code: int | None
    """The shell's exit status; negative (``-signal``) when a signal it did not catch ended it."""
    output: str
    """Merged stdout and stderr as UTF-8 (bad bytes replaced), head and tail when truncated."""
    total_bytes: int
    """How many bytes the command wrote in all, including the omitted middle."""
    truncated: bool
    timed_out: bool
    cancelled: bool
    ms: int
    strays_killed: bool = False
    """The command exited but left processes of its group running; they were killed."""


def run_command(
    command: str,
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_ms: int,
    cancelled: Callable[[], bool] = lambda: False,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    on_output: Callable[[str], None] | None = None,
    shell: str | None = None,
    pass_fds: Sequence[int] = (),
    sandbox: Sandbox | None = None,
) -> CommandResult:
    """Run ``command`` in a shell and return what it did; see the module docstring.

    Raises ValueError for a non-positive ``timeout_ms``, a negative ``output_limit``, a NUL byte
    in ``command`` or a ``pass_fds`` entry below 3, and OSError when the shell cannot be started
    (for example a missing ``cwd``, or a ``shell`` that does not exist). If ``cancelled()`` is
    already true nothing is started. ``shell`` is the absolute path of the shell to run the
    command with (``shell -c command``); the default is bash, else sh. ``pass_fds`` are open file
    descriptors the supervisor and the command inherit (the runtime's liveness guard).
    ``sandbox``: run the command inside it (:mod:`kiso.tools.sandbox`; bubblewrap), when it is
    available; the caller says so to the person when it is not.
    """
    if timeout_ms <= 0:
        raise UsageError(f"timeout_ms must be positive, got {timeout_ms}")
    if output_limit < 0:
        raise UsageError(f"output_limit must be 0 or more, got {output_limit}")
    fds = tuple(pass_fds)
    if any(isinstance(fd, bool) or not isinstance(fd, int) or fd < 3 for fd in fds):
        raise UsageError(f"pass_fds must be file descriptors of 3 or more, got {fds!r}")
    started = time.monotonic()
    capture = _Capture(output_limit)
    if cancelled():
        return CommandResult(None, "", 0, False, False, True, 0)

    shell_path = shell or _shell()
    wrapper = sandbox.wrap([], cwd) if sandbox is not None and sandbox.available else []
    sup = _Supervised(command, shell_path, cwd, env, fds, wrapper)
    stop = threading.Event()
    reader = threading.Thread(
        target=_pump, args=(sup.output, capture, stop, on_output), name="kiso-shell-reader"
    )
    timed_out = was_cancelled = False
    try:
        reader.start()
        deadline = started + timeout_ms / 1000
        finish_by: float | None = None  # once the shell ended or was stopped
        while not sup.eof:
            now = time.monotonic()
            if finish_by is None:
                if sup.exit_code is None and cancelled():
                    was_cancelled = True
                elif sup.exit_code is None and now >= deadline:
                    timed_out = True
                if sup.exit_code is not None or was_cancelled or timed_out:
                    if was_cancelled or timed_out:
                        sup.request_kill()
                    finish_by = now + _FINISH_S
            elif now >= finish_by:
                sup.abandon()
                break
            if finish_by is None:
                sup.read_status(max(0.0, min(_POLL_S, deadline - now)))
            else:
                sup.read_status(max(0.0, finish_by - now))
        # The supervisor is gone and so is every process it could reach, so EOF is near unless a
        # process that escaped it (through another service) holds the pipe.
        reader.join(_TERM_GRACE_S)
    finally:
        stop.set()
        if reader.ident is not None:
            reader.join()
        sup.close()

    if sup.error is not None:
        raise OSError(sup.error, os.strerror(sup.error), shell_path)
    killed = timed_out or was_cancelled
    if sup.exit_code is None and not killed:
        output, _ = capture.render()
        raise SupervisorError(
            errno.EIO,
            f"the shell supervisor ended before the command did (status {sup.returncode})"
            + (f": {output.strip()[-500:]}" if output.strip() else ""),
        )
    output, truncated = capture.render()
    return CommandResult(
        exit_code=None if killed else sup.exit_code,
        output=output,
        total_bytes=capture.total,
        truncated=truncated,
        timed_out=timed_out,
        cancelled=was_cancelled,
        ms=int((time.monotonic() - started) * 1000),
        strays_killed=sup.strays and not killed,
    )


class SupervisorError(OSError):
    """The supervisor ended without reporting how the command ended: something killed it (it
    kills the command first when it can: on SIGTERM, SIGHUP or SIGINT), or it crashed."""


class _Supervised:
    """One command under its supervisor (:mod:`kiso.tools.supervisor`): the pipes, the status.

    The control pipe's write end is ours alone: both ends are created close-on-exec and the
    supervisor is started with ``close_fds``, so no other child of kiso inherits it, and the
    supervisor sees end-of-file exactly when this process dies (or :meth:`close` runs early).
    """

    def __init__(  # noqa: PLR0917
        self,
        command: str,
        shell: str,
        cwd: Path,
        env: Mapping[str, str],
        pass_fds: tuple[int, ...],
        wrapper: Sequence[str] = (),
    ) -> None:
        out_r, out_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        argv = [sys.executable, "-I", "-S", supervisor.SCRIPT, str(os.getpid()), shell, command]
        argv += wrapper
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=dict(env),
                stdin=ctl_r,
                stdout=subprocess.PIPE,
                stderr=out_w,
                bufsize=0,
                close_fds=True,
                pass_fds=pass_fds,
                start_new_session=True,
            )
        except BaseException:
            os.close(out_r)
            os.close(ctl_w)
            raise
        finally:
            os.close(ctl_r)
            os.close(out_w)
        # The environment goes on the control pipe: see supervisor.read_environment. A supervisor
        # that died before reading it shows as end-of-file on the status pipe, below.
        blob = memoryview(supervisor.encode_environment(dict(env)))
        with contextlib.suppress(BrokenPipeError):
            while blob:
                blob = blob[os.write(ctl_w, blob) :]
        assert self.proc.stdout is not None
        self.status = self.proc.stdout
        self.output = out_r
        self.control: int | None = ctl_w
        self.poller = select.poll()
        self.poller.register(self.status.fileno(), select.POLLIN)
        self.pending = b""
        self.eof = False
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.strays = False
        self.error: int | None = None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def read_status(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the supervisor to report, and take in what it says."""
        if self.eof or not self.poller.poll(int(timeout_s * 1000)):
            return
        try:
            data = os.read(self.status.fileno(), 4096)
        except OSError:
            data = b""
        if not data:
            self.eof = True
            self.proc.wait()
            return
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            key, _, value = line.decode("ascii", "replace").partition(" ")
            with contextlib.suppress(ValueError):
                if key == "pid":
                    self.pid = int(value)
                elif key == "exit":
                    self.exit_code = int(value)
                elif key == "strays":
                    self.strays = value == "1"
                elif key == "error":
                    self.error = int(value) or errno.EIO

    def request_kill(self) -> None:
        """Ask for SIGTERM, up to 1 s, then SIGKILL of every process of the command."""
        if self.control is not None:
            with contextlib.suppress(OSError):  # it has exited already
                os.write(self.control, supervisor.KILL_REQUEST)

    def abandon(self) -> None:
        """The supervisor did not finish in time: tell it to kill everything now, then end it."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(_KILL_WAIT_S + 1)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.eof = True

    def close(self) -> None:
        """End the supervisor if it still runs (closing the control pipe kills everything), reap
        it and close every descriptor."""
        if self.proc.poll() is None:
            self.request_kill()
            try:
                self.proc.wait(_FINISH_S)
            except subprocess.TimeoutExpired:
                self.abandon()
        if self.control is not None:
            os.close(self.control)
            self.control = None
        self.status.close()
        os.close(self.output)


def _shell() -> str:
    return "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"


class _Capture:
    """The head and the tail of a byte stream, and its true length."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def render(self) -> tuple[str, bool]:
        """The decoded output and whether a middle part was omitted."""
        tail = self.tail[len(self.tail) - self.tail_limit :] if self.tail_limit else bytearray()
        omitted = self.total - len(self.head) - len(tail)
        if omitted == 0:
            return (self.head + tail).decode("utf-8", errors="replace"), False
        # Cut on character boundaries: drop a partial sequence at the end of the head and
        # continuation bytes at the start of the tail, and count them as omitted.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        head_text = decoder.decode(bytes(self.head), final=False)
        omitted += len(decoder.getstate()[0])
        skip = 0
        while skip < min(3, len(tail)) and 0x80 <= tail[skip] <= 0xBF:
            skip += 1
        omitted += skip
        tail_text = tail[skip:].decode("utf-8", errors="replace")
        newline = "\n" if head_text and not head_text.endswith("\n") else ""
        return f"{head_text}{newline}[... {omitted:,} bytes omitted ...]\n{tail_text}", True


class _Live:
    """Hands output to an ``on_output`` callback as text, never splitting a UTF-8 character."""

    def __init__(self, on_output: Callable[[str], None] | None) -> None:
        self.on_output = on_output
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, *, final: bool = False) -> None:
        if self.on_output is None:
            return
        text = self.decoder.decode(data, final=final)
        if text:
            with contextlib.suppress(Exception):  # display only: it must not break the command
                self.on_output(text)


def _pump(
    fd: int,
    capture: _Capture,
    stop: threading.Event,
    on_output: Callable[[str], None] | None = None,
) -> None:
    """Read ``fd`` into ``capture`` (and ``on_output``) until EOF or until ``stop`` is set."""
    live = _Live(on_output)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    try:
        while not stop.is_set():
            if not poller.poll(_POLL_S * 1000):
                continue
            try:
                data = os.read(fd, _READ_CHUNK)
            except OSError:
                return
            if not data:
                return
            capture.feed(data)
            live.feed(data)
    finally:
        live.feed(b"", final=True)  # a character cut off at the end comes out as U+FFFD


# ---------------------------------------------------------------------------------------------
# The shell tool


SHELL_DESCRIPTION = f"""\
Run a shell command with /bin/bash in the workspace directory and return its output and exit \
status.

- stdout and stderr are merged. Long output keeps its beginning and its end (about \
{DEFAULT_OUTPUT_LIMIT:,} bytes in all) and says how many bytes were left out of the middle; \
narrow the command (grep, head, tail, --quiet flags) when you need a specific part.
- stdin is closed: interactive programs get end-of-file at once. Pass flags such as --yes or \
--no-pager instead of expecting a prompt.
- timeout_ms defaults to {DEFAULT_TIMEOUT_MS} ms (at most {MAX_TIMEOUT_MS} ms). On timeout the \
command and every process it started are killed.
- Processes left running in the background when the command exits are killed, so do not start \
servers with '&' and expect them to survive the call.
- Each call is a fresh shell: cd and exported variables do not carry over to the next call.
- Prefer read_file, list_dir and search_text to read and find files, and write_file or \
edit_file to change them; use this tool to build, test, run and inspect programs.
- The result ends with a line such as 'exit 0'; a non-zero exit is reported as an error.
- Commands usually run in a sandbox: the workspace and temporary directories are writable, \
the rest of the file system is read-only, credentials (~/.ssh, ~/.aws...) are hidden and there \
is no network. When a command fails because of it, the result says so; only then, and only when \
the command must run, call again with outside_sandbox true and a justification: the user is \
asked.
"""

SHELL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "description": "The command line to run with bash -c, in the workspace directory.",
        },
        "timeout_ms": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_TIMEOUT_MS,
            "description": f"Kill the command after this many milliseconds "
            f"(default {DEFAULT_TIMEOUT_MS}).",
        },
        "outside_sandbox": {
            "type": "boolean",
            "description": "Run this one command outside the sandbox. The user is always asked "
            "first; use it only after the sandbox stopped the command.",
        },
        "justification": {
            "type": "string",
            "description": "With outside_sandbox: one sentence the user reads, saying why.",
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}


def format_command_result(result: CommandResult, timeout_ms: int) -> ToolResult:
    """The tool result for ``result``: the output, then one final status line."""
    parts = [result.output]
    if result.output and not result.output.endswith("\n"):
        parts.append("\n")
    if result.strays_killed:
        parts.append("[processes the command left running in the background were killed]\n")
    code = result.exit_code
    if result.timed_out:
        status = f"timed out after {timeout_ms} ms; the process group was killed"
    elif result.cancelled or code is None:
        status = "cancelled; the process group was killed"
    elif code < 0:
        status = f"exit {code} (killed by {_signal_name(-code)})"
    else:
        status = f"exit {code}"
    if result.truncated:
        status += f" (output truncated: {result.total_bytes:,} bytes total)"
    parts.append(status)
    if result.timed_out:
        error_kind: str | None = "timeout"
    elif result.cancelled or code is None:
        error_kind = "aborted"
    else:
        error_kind = None
    return ToolResult(
        content="".join(parts),
        is_error=error_kind is not None or code != 0,
        error_kind=error_kind,
        truncated=True if result.truncated else None,
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _invalid(message: str) -> ToolResult:
    return ToolResult(message, is_error=True, error_kind="invalid_input")


def _timeout_arg(value: object) -> int | None:
    """The timeout as an int, or None when it is not an integer in range."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 1 <= value <= MAX_TIMEOUT_MS:
        return value
    return None


def _execute_shell(input: dict[str, Any], ctx: ToolContext) -> ToolResult:
    command = input.get("command")
    if not isinstance(command, str):
        return _invalid("command must be a string holding the command line to run")
    if "\x00" in command:
        return _invalid("the command contains a NUL byte; remove it and run the command again")
    timeout_ms = _timeout_arg(input.get("timeout_ms", DEFAULT_TIMEOUT_MS))
    if timeout_ms is None:
        return _invalid(
            f"timeout_ms must be an integer from 1 to {MAX_TIMEOUT_MS}, "
            f"got {input.get('timeout_ms')!r}"
        )
    outside = input.get("outside_sandbox", False)
    if not isinstance(outside, bool):
        return _invalid(f"outside_sandbox must be true or false, got {outside!r}")
    if ctx.cancelled():
        return ToolResult(
            "cancelled before the command started; nothing ran", is_error=True, error_kind="aborted"
        )
    env = ctx.env if ctx.env else child_env(os.environ)
    sandbox = None if outside else ctx.sandbox
    try:
        result = run_command(
            command,
            cwd=ctx.workspace,
            env=env,
            timeout_ms=timeout_ms,
            cancelled=ctx.cancelled,
            on_output=ctx.progress,
            pass_fds=ctx.inherit_fds,
            sandbox=sandbox,
        )
    except SupervisorError as exc:
        return ToolResult(
            f"the command's supervisor was stopped before the command ended ({exc.strerror}); "
            f"its processes were killed unless the supervisor itself was killed with SIGKILL",
            is_error=True,
            error_kind="fatal",
        )
    except OSError as exc:
        return ToolResult(
            f"could not start /bin/bash in the workspace {ctx.workspace}: "
            f"{exc.strerror or exc}. Check that the workspace directory exists and is readable.",
            is_error=True,
            error_kind="fatal",
        )
    formatted = format_command_result(result, timeout_ms)
    if sandbox is not None and sandbox.available:
        why = denial(sandbox, result.exit_code, result.output)
        if why is not None:
            return replace(formatted, content=formatted.content + sandbox_note(sandbox, why))
    return formatted


def sandbox_note(sandbox: Sandbox, why: str) -> str:
    """What a result says when the sandbox probably stopped the command."""
    return (
        f"\n[sandbox: this ran in the {sandbox.mode} sandbox"
        f"{'' if sandbox.network else ' with no network'} and probably failed because {why}. "
        f"If it must run outside the sandbox, call shell again with the same command, "
        f'"outside_sandbox": true and a "justification": the user is asked first.]'
    )


SHELL: Tool = define_tool(
    "shell", SHELL_DESCRIPTION, SHELL_PARAMETERS, _execute_shell, effects=Effects.SHELL
)
