"""The single-writer lock, proven with real processes and a real SIGKILL."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
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

from kiso.kernel import (
    AppendError,
    JsonlSessionStore,
    Outcome,
    RunEnded,
    SessionLockedError,
    StoreError,
    User,
)
from kiso.kernel.lock import LOCK_ATTEMPTS, SessionLock, flock_holders

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
    # Reaped, so the kernel has dropped its flock: the very next open (which never waits: the
    # lock is taken with LOCK_NB) must succeed, with no retry and no sleep in between.
    with JsonlSessionStore(home).open(session) as writer:
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


# --------------------------------------------------------------------------- the lock is the log
# docs/adr/0011-the-lock-is-the-log.md: the flock is on the log's inode, so no operation on
# <id>.lock (the holder's record) can let a second writer in.

OPENER = textwrap.dedent(
    """
    import sys
    from kiso.kernel import JsonlSessionStore, SessionLockedError
    try:
        JsonlSessionStore(sys.argv[1]).open(sys.argv[2]).close()
    except SessionLockedError as exc:
        print("REFUSED", exc)
        sys.exit(3)
    print("OPENED")
    """
)


def second_writer(home: Path, session_id: str) -> subprocess.CompletedProcess[str]:
    """Another process that tries to open the session for writing, and says what happened."""
    return subprocess.run(
        [sys.executable, "-c", OPENER, str(home), session_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _lock_file(home: Path, session_id: str) -> Path:
    return JsonlSessionStore(home).path_of(session_id).with_suffix(".lock")


def test_deleting_the_lock_file_lets_no_second_writer_in(home: Path, session: str) -> None:
    with holder_process(home, session) as holder:
        record = _lock_file(home, session)
        assert f'"pid": {holder.pid}' in record.read_text()
        record.unlink()
        other = second_writer(home, session)
        assert other.returncode == 3, other.stdout + other.stderr
        assert f"pid {holder.pid}" in other.stdout  # named from /proc/locks: the record is gone
        assert "Traceback" not in other.stderr
        with pytest.raises(SessionLockedError, match=f"pid {holder.pid}"):
            JsonlSessionStore(home).open(session)
        # and a kill -9 of the holder still frees the session at once
        os.killpg(holder.pid, signal.SIGKILL)
        assert holder.wait() == -signal.SIGKILL
    assert second_writer(home, session).stdout.strip() == "OPENED"
    with JsonlSessionStore(home).open(session) as writer:
        writer.append(RunEnded(run="held", outcome=Outcome.aborted("crash")))


@pytest.mark.parametrize(
    "replacement",
    [
        b"",  # an empty file
        b"not a record",
        b'{"pid": 1, "host": "elsewhere", "since": 0}',  # a lie: pid 1 holds nothing
        b'{"pid": 1, "host": "elsewhere", "since": 0, "dev": 1, "ino": 2}',
    ],
    ids=["empty", "garbage", "forged", "forged-inode"],
)
def test_replacing_the_lock_file_lets_no_second_writer_in(
    home: Path, session: str, replacement: bytes
) -> None:
    with holder_process(home, session) as holder:
        record = _lock_file(home, session)
        fresh = record.with_name("fresh.tmp")
        fresh.write_bytes(replacement)
        os.replace(fresh, record)  # a different file at the path, as an editor would leave it
        other = second_writer(home, session)
        assert other.returncode == 3, other.stdout + other.stderr
        assert f"pid {holder.pid}" in other.stdout
        assert "elsewhere" not in other.stdout  # the forged record is not believed
        os.killpg(holder.pid, signal.SIGKILL)
        assert holder.wait() == -signal.SIGKILL
    assert second_writer(home, session).stdout.strip() == "OPENED"


def test_the_holder_record_is_cleared_on_close_and_never_deleted(home: Path, session: str) -> None:
    store = JsonlSessionStore(home)
    record = _lock_file(home, session)
    with store.open(session):
        held = json.loads(record.read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        assert (held["dev"], held["ino"]) == (
            store.path_of(session).stat().st_dev,
            store.path_of(session).stat().st_ino,
        )
    assert record.exists() and record.read_bytes() == b""


def test_a_log_replaced_under_its_writer_is_noticed_by_both_writers(
    home: Path, session: str
) -> None:
    """Renaming the log away and putting a copy at its path makes a different inode, which a
    path-based lock cannot cover: the holder finds out with still_at_path(), and a second
    writer is refused while the holder lives (the record names the inode the holder locked)."""
    store = JsonlSessionStore(home)
    path = store.path_of(session)
    with holder_process(home, session) as holder:
        os.rename(path, path.with_name("moved.jsonl"))
        shutil.copyfile(path.with_name("moved.jsonl"), path)
        other = second_writer(home, session)
        assert other.returncode == 3, other.stdout + other.stderr
        assert f"pid {holder.pid}" in other.stdout and "replaced" in other.stdout
        os.killpg(holder.pid, signal.SIGKILL)
        assert holder.wait() == -signal.SIGKILL
    assert second_writer(home, session).stdout.strip() == "OPENED"  # the holder is gone


def test_still_at_path_tells_the_holder_its_log_was_replaced(home: Path, session: str) -> None:
    store = JsonlSessionStore(home)
    path = store.path_of(session)
    lock = SessionLock.acquire(path, session)
    try:
        assert lock.still_at_path()
        lock.check_at_path()
        os.rename(path, path.with_name("moved.jsonl"))
        assert not lock.still_at_path()  # deleted or renamed away
        shutil.copyfile(path.with_name("moved.jsonl"), path)
        assert not lock.still_at_path()  # a copy at the path is another file
        with pytest.raises(AppendError, match="moved, deleted or replaced"):
            lock.check_at_path()
    finally:
        lock.release()


def test_a_writer_refuses_to_append_to_a_log_that_was_replaced(home: Path, session: str) -> None:
    store = JsonlSessionStore(home)
    path = store.path_of(session)
    with store.open(session) as writer:
        os.rename(path, path.with_name("moved.jsonl"))
        shutil.copyfile(path.with_name("moved.jsonl"), path)
        with pytest.raises(AppendError, match="replaced"):
            writer.append(User(run="r", content="to which file?"))
    assert path.read_bytes() == path.with_name("moved.jsonl").read_bytes()


def test_a_log_replaced_between_open_and_flock_is_opened_again(
    home: Path, session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """acquire() locks, then checks the inode at the path is the one it locked; if not (a repair
    renamed a new log over it in between), it opens the path again and locks that."""
    path = JsonlSessionStore(home).path_of(session)
    real_flock = fcntl.flock
    attempts: list[int] = []

    def flock(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX:
            attempts.append(os.fstat(fd).st_ino)
            if len(attempts) == 1:  # replace the log right after the first open
                copy = path.with_name("copy.tmp")
                shutil.copyfile(path, copy)
                os.replace(copy, path)
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    lock = SessionLock.acquire(path, session)
    try:
        assert len(attempts) == 2 and attempts[0] != attempts[1]
        assert attempts[1] == path.stat().st_ino and lock.still_at_path()
    finally:
        lock.release()


def test_a_log_that_keeps_being_replaced_is_refused(
    home: Path, session: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = JsonlSessionStore(home).path_of(session)
    real_flock = fcntl.flock

    def flock(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX:
            copy = path.with_name("copy.tmp")
            shutil.copyfile(path, copy)
            os.replace(copy, path)
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(StoreError, match=f"replaced {LOCK_ATTEMPTS} times"):
        SessionLock.acquire(path, session)
    monkeypatch.undo()
    JsonlSessionStore(home).open(session).close()  # nothing was left locked


def test_a_new_log_is_locked_before_it_appears_at_its_path(
    home: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """create() locks the temporary file and then links it: whoever finds the new log at its
    path, even in the instant after the link, finds it locked."""
    store = JsonlSessionStore(home)
    real_link = os.link
    seen: list[str] = []

    def link(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_link(src, dst)
        if os.fspath(dst).endswith("new.jsonl"):  # the instant the log exists
            seen.append(second_writer(home, "new").stdout)

    monkeypatch.setattr(os, "link", link)
    with store.create(workspace, session_id="new"):
        pass
    (out,) = seen
    assert out.startswith("REFUSED") and f"pid {os.getpid()}" in out


def test_flock_holders_reads_proc_locks(tmp_path: Path) -> None:
    table = tmp_path / "locks"
    table.write_text(
        "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146340 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 4343 fe:00:2146340 0 EOF\n"
        "2: POSIX  ADVISORY  WRITE 99 fe:00:2146340 0 EOF\n"
        "3: FLOCK  ADVISORY  READ 77 fe:00:2146340 0 EOF\n"
        "4: FLOCK  ADVISORY  WRITE 55 00:2a:2146340 0 EOF\n"
    )
    assert flock_holders(os.makedev(0xFE, 0), 2146340, str(table)) == [4242]
    assert flock_holders(os.makedev(0, 0x2A), 2146340, str(table)) == [55]
    assert flock_holders(os.makedev(0xFE, 0), 1, str(table)) == []
    assert flock_holders(1, 1, str(tmp_path / "absent")) is None
