"""The shell runner and the shell tool, proven with real processes, process groups and pipes."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kiso.tools import SHELL, ToolContext, ToolResult
from kiso.tools.shell import CommandResult, run_command

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def run(command: str, cwd: Path, **kwargs: Any) -> CommandResult:
    kwargs.setdefault("timeout_ms", 30_000)
    return run_command(command, cwd=cwd, env=kwargs.pop("env", ENV), **kwargs)


def call(ctx: ToolContext, **input: Any) -> ToolResult:
    return asyncio.run(SHELL.run(input, ctx))


def live_members(pgid: int) -> list[int]:
    """Pids of the non-zombie processes in a process group, read from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            pids.append(int(entry))
    return pids


def assert_group_dead(pgid: int) -> None:
    """No live process in the group now, and the group itself disappears once init reaps it."""
    assert live_members(pgid) == []
    deadline = time.monotonic() + 15
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"process group {pgid} still exists"
        time.sleep(0.05)


def pids_in(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"^pid=(\d+)$", output, flags=re.M)]


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return ToolContext(workspace=workspace, execution_id="k9:1", env=dict(ENV))


# --- run_command -------------------------------------------------------------------------------


def test_exit_code_and_merged_output(workspace: Path) -> None:
    result = run("echo out; echo err >&2; exit 7", workspace)
    assert result.exit_code == 7
    assert result.output == "out\nerr\n"
    assert result.total_bytes == 8
    assert not (result.truncated or result.timed_out or result.cancelled)


def test_it_runs_in_cwd_with_exactly_the_env_given(workspace: Path) -> None:
    result = run('pwd; echo "[$ONLY_HERE]"', workspace, env={**ENV, "ONLY_HERE": "yes"})
    assert result.output == f"{os.path.realpath(workspace)}\n[yes]\n"
    assert run('echo "[$HOME]"', workspace).output == "[]\n"


def test_stdin_is_closed_even_when_ours_is_an_open_pipe(workspace: Path) -> None:
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        # An inherited stdin would keep cat waiting on the pipe until the timeout.
        result = run("cat; echo done", workspace, timeout_ms=5_000)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert not result.timed_out
    assert result.exit_code == 0
    assert result.output == "done\n"


@needs_proc
def test_a_timeout_kills_the_whole_group_including_a_grandchild(workspace: Path) -> None:
    result = run("echo pid=$$; sleep 300 & echo pid=$!; sleep 300", workspace, timeout_ms=500)
    assert result.timed_out
    assert result.exit_code is None
    leader, grandchild = pids_in(result.output)
    assert grandchild != leader
    assert_group_dead(leader)


@needs_proc
def test_a_child_ignoring_sigterm_is_sigkilled(workspace: Path) -> None:
    started = time.monotonic()
    result = run("trap '' TERM; echo pid=$$; sleep 300 & sleep 300", workspace, timeout_ms=300)
    assert result.timed_out
    assert time.monotonic() - started >= 1.0  # it waited the SIGTERM grace first
    (leader,) = pids_in(result.output)
    assert_group_dead(leader)


@needs_proc
def test_cancellation_kills_the_group_soon_after_the_flag_turns(workspace: Path) -> None:
    flip_at = time.monotonic() + 0.3
    result = run(
        "echo pid=$$; sleep 300 & sleep 300",
        workspace,
        timeout_ms=60_000,
        cancelled=lambda: time.monotonic() >= flip_at,
    )
    assert result.cancelled
    assert not result.timed_out
    assert result.exit_code is None
    (leader,) = pids_in(result.output)
    assert_group_dead(leader)


def test_nothing_starts_when_already_cancelled(workspace: Path) -> None:
    result = run("touch started", workspace, cancelled=lambda: True)
    assert result.cancelled
    assert result.exit_code is None
    assert not (workspace / "started").exists()


@needs_proc
def test_background_processes_left_running_are_killed(workspace: Path) -> None:
    result = run("sleep 300 & echo pid=$!; echo pid=$$", workspace)
    assert result.exit_code == 0
    assert result.strays_killed
    grandchild, leader = pids_in(result.output)
    assert grandchild != leader
    assert_group_dead(leader)


def test_a_clean_command_reports_no_strays(workspace: Path) -> None:
    assert not run("true", workspace).strays_killed


def test_long_output_keeps_head_and_tail_and_the_true_total(workspace: Path) -> None:
    expected = "".join(f"{n}\n" for n in range(1, 100_001)).encode()
    result = run("seq 1 100000", workspace, output_limit=1_000)
    assert result.exit_code == 0
    assert result.truncated
    assert result.total_bytes == len(expected)
    omitted = len(expected) - 1_000
    head, marker, tail = result.output.partition(f"[... {omitted:,} bytes omitted ...]\n")
    assert marker
    assert head == expected[:500].decode()  # the head ends on a newline here
    assert tail == expected[-500:].decode()
    assert tail.endswith("99999\n100000\n")


