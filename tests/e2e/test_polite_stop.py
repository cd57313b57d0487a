"""A polite stop is not a crash: SIGTERM (what CI sends on cancel) and SIGHUP stop a run as esc
does. A real ``kiso -p`` (and the interactive session, in a real PTY) runs a shell command that
starts a background child and sleeps; once the command has written its pids, the kiso process this
test started gets the signal. The command's whole tree is gone, the log records the execution
``aborted`` and the run ``aborted`` by the signal, kiso exits 128 + the signal's number, and the
session resumes with no ruling. Only processes this test started are signalled, by their pids."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiso.kernel import (
    Event,
    ExecutionFinished,
    ExecutionResolved,
    ExecutionStarted,
    Idle,
    JsonlSessionStore,
    RunEnded,
    plan,
)
from tests.cli.test_repl import ENTER, Term, chat
from tests.processes import alive

BIN = Path(sys.executable).parent / "kiso"
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_FAUX_SCRIPT", "KISO_MODEL")
KEYS += ("KISO_MODE", "KISO_FAILPOINT")
# A background child and a foreground sleep; the pids are written last, whole, with a newline.
COMMAND = "sleep 300 & bg=$!; echo $bg $$ > pids.tmp; mv pids.tmp pids; sleep 300"
SCRIPT = {
    "turns": [
        {"tool_calls": [{"name": "shell", "input": {"command": COMMAND}}]},
        {"text": "Picked up where it stopped."},
    ]
}
SIGNALS = [signal.SIGTERM, signal.SIGHUP]


def env(home: Path, script: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in KEYS}
    return {**base, "KISO_HOME": str(home), "KISO_FAUX_SCRIPT": str(script)}


@pytest.fixture
def place(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    home, ws, script = tmp_path / "home", tmp_path / "ws", tmp_path / "script.json"
    ws.mkdir()
    script.write_text(json.dumps(SCRIPT))
    yield home, ws, script
    pids = ws / "pids"
    for pid in map(int, pids.read_text().split()) if pids.exists() else ():
        if alive(pid):  # only on failure: the processes this test's command started
            os.kill(pid, signal.SIGKILL)


def command_pids(ws: Path) -> list[int] | None:
    pids = ws / "pids"
    return [int(p) for p in pids.read_text().split()] if pids.exists() else None


def wait_for_pids(ws: Path, proc: subprocess.Popen[str] | None = None) -> list[int]:
    deadline = time.monotonic() + 60
    while (pids := command_pids(ws)) is None:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"kiso exited ({proc.returncode}) before the command started")
        if time.monotonic() > deadline:
            pytest.fail("the command never started")
        time.sleep(0.02)
    return pids


def stopped_cleanly(home: Path, sid: str, by: str) -> list[Event]:
    """The log: the shell's execution aborted (not uncertain), the run aborted by ``by``."""
    events = JsonlSessionStore(home).load(sid).events
    (started,) = [e for e in events if isinstance(e, ExecutionStarted)]
    (finished,) = [e for e in events if isinstance(e, ExecutionFinished)]
    assert finished.execution_id == started.execution_id
    assert finished.is_error and finished.error_kind == "aborted", finished
    (ended,) = [e for e in events if isinstance(e, RunEnded)]
    assert ended.outcome.kind == "aborted" and ended.outcome.by == by, ended
    assert isinstance(plan(events, rerunnable=set()), Idle)  # nothing to rule on
    return events


