"""A full disk, for real: a small tmpfs holds KISO_HOME and is filled to the last byte.

Creating, opening, resuming, ruling and repairing must each fail with an error that names the
file system and says what to do, never a traceback, and must leave every log byte for byte as it
was. Mounting needs root; where a plain mount is refused, each test re-runs itself inside a user
and mount namespace (``unshare -Urm``), where it is allowed. Nothing is skipped.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kiso.kernel import (
    AppendError,
    JsonlSessionStore,
    ModelRef,
    RunStarted,
    SettingChanged,
    StoreError,
    User,
)
from kiso.kernel.events import dumps_line

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent / "kiso"
INSIDE = "KISO_TEST_FULL_DISK"  # set when this test already runs on a disk mounted for it
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "KISO_FAUX_SCRIPT", "KISO_MODEL")


@dataclass
class Disk:
    mount: Path
    home: Path

    def fill(self) -> Path:
        """Write a file until not one more byte fits."""
        filler = self.mount / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1 << 20, 1 << 16, 1 << 12, 1):
                while _fits(fd, size):
                    pass
        finally:
            os.close(fd)
        probe = os.open(self.mount / "probe", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            assert not _fits(probe, 1)
        finally:
            os.close(probe)
            os.unlink(self.mount / "probe")
        return filler

    def says_full(self, message: str) -> None:
        """The message names this file system, says it is full and what to do."""
        assert f"the file system mounted at {self.mount} is full" in message, message
        assert "free some space there and try again" in message, message
        assert "Traceback" not in message, message


def _fits(fd: int, size: int) -> bool:
    try:
        os.write(fd, b"\0" * size)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        return False
    return True


@pytest.fixture
def disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Disk | None]:
    """A 4 MiB tmpfs with KISO_HOME on it, unmounted afterwards.

    ``None`` means this test was run, and passed, inside a namespace where the mount is allowed
    (the plain mount was refused): the test then has nothing left to do.
    """
    inside = os.environ.get(INSIDE)
    if inside:
        mount = Path(inside)
        yield Disk(mount, mount / "kiso-home")
        return
    mount = tmp_path / "disk"
    mount.mkdir()
    # KISO_TEST_MOUNT=unshare takes the namespace path even where a plain mount would work.
    plain = ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)]
    if os.environ.get("KISO_TEST_MOUNT") == "unshare":
        plain = ["false"]
    mounted = subprocess.run(plain, capture_output=True, text=True, check=False)
    if mounted.returncode != 0:  # not root: the same test, in a user + mount namespace
        inner = subprocess.run(
            [
                "unshare",
                "-Urm",
                "sh",
                "-c",
                'mount -t tmpfs -o size=4m,mode=0700 tmpfs "$1" && shift && exec "$@"',
                "sh",
                str(mount),
                "env",
                f"{INSIDE}={mount}",
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                request.node.nodeid,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert inner.returncode == 0, (
            f"mount refused ({mounted.stderr.strip()}), and in a namespace:\n"
            f"{inner.stdout}\n{inner.stderr}"
        )
        yield None
        return
    try:
        yield Disk(mount, mount / "kiso-home")
    finally:
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def start() -> list[RunStarted | User]:
    return [
        RunStarted(run="r1", trigger="user", model=ModelRef("faux", "m"), mode="default"),
        User(run="r1", content="hello"),
    ]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every session file (logs, their holder records) in a project folder, by name."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# --------------------------------------------------------------------------- through the store


def test_create_and_open_on_a_full_disk_say_so_and_change_nothing(
    disk: Disk | None, workspace: Path
) -> None:
    if disk is None:
        return
    store = JsonlSessionStore(disk.home)
    with store.create(workspace, session_id="old") as w:
        w.append(*start())
    with store.create(workspace, session_id="torn") as w:
        w.append(*start())
    torn = store.path_of("torn")
    with open(torn, "ab") as f:
        f.write(b'{"seq":3,"ts":1,"run":"r1","ty')  # an interrupted write, cut at the next open
    folder = store.project_dir(workspace)
    before = snapshot(folder)
    disk.fill()

    with pytest.raises(StoreError) as created:
        store.create(workspace, session_id="new")
    disk.says_full(str(created.value))
    assert "session new was not created" in str(created.value)
    for session in ("old", "torn"):
        with pytest.raises(StoreError) as opened:
            store.open(session)
        disk.says_full(str(opened.value))
        assert f"session {session} was not opened; its log was not changed" in str(opened.value)
    assert snapshot(folder) == before  # no new file, no half header, the torn tail untouched
    assert [r.id for r in sorted(store.list(), key=lambda r: r.id)] == ["old", "torn"]
    assert store.load("torn").torn_tail


def test_an_append_on_a_full_disk_is_refused_whole_and_the_log_kept(
    disk: Disk | None, workspace: Path
) -> None:
    if disk is None:
        return
    store = JsonlSessionStore(disk.home)
    writer = store.create(workspace, session_id="s")
    writer.append(*start())
    path = store.path_of("s")
    before = path.read_bytes()
    filler = disk.fill()
    with pytest.raises(AppendError) as info:
        writer.append(User(run="r1", content="x" * 10_000))
    disk.says_full(str(info.value))
    writer.close()
    assert path.read_bytes() == before  # the partial batch was taken back
    filler.unlink()  # space again: the session goes on from what is on disk
    with store.open("s") as again:
        again.append(User(run="r1", content="after"))
    assert [e.type for e in store.load("s").events] == ["run_started", "user", "user"]


# --------------------------------------------------------------------------- the kiso command


def pad_to_a_page(path: Path, page: int = 4096) -> None:
    """Append a neutral record (a setting nobody reads) that ends the log on a page boundary.

    A file system allocates whole blocks, so an append that fits in the slack of the log's last
    block succeeds on a full disk; a log that ends exactly on one makes the next append need a
    new block. Written straight to the file, as the session's writer would have.
    """
    log = JsonlSessionStore().load_path(path)
    last = log.events[-1]
    size = path.stat().st_size

    def line(fill: int) -> bytes:
        obj = SettingChanged(key="test.padding", value="x" * fill, run=last.run).to_json()
        obj["seq"], obj["ts"] = last.seq + 1, last.ts
        return dumps_line(obj)

    bare = len(line(0))
    fill = (-(size + bare)) % page
    data = line(fill)
    assert (size + len(data)) % page == 0
    with open(path, "ab") as f:
        f.write(data)
    assert JsonlSessionStore().load_path(path).events[-1].seq == last.seq + 1


def kiso(cwd: Path, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in KEYS and k != "KISO_FAILPOINT"}
    return subprocess.run(
        [str(BIN), *args],
        cwd=cwd,
        env={**base, "KISO_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_the_kiso_command_on_a_full_disk(disk: Disk | None, tmp_path: Path) -> None:
    """kiso -p, kiso resume, a ruling and kiso doctor: each exits 1 with the reason and what to
    do, no traceback, and the logs unchanged; with space again, the same commands work."""
    if disk is None:
        return
    ws = tmp_path / "ws"  # the workspace is elsewhere: only the store is on the full disk
    ws.mkdir()
    script = tmp_path / "script.json"
    call = {"name": "shell", "input": {"command": "echo ran >> effects.log"}}
    script.write_text(json.dumps({"turns": [{"tool_calls": [call]}, {"text": "done"}]}))
    s = str(script)
    home = disk.home
    # default mode, headless: the call is denied, the model answers, the run completes
    assert kiso(ws, home, "-p", "hi", "done1", KISO_FAUX_SCRIPT=s).returncode == 0
    killed = kiso(
        ws, home, "-p", "go", "k1", "--mode", "bypass",
        KISO_FAUX_SCRIPT=s, KISO_FAILPOINT="execution_started",
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL  # k1 is uncertain; its holder record was left
    k1 = JsonlSessionStore(home).path_of("k1")
    pad_to_a_page(k1)  # so that the ruling needs new space
    # The runtime may keep a killed execution's live output beside the log, and removes it on
    # resume: freed, its blocks would let the ruling through. Not the store's: gone first.
    shutil.rmtree(k1.with_suffix(".live"), ignore_errors=True)
    damaged = kiso(ws, home, "-p", "go", "d1", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert damaged.returncode == 0, damaged.stderr
    folder = JsonlSessionStore(home).path_of("d1").parent
    log = folder / "d1.jsonl"
    lines = log.read_bytes().split(b"\n")
    lines[3] = lines[3][:30] + b"\x00" + lines[3][31:]
    log.write_bytes(b"\n".join(lines))
    before = snapshot(folder)
    ran = (ws / "effects.log").read_text()
    assert ran == "ran\n"  # d1's effect; k1's was killed before it ran
    filler = disk.fill()

    attempts = {
        "kiso -p (a new session)": kiso(ws, home, "-p", "again", KISO_FAUX_SCRIPT=s),
        "kiso resume": kiso(ws, home, "resume", "done1", "more", KISO_FAUX_SCRIPT=s),
        "kiso resume --resolve": kiso(
            ws, home, "resume", "k1", "--resolve", "skip", "--mode", "bypass", KISO_FAUX_SCRIPT=s
        ),
        "kiso doctor": kiso(ws, home, "doctor", "d1"),
    }
    for what, out in attempts.items():
        assert out.returncode == 1, (what, out.stdout, out.stderr)
        disk.says_full(out.stderr)
        assert "Traceback" not in out.stdout
    after = snapshot(folder)
    assert sorted(after) == sorted(before)  # no file left behind
    logs = [name for name in before if name.endswith(".jsonl")]
    assert {n: after[n] for n in logs} == {n: before[n] for n in logs}, "a log changed"
    assert (ws / "effects.log").read_text() == ran

    filler.unlink()
    ruled = kiso(
        ws, home, "resume", "k1", "--resolve", "skip", "--mode", "bypass", KISO_FAUX_SCRIPT=s
    )
    assert ruled.returncode == 0, ruled.stderr
    assert (ws / "effects.log").read_text() == ran  # k1's effect skipped, as ruled
    fixed = kiso(ws, home, "doctor", "d1")
    assert fixed.returncode == 0 and "repaired" in fixed.stdout, fixed.stderr


def slack_in_last_page(path: Path, slack: int, page: int = 4096) -> None:
    """Pad the log (as :func:`pad_to_a_page` does) so that its last page has ``slack`` bytes free:
    room for the records of a short run, on a disk with no page left."""
    pad_to_a_page(path, page)
    log = JsonlSessionStore().load_path(path)
    last = log.events[-1]
    obj = SettingChanged(key="test.padding", value="", run=last.run).to_json()
    obj["seq"], obj["ts"] = last.seq + 1, last.ts
    bare = len(dumps_line(obj))
    obj["value"] = "x" * (page - slack - bare)
    with open(path, "ab") as f:
        f.write(dumps_line(obj))
    assert path.stat().st_size % page == page - slack


def test_a_store_that_cannot_hold_a_tools_bookkeeping_stops_the_run_as_the_stores_error(
    disk: Disk | None, tmp_path: Path
) -> None:
    """KISO_HOME full, the workspace not: the run's records fit in the log's last page, the
    shell's liveness guard does not. The run ends with the store's error naming its file system;
    the command never ran, nothing says it failed, no guard file is left; with space again,
    ``kiso resume`` runs it, with no ruling asked or made."""
    if disk is None:
        return
    ws = tmp_path / "ws"  # the workspace is elsewhere, with room to spare
    ws.mkdir()
    script = tmp_path / "script.json"
    call = {"name": "shell", "input": {"command": "echo ran >> effects.log"}}
    turns = [{"text": "hello"}, {"tool_calls": [call]}, {"text": "done"}]
    script.write_text(json.dumps({"turns": turns}))
    s, home = str(script), disk.home
    assert kiso(ws, home, "-p", "hi", "g1", KISO_FAUX_SCRIPT=s).returncode == 0
    log = JsonlSessionStore(home).path_of("g1")
    slack_in_last_page(log, 3000)
    live = log.with_suffix(".live")
    filler = disk.fill()
    # One page back: the writer's record of the opened session takes it, and the disk is full.
    os.truncate(filler, filler.stat().st_size - 4096)

    out = kiso(ws, home, "resume", "g1", "run it", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert f"kiso: could not write the session store at {home}: " in out.stderr
    disk.says_full(out.stderr)
    assert "could not start" not in out.stderr and "[shell] failed" not in out.stderr
    assert "kiso resume g1" in out.stderr
    assert not (ws / "effects.log").exists()  # the command never ran
    events = JsonlSessionStore(home).load("g1").events
    # The call's turn and verdict are there; nothing of its execution, so nothing to rule on.
    assert [e.type for e in events[-4:]] == ["run_started", "user", "assistant", "approval_decided"]
    assert not [e for e in events if e.type in ("execution_started", "execution_finished")]
    assert not live.exists(), "a guard file was left behind"

    filler.unlink()
    again = kiso(ws, home, "resume", "g1", "--mode", "bypass", KISO_FAUX_SCRIPT=s)
    assert again.returncode == 0, again.stderr
    assert (ws / "effects.log").read_text() == "ran\n"  # run once, now
    after = JsonlSessionStore(home).load("g1").events
    finished = [e for e in after if e.type == "execution_finished"]
    assert len(finished) == 1 and not finished[0].is_error  # type: ignore[attr-defined]
    assert not [e for e in after if e.type == "execution_resolved"]
    assert not live.exists()