def test_output_within_the_limit_is_kept_whole(workspace: Path) -> None:
    result = run("seq 1 1000", workspace, output_limit=10_000)
    assert not result.truncated
    assert result.output == "".join(f"{n}\n" for n in range(1, 1001))


def test_the_cut_never_splits_a_character(workspace: Path) -> None:
    result = run(r"for i in $(seq 1 2000); do printf '\303\251'; done", workspace, output_limit=101)
    assert result.total_bytes == 4_000
    assert "\ufffd" not in result.output
    head, _, tail = result.output.partition("\n[... 3,900 bytes omitted ...]\n")
    assert head == "é" * 25
    assert tail == "é" * 25


def test_invalid_utf8_is_replaced_not_fatal(workspace: Path) -> None:
    assert run(r"printf 'a\377b'", workspace).output == "a\ufffdb"


def test_a_chatty_child_never_blocks(workspace: Path) -> None:
    result = run("head -c 5000000 /dev/zero | tr '\\0' a; echo", workspace, timeout_ms=20_000)
    assert result.exit_code == 0
    assert not result.timed_out
    assert result.total_bytes == 5_000_001
    assert len(result.output) < 31_000


def test_bad_arguments_are_refused(workspace: Path) -> None:
    with pytest.raises(ValueError, match="timeout_ms"):
        run("true", workspace, timeout_ms=0)
    with pytest.raises(ValueError, match="output_limit"):
        run("true", workspace, output_limit=-1)
    with pytest.raises(FileNotFoundError):
        run("true", workspace / "missing")


# --- live output -------------------------------------------------------------------------------

SLOW_LINES = "for i in 1 2 3; do echo line$i; sleep 0.2; done"


def test_output_reaches_on_output_while_the_command_runs(workspace: Path) -> None:
    seen: list[tuple[float, str]] = []
    result = run(
        SLOW_LINES, workspace, on_output=lambda text: seen.append((time.monotonic(), text))
    )
    ended = time.monotonic()
    assert result.exit_code == 0
    assert "".join(text for _, text in seen) == result.output == "line1\nline2\nline3\n"
    assert len(seen) >= 2, seen
    first_at, first = seen[0]
    assert first.startswith("line1")
    assert ended - first_at > 0.3, "the first line arrived only when the command ended"


def test_a_character_split_across_reads_arrives_whole(workspace: Path) -> None:
    chunks: list[str] = []
    # The euro sign is e2 82 ac; the pause makes its bytes arrive in two reads.
    result = run(
        r"printf 'a\342\202'; sleep 0.3; printf '\254b\n'", workspace, on_output=chunks.append
    )
    assert result.output == "a€b\n"
    assert "".join(chunks) == "a€b\n"
    assert chunks[0] == "a", chunks  # the half character was held back, not replaced
    assert all("\ufffd" not in chunk for chunk in chunks)


def test_a_character_cut_off_at_the_end_is_replaced(workspace: Path) -> None:
    chunks: list[str] = []
    run(r"printf 'a\342\202'", workspace, on_output=chunks.append)
    assert "".join(chunks) == "a\ufffd"


def test_a_failing_on_output_does_not_break_the_command(workspace: Path) -> None:
    calls: list[str] = []

    def boom(text: str) -> None:
        calls.append(text)
        raise RuntimeError("the display fell over")

    result = run(SLOW_LINES, workspace, on_output=boom)
    assert result.exit_code == 0
    assert result.output == "line1\nline2\nline3\n"
    assert "".join(calls) == result.output  # called again after each failure


# --- the shell tool ----------------------------------------------------------------------------


def test_the_tool_reports_output_and_a_final_exit_line(ctx: ToolContext) -> None:
    result = call(ctx, command="echo hello")
    assert result == ToolResult("hello\nexit 0")
    failed = call(ctx, command="echo no >&2; exit 3")
    assert failed.content == "no\nexit 3"
    assert failed.is_error
    assert failed.error_kind is None


def test_the_tool_runs_in_the_workspace(ctx: ToolContext) -> None:
    call(ctx, command="echo made > here.txt")
    assert (ctx.workspace / "here.txt").read_text() == "made\n"


def test_the_tool_reports_output_live_through_the_context(ctx: ToolContext) -> None:
    chunks: list[str] = []
    ctx.progress = chunks.append
    result = call(ctx, command="echo one; sleep 0.1; echo two")
    assert "".join(chunks) == "one\ntwo\n"
    assert result.content == "one\ntwo\nexit 0"


