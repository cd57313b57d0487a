"""The one shell runner (:func:`run_command`) and the ``shell`` tool built on it.

Guarantees of :func:`run_command`:

* the command runs as ``/bin/bash -c command`` (``/bin/sh`` when bash is missing) in its own
  process group and session, with stdin from ``/dev/null``, so it can neither read the caller's
  terminal nor wait for input;
* stdout and stderr are merged and read by a thread while the command runs, so a chatty child never
  blocks on a full pipe; only the head and the tail of the output are kept (half the limit each),
  the middle is replaced by one ``[... N bytes omitted ...]`` line and the true total is reported;
* ``on_output``, when given, is called from the reader thread with each chunk as it is read,
  decoded incrementally (a character split across reads arrives whole); it is for display only,
  and an exception it raises is swallowed;
* on timeout or cancellation (``cancelled`` is polled every 50 ms) the whole process group is
  killed: SIGTERM, up to 1 s for it to go, then SIGKILL. Processes the command leaves running in
  the background when it exits are killed the same way. Either way, when the call returns no
  process of the group is alive (zombies waiting for init to reap them are not alive). A process
  that started its own session (``setsid``) has left the group and is beyond reach.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiso.kernel.errors import UsageError
from kiso.tools.base import Effects, Tool, ToolContext, ToolResult, define_tool
from kiso.tools.env import child_env

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "DEFAULT_TIMEOUT_MS",
    "MAX_TIMEOUT_MS",
    "SHELL",
    "CommandResult",
    "format_command_result",
    "run_command",
]

DEFAULT_TIMEOUT_MS = 120_000
MAX_TIMEOUT_MS = 600_000
DEFAULT_OUTPUT_LIMIT = 30_000

_POLL_S = 0.05
_TERM_GRACE_S = 1.0
_KILL_WAIT_S = 2.0
_DRAIN_GRACE_S = 0.2
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
) -> CommandResult:
    """Run ``command`` in a shell and return what it did; see the module docstring.

    Raises ValueError for a non-positive ``timeout_ms``, a negative ``output_limit`` or a NUL byte
    in ``command``, and OSError when the shell cannot be started (for example a missing ``cwd``).
    If ``cancelled()`` is already true nothing is started. ``shell`` is the absolute path of the
    shell to run the command with (``shell -c command``); the default is bash, else sh.
    """
    if timeout_ms <= 0:
        raise UsageError(f"timeout_ms must be positive, got {timeout_ms}")
    if output_limit < 0:
        raise UsageError(f"output_limit must be 0 or more, got {output_limit}")
    started = time.monotonic()
    capture = _Capture(output_limit)
    if cancelled():
        return CommandResult(None, "", 0, False, False, True, 0)

    proc = subprocess.Popen(
        [shell or _shell(), "-c", command],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        bufsize=0,
        close_fds=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    stop = threading.Event()
    reader = threading.Thread(
        target=_pump,
        args=(proc.stdout.fileno(), capture, stop, on_output),
        name="kiso-shell-reader",
    )
    timed_out = was_cancelled = strays = False
    try:
        reader.start()
        deadline = started + timeout_ms / 1000
        while proc.poll() is None:
            if cancelled():
                was_cancelled = True
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(min(_POLL_S, remaining))
        if timed_out or was_cancelled:
            _kill_group(proc)
        else:
            reader.join(_DRAIN_GRACE_S)
            if _group_alive(proc.pid):
                strays = True
                _kill_group(proc)
        # Everything in the group is gone, so EOF is near unless an escaped process holds the pipe.
        reader.join(_TERM_GRACE_S)
    finally:
        stop.set()
        if reader.ident is not None:
            reader.join()
        if proc.poll() is None:
            _kill_group(proc)
        proc.wait()
        proc.stdout.close()

    output, truncated = capture.render()
    return CommandResult(
        exit_code=None if (timed_out or was_cancelled) else proc.returncode,
        output=output,
        total_bytes=capture.total,
        truncated=truncated,
        timed_out=timed_out,
        cancelled=was_cancelled,
        ms=int((time.monotonic() - started) * 1000),
        strays_killed=strays,
    )


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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group of ``proc``, wait up to 1 s, then SIGKILL it and wait it out."""
    pgid = proc.pid
    if _signal_group(pgid, signal.SIGTERM) and not _wait_group_gone(proc, _TERM_GRACE_S):
        _signal_group(pgid, signal.SIGKILL)
        _wait_group_gone(proc, _KILL_WAIT_S)
    if proc.poll() is None:  # never wait forever on a leader the group signal missed
        proc.kill()


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # No member of the group may be signalled by us any more (only foreign processes remain).
        return False
    return True


def _wait_group_gone(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Reap the leader and wait until no live process of its group remains."""
    deadline = time.monotonic() + timeout
    while True:
        proc.poll()
        if not _group_alive(proc.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _group_alive(pgid: int) -> bool:
    """True while some process of the group is alive (a zombie is not)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _live_member_in_proc(pgid)


def _live_member_in_proc(pgid: int) -> bool:
    """Scan /proc for a non-zombie member of ``pgid``; assume one exists where /proc is absent.

    Orphaned zombies are reaped by init, which may take a second or more; they hold no resources
    a command could use, so they do not count.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    if "self" not in entries:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ..."; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


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
    if ctx.cancelled():
        return ToolResult(
            "cancelled before the command started; nothing ran", is_error=True, error_kind="aborted"
        )
    env = ctx.env if ctx.env else child_env(os.environ)
    try:
        result = run_command(
            command,
            cwd=ctx.workspace,
            env=env,
            timeout_ms=timeout_ms,
            cancelled=ctx.cancelled,
            on_output=ctx.progress,
        )
    except OSError as exc:
        return ToolResult(
            f"could not start /bin/bash in the workspace {ctx.workspace}: "
            f"{exc.strerror or exc}. Check that the workspace directory exists and is readable.",
            is_error=True,
            error_kind="fatal",
        )
    return format_command_result(result, timeout_ms)


SHELL: Tool = define_tool(
    "shell", SHELL_DESCRIPTION, SHELL_PARAMETERS, _execute_shell, effects=Effects.SHELL
)