def resumes_without_a_ruling(home: Path, ws: Path, script: Path, sid: str) -> None:
    out = subprocess.run(
        [str(BIN), "resume", sid, "go on", "--output-format", "json"],
        cwd=ws,
        env=env(home, script),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    assert "uncertain" not in out.stderr and "ruling" not in out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["outcome"]["kind"] == "completed"
    assert result["result"] == "Picked up where it stopped."
    events = JsonlSessionStore(home).load(sid).events
    assert not [e for e in events if isinstance(e, ExecutionResolved)]
    assert sum(isinstance(e, ExecutionStarted) for e in events) == 1  # nothing ran again


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_print_mode_stops_on_a_signal_as_esc_does(
    place: tuple[Path, Path, Path], sig: signal.Signals
) -> None:
    home, ws, script = place
    argv = [str(BIN), "-p", "run it", "s1", "--mode", "bypass", "--output-format", "json"]
    proc = subprocess.Popen(
        argv,
        cwd=ws,
        env=env(home, script),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = wait_for_pids(ws, proc)
        assert all(alive(pid) for pid in pids)
        proc.send_signal(sig)  # the kiso process this test started
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, (proc.returncode, stderr)
    assert not [pid for pid in pids if alive(pid)], "the command's tree outlived the stop"
    result = json.loads(stdout.splitlines()[-1])
    assert result["is_error"] is True
    assert result["outcome"] == {"kind": "aborted", "by": sig.name}
    assert f"stopped by {sig.name}" in stderr and "kiso resume s1" in stderr
    assert "Traceback" not in stderr
    stopped_cleanly(home, "s1", sig.name)
    live = JsonlSessionStore(home).path_of("s1").with_suffix(".live")
    assert not live.exists()  # the liveness guard went with the command
    resumes_without_a_ruling(home, ws, script, "s1")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_the_interactive_session_stops_on_a_signal_as_esc_does(
    place: tuple[Path, Path, Path], sig: signal.Signals
) -> None:
    home, ws, script = place
    term = Term(chat("r1", "bypass"), cwd=ws, home=home, script=script)
    try:
        term.wait_for("▸ bypass")
        term.send("run it" + ENTER)
        term.wait(lambda: command_pids(ws) is not None, 60, "the command to start")
        pids = wait_for_pids(ws)
        assert all(alive(pid) for pid in pids)
        os.kill(term.child.pid, sig)  # the kiso process this test started
        term.wait(lambda: term.eof, 60, "kiso to exit")
        assert term.exit_status() == 128 + sig
    finally:
        term.close()
    assert "Traceback" not in term.text
    assert not [pid for pid in pids if alive(pid)], "the command's tree outlived the stop"
    stopped_cleanly(home, "r1", sig.name)
    resumes_without_a_ruling(home, ws, script, "r1")


STUCK = textwrap.dedent(
    """
    import sys, time
    from kiso.cli.stop import Stop

    stop = Stop(lambda signum: print("stopping", flush=True), grace=float(sys.argv[1]))
    stop.install()
    print("ready", flush=True)
    while True:  # a stop that never finishes
        time.sleep(1)
    """
)


def stuck(grace: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK, str(grace)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_a_second_signal_while_stopping_ends_the_process_hard() -> None:
    proc = stuck(grace=600)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None and proc.stdout.readline() == "stopping\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM  # the signal's own default action
    finally:
        end(proc)


def test_a_stop_that_does_not_finish_in_its_grace_ends_the_process_hard() -> None:
    proc = stuck(grace=0.2)
    try:
        proc.send_signal(signal.SIGHUP)
        assert proc.stdout is not None and proc.stdout.readline() == "stopping\n"
        assert proc.wait(60) == -signal.SIGHUP
    finally:
        end(proc)


def end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()  # only on failure: the process this test started
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_an_idle_interactive_session_exits_on_sigterm(place: tuple[Path, Path, Path]) -> None:
    home, ws, script = place
    term = Term(chat("idle", "bypass"), cwd=ws, home=home, script=script)
    try:
        term.wait_for("▸ bypass")
        os.kill(term.child.pid, signal.SIGTERM)  # the kiso process this test started
        term.wait(lambda: term.eof, 60, "kiso to exit")
        assert term.exit_status() == 128 + signal.SIGTERM
    finally:
        term.close()
    assert "Traceback" not in term.text
    assert "nothing was sent, so no session was saved" in term.text


def test_the_terminal_going_away_stops_the_run_as_esc_does(
    place: tuple[Path, Path, Path],
) -> None:
    """A real hangup: the PTY's master end is closed (a closed window, a dropped ssh session), so
    kiso gets SIGHUP from the kernel and has no terminal left to write to. The stop is recorded
    all the same, with no traceback, and kiso exits 129."""
    home, ws, script = place
    term = Term(chat("hup", "bypass"), cwd=ws, home=home, script=script)
    pty = term.child.ptyproc
    try:
        term.wait_for("▸ bypass")
        term.send("run it" + ENTER)
        term.wait(lambda: command_pids(ws) is not None, 60, "the command to start")
        pids = wait_for_pids(ws)
        assert all(alive(pid) for pid in pids)
        pty.fileobj.close()  # the terminal goes away; nothing is signalled by this test
        deadline = time.monotonic() + 60
        while pty.isalive():  # reaps it, keeping its status
            assert time.monotonic() < deadline, "kiso did not exit after the hangup"
            time.sleep(0.02)
        assert pty.exitstatus == 128 + signal.SIGHUP, (pty.exitstatus, pty.signalstatus)
    finally:
        term.close()
    assert not [pid for pid in pids if alive(pid)], "the command's tree outlived the hangup"
    stopped_cleanly(home, "hup", "SIGHUP")
    resumes_without_a_ruling(home, ws, script, "hup")
