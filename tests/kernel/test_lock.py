"""The single-writer lock, proven with real processes and a real SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kiso.kernel import JsonlSessionStore, Outcome, RunEnded, SessionLockedError, User

HOLDER = textwrap.dedent(
    """
    import sys, time
    from kiso.kernel import JsonlSessionStore, ModelRef, RunStarted, User
    store = JsonlSessionStore(sys.argv[1])
    writer = store.open(sys.argv[2])
    writer.append(RunStarted(run="held", trigger="user", model=ModelRef("faux", "m"),
                             mode="default"), User(run="held", content="from the holder"))
    print("HOLDING", flush=True)
    time.sleep(120)
    """
)


@contextmanager
def holder_process(home: Path, session_id: str) -> Iterator[subprocess.Popen[str]]:
    """A real process that opens the session for writing and keeps it open."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(home), session_id],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "HOLDING"
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def session(home: Path, workspace: Path) -> str:
    JsonlSessionStore(home).create(workspace, session_id="k9").close()
    return "k9"


def test_a_second_process_is_refused_with_the_holder_named(home: Path, session: str) -> None:
    with holder_process(home, session) as holder:
        with pytest.raises(SessionLockedError) as info:
            JsonlSessionStore(home).open(session)
        message = str(info.value)
        assert f"pid {holder.pid}" in message
        assert socket.gethostname() in message
        assert time.strftime("%Y-%m-%d") in message
        assert "k9" in message
        # reading never needs the lock
        assert [e.type for e in JsonlSessionStore(home).load(session).events] == [
            "run_started",
            "user",
        ]


def test_a_holder_killed_by_sigkill_frees_the_lock_at_once(home: Path, session: str) -> None:
    with holder_process(home, session) as holder:
        with pytest.raises(SessionLockedError):
            JsonlSessionStore(home).open(session)
        os.killpg(holder.pid, signal.SIGKILL)
        assert holder.wait() == -signal.SIGKILL
    began = time.monotonic()
    with JsonlSessionStore(home).open(session) as writer:
        elapsed = time.monotonic() - began
        assert elapsed < 0.5, f"reopening took {elapsed:.3f}s"
        assert len(writer.events) == 2  # the dead holder's appends are durable
        writer.append(RunEnded(run="held", outcome=Outcome.aborted("crash")))
    assert JsonlSessionStore(home).load(session).events[-1].seq == 3


def test_the_lock_is_held_against_a_second_open_in_the_same_process(
    home: Path, session: str
) -> None:
    store = JsonlSessionStore(home)
    first = store.open(session)
    with pytest.raises(SessionLockedError, match=f"pid {os.getpid()}"):
        store.open(session)
    first.close()
    with store.open(session) as again:
        (event,) = again.append(User(run="r", content="after the first writer closed"))
        assert event.seq == 1


def test_a_child_process_does_not_inherit_the_lock(home: Path, session: str) -> None:
    """The lock fd is close-on-exec: a tool subprocess cannot keep a session locked."""
    store = JsonlSessionStore(home)
    with store.open(session):
        sleeper = subprocess.Popen(["sleep", "30"], close_fds=False)
    try:
        store.open(session).close()  # the writer closed; the child must not hold the lock
    finally:
        sleeper.kill()
        sleeper.wait()
