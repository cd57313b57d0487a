from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kyronix.server.app import create_app

from .helpers import config


@pytest.fixture
def kx_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "kyronix-home"
    monkeypatch.setenv("KYRONIX_HOME", str(home))
    for name in ("KYRONIX_MODEL", "KYRONIX_RATE_LIMIT", "KYRONIX_SCRIPTED_DELAY_MS"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def kx_db(request: pytest.FixtureRequest) -> str | None:
    """The database ``make_client`` serves from: None (SQLite in the home, the default), or a
    PostgreSQL database of the test's own when a test parametrizes this fixture (``ON_BOTH``)."""
    if getattr(request, "param", "sqlite") != "postgresql":
        return None
    url: Any = request.getfixturevalue("pg_url")
    return str(url.render_as_string(hide_password=False))


@pytest.fixture
def make_client(kx_home: Path, kx_db: str | None) -> Iterator[Any]:
    """make_client(**config changes) -> (TestClient, app); closed at teardown."""
    opened: list[TestClient] = []

    def make(**changes: Any) -> tuple[TestClient, Any]:
        if kx_db is not None:
            changes.setdefault("db_url", kx_db)
        app = create_app(config(kx_home, **changes))
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        opened.append(client)
        return client, app

    yield make
    for client in reversed(opened):
        client.__exit__(None, None, None)
