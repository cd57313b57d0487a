"""A full disk under a real ``kyronix serve``: its database on a small tmpfs the test fills.

While the disk is full, every request that must write is answered with the one clear error
(``503 storage_unavailable``, never a 500 with a traceback); the run that was going when the
disk filled is answered the same, and is settled (its hold released, its session freed) as soon
as space returns; the live server serves again without a restart.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from .helpers import ServerProcess, auth, bootstrap, kyronix, wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tiny_home(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs of the test's own (mounted here, unmounted after)."""
    home = tmp_path / "tiny"
    home.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(home)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert mounted.returncode == 0, f"the test needs to mount a tmpfs: {mounted.stderr}"
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the file system has no room left."""
    chunk = b"\0" * (256 * 1024)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk = chunk[: len(chunk) // 2]
                if len(chunk) < 512:
                    return
    finally:
        os.close(fd)


def status_of(home: Path, run_id: str) -> str:
    with contextlib.closing(sqlite3.connect(home / "kyronix.sqlite3", timeout=30)) as db:
        (status,) = db.execute("SELECT status FROM kx_runs WHERE id = ?", (run_id,)).fetchone()
    return str(status)


def running(home: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(home / "kyronix.sqlite3", timeout=30)) as db:
        return [r[0] for r in db.execute("SELECT id FROM kx_runs WHERE status = 'running'")]


def test_a_full_disk_is_one_clear_error_and_the_live_server_recovers(tiny_home: Path) -> None:
    home = tiny_home
    _, key = bootstrap(home)
    with ServerProcess(home, {"KYRONIX_SCRIPTED_DELAY_MS": "1500"}) as srv:
        with srv.client(headers=auth(key)) as http:
            assert http.post("/api/agents/coding", json={"input": "warm"}).status_code == 200
        going: list[Any] = []

        def run() -> None:
            with srv.client(headers=auth(key)) as http:
                going.append(http.post("/api/agents/coding", json={"input": "while it fills"}))

        t = threading.Thread(target=run)
        t.start()
        assert wait_until(lambda: len(running(home)) == 1, 60), srv.log
        (run_id,) = running(home)
        filler = home / "filler"
        fill(filler)  # the run's model is still answering: its turn cannot be written now
        t.join(120)
        (r,) = going
        assert isinstance(r, httpx2.Response)
        assert r.status_code == 503 and r.json()["error"]["code"] == "storage_unavailable", r.text
        with srv.client(headers=auth(key)) as http:
            for _ in range(3):  # every write is the same clear answer, never a 500
                made = http.post("/api/agents/coding", json={"input": "x" * 200_000})
                assert made.status_code == 503, made.text
                assert made.json()["error"]["code"] == "storage_unavailable"
                assert int(made.headers["retry-after"]) > 0
            assert http.get("/api/credits").status_code == 200  # reads go on
        filler.unlink()  # space returns
        assert wait_until(lambda: status_of(home, run_id) != "running", 120), srv.log
        with srv.client(headers=auth(key)) as http:
            again = http.post("/api/agents/coding", json={"input": "after"})
            assert again.status_code == 200, again.text
            credits = http.get("/api/credits").json()
    assert status_of(home, run_id) == "interrupted"  # nothing was charged for it
    assert credits["held"] == 0
    shown = kyronix("credits", "show", "demo", home=home)
    assert shown.returncode == 0, shown.stderr  # balance == the ledger's sum
    assert "Traceback" not in srv.log, srv.log
    assert "cannot write" in srv.log
