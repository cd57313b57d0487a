"""What the server tests share: an in-process app, a real ``kyronix serve`` process, keys."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from kyronix import kml
from kyronix.server import accounts
from kyronix.server.config import ServerConfig, load_server_config
from tests.processes import alive

ROOT = Path(__file__).resolve().parents[3]

ON_BOTH = pytest.mark.parametrize("kx_db", ["sqlite", "postgresql"], indirect=True)
"""Run a ``make_client`` test on SQLite and on PostgreSQL (a real server, tests/pg.py)."""


def config(home: Path, **changes: Any) -> ServerConfig:
    return load_server_config(home, environ={}).with_(**changes)


def project_with_key(app: Any, name: str = "demo", credits: int | None = None) -> tuple[str, str]:
    """(project id, key) made directly in the app's database."""
    state = app.state.kx
    initial = state.config.initial_credits if credits is None else credits
    project = state.db.write(lambda c: accounts.create_project(c, name, initial))
    key, _ = state.db.write(lambda c: accounts.create_key(c, state.secret, project.id))
    return project.id, key


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def tools_of(response: str) -> list[str]:
    return [t.name for t in kml.parse(response).tools]


def sse_events(text: str) -> list[dict[str, Any]]:
    """Parse an SSE body into [{id, event, data}] (data decoded from JSON)."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        ev: dict[str, Any] = {}
        data = []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            else:
                ev[name] = value
        if data:
            ev["data"] = json.loads("\n".join(data))
            out.append(ev)
    return out


def kyronix(*args: str, home: Path, env: dict[str, str] | None = None, **kw: Any) -> Any:
    """Run the kyronix CLI in a child process."""
    return subprocess.run(
        [sys.executable, "-c", "from kyronix.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "KYRONIX_HOME": str(home), **(env or {})},
        timeout=120,
        check=False,
        **kw,
    )


class ServerProcess:
    """``kyronix serve --port 0`` in a child process; stderr is collected in ``log``."""

    def __init__(self, home: Path, env: dict[str, str] | None = None, *args: str) -> None:
        self.home = home
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from kyronix.cli import main; main()",
                "serve",
                "--port",
                "0",
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "KYRONIX_HOME": str(home), **(env or {})},
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(60) or not self.url:
            self.kill()
            raise RuntimeError("the server did not start:\n" + self.log)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "serving on " in line and not self.url:
                self.url = line.split("serving on ", 1)[1].split()[0]
                self._ready.set()
        self._ready.set()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def client(self, **kw: Any) -> httpx2.Client:
        return httpx2.Client(base_url=self.url, timeout=60, **kw)

    def signal(self, sig: int) -> None:
        if alive(self.pid):
            os.kill(self.pid, sig)

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout)
        self._close()
        return code

    def _close(self) -> None:
        self._reader.join(5)
        if self.proc.stderr is not None and not self._reader.is_alive():
            self.proc.stderr.close()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(10)
        self._close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()


@contextlib.contextmanager
def serving(home: Path, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    with ServerProcess(home, env) as server:
        yield server


def bootstrap(home: Path, name: str = "demo") -> tuple[str, str]:
    """(project id, key) through the CLI, as a user would."""
    made = kyronix("projects", "create", name, home=home)
    assert made.returncode == 0, made.stderr
    project = made.stdout.strip()
    key = kyronix("keys", "create", "--project", name, home=home)
    assert key.returncode == 0, key.stderr
    return project, key.stdout.strip()


def wait_until(predicate: Any, timeout: float = 30, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())