def test_the_tool_reports_a_timeout(ctx: ToolContext) -> None:
    result = call(ctx, command="echo partial; sleep 300", timeout_ms=300)
    assert result.is_error
    assert result.error_kind == "timeout"
    assert result.content == "partial\ntimed out after 300 ms; the process group was killed"


def test_the_tool_reports_a_cancellation(ctx: ToolContext) -> None:
    threading.Timer(0.3, ctx.abort.set).start()
    result = call(ctx, command="sleep 300")
    assert result.is_error
    assert result.error_kind == "aborted"
    assert result.content == "cancelled; the process group was killed"


def test_the_tool_does_not_start_when_the_run_is_already_cancelled(ctx: ToolContext) -> None:
    ctx.abort.set()
    result = call(ctx, command="touch started")
    assert result.error_kind == "aborted"
    assert not (ctx.workspace / "started").exists()


def test_the_tool_caps_output_and_says_so(ctx: ToolContext) -> None:
    total = sum(len(f"{n}\n") for n in range(1, 20_001))
    result = call(ctx, command="seq 1 20000")
    assert result.truncated is True
    assert not result.is_error
    assert result.content.startswith("1\n2\n3\n")
    assert " bytes omitted ...]\n" in result.content
    assert result.content.endswith(f"20000\nexit 0 (output truncated: {total:,} bytes total)")
    assert len(result.content) < 31_000


def test_the_tool_reports_processes_killed_in_the_background(ctx: ToolContext) -> None:
    result = call(ctx, command="sleep 300 &")
    assert "left running in the background were killed" in result.content
    assert result.content.endswith("exit 0")


@pytest.mark.parametrize(
    "bad",
    [
        {"command": 42},
        {"command": "true", "timeout_ms": 0},
        {"command": "true", "timeout_ms": 600_001},
        {"command": "true", "timeout_ms": "5"},
        {"command": "true", "timeout_ms": True},
        {"command": "echo \x00"},
    ],
)
def test_odd_input_is_an_invalid_input_result(ctx: ToolContext, bad: dict[str, Any]) -> None:
    result = call(ctx, **bad)
    assert result.is_error
    assert result.error_kind == "invalid_input"


def test_a_missing_workspace_is_an_error_result(tmp_path: Path) -> None:
    ctx = ToolContext(workspace=tmp_path / "gone", execution_id="k9:1", env=dict(ENV))
    result = call(ctx, command="true")
    assert result.is_error
    assert "gone" in result.content


def child_environment(result: ToolResult) -> dict[str, str]:
    lines = result.content.splitlines()[:-1]  # drop "exit 0"
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_without_a_context_env_credentials_are_stripped_from_ours(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-openai")
    monkeypatch.setenv("FOO_API_KEY", "fake-foo")
    monkeypatch.setenv("KISO_FAILPOINT", "crash_here")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://llm.example/v1")
    result = call(ToolContext(workspace=workspace, execution_id="k9:1"), command="env")
    seen = child_environment(result)
    assert result.content.endswith("exit 0")
    for secret in ("sk-fake-openai", "fake-foo", "crash_here"):
        assert secret not in result.content
    assert "OPENAI_API_KEY" not in seen
    assert "FOO_API_KEY" not in seen
    assert "KISO_FAILPOINT" not in seen
    assert seen["OPENAI_BASE_URL"] == "https://llm.example/v1"
    assert "PATH" in seen


def test_a_context_env_is_used_as_given(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx.env = {**ENV, "GIVEN": "by-runtime"}
    monkeypatch.setenv("NOT_GIVEN", "from-parent")
    seen = child_environment(call(ctx, command="env"))
    assert seen["GIVEN"] == "by-runtime"
    assert "NOT_GIVEN" not in seen


def test_the_tool_hands_the_context_inherit_fds_to_the_command(ctx: ToolContext) -> None:
    fd = os.open(ctx.workspace.parent / "guard", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        ctx.inherit_fds = (fd,)
        result = call(ctx, command=f"echo inherited >&{fd}")
    finally:
        os.close(fd)
    assert result.content == "exit 0"
    assert (ctx.workspace.parent / "guard").read_text() == "inherited\n"


def test_the_tool_declares_its_contract() -> None:
    assert SHELL.name == "shell"
    assert SHELL.effects == "shell"
    assert not SHELL.rerunnable
    assert SHELL.parameters["required"] == ["command"]
    assert SHELL.parameters["additionalProperties"] is False
    timeout = SHELL.parameters["properties"]["timeout_ms"]
    assert (timeout["minimum"], timeout["maximum"]) == (1, 600_000)
