"""Fixtures of the SDK's tests: a real ``kyronix serve`` process with a project and its key."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.kyronix.server.helpers import ServerProcess, bootstrap


@dataclass
class Served:
    """A running server: its URL, the bootstrapped project and key, its home."""

    process: ServerProcess
    project: str
    key: str
    home: Path

    @property
    def url(self) -> str:
        return self.process.url

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.home / "kyronix.sqlite3", timeout=30)

    def ledger(self, run_id: str | None = None) -> list[tuple[str, int, str | None]]:
        """(kind, amount, run id) of the project's ledger rows (of one run, if given)."""
        with self.db() as conn:
            rows = list(
                conn.execute(
                    "SELECT kind, amount, run_id FROM kx_ledger WHERE project_id = ? ORDER BY id",
                    (self.project,),
                )
            )
        return [r for r in rows if run_id is None or r[2] == run_id]

    def runs(self) -> list[tuple[str, str, str | None]]:
        """(id, status, idempotency key) of every run of the project."""
        with self.db() as conn:
            return list(
                conn.execute(
                    "SELECT id, status, idem_key FROM kx_runs WHERE project_id = ? ORDER BY "
                    "created_at, id",
                    (self.project,),
                )
            )

    def transcript(self, run_id: str) -> list[str]:
        with self.db() as conn:
            row = conn.execute("SELECT transcript FROM kx_runs WHERE id = ?", (run_id,)).fetchone()
        texts: list[str] = json.loads(row[0])
        return texts


def start(home: Path, settings: dict[str, Any] | None = None, **env: str) -> Iterator[Served]:
    home.mkdir(mode=0o700, parents=True)
    if settings:
        (home / "server.json").write_text(json.dumps(settings))
    project, key = bootstrap(home)
    with ServerProcess(home, env) as process:
        yield Served(process, project, key, home)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for a module's tests (each test makes its own sessions and runs)."""
    yield from start(tmp_path_factory.mktemp("kyronix") / "home")


@pytest.fixture(autouse=True)
def _no_sdk_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reads KYRONIX_API_KEY / KYRONIX_BASE_URL: tests set them only on purpose."""
    monkeypatch.delenv("KYRONIX_API_KEY", raising=False)
    monkeypatch.delenv("KYRONIX_BASE_URL", raising=False)
