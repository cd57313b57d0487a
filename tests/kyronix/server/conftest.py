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
def make_client(kx_home: Path) -> Iterator[Any]:
    """make_client(**config changes) -> (TestClient, app); closed at teardown."""
    opened: list[TestClient] = []

    def make(**changes: Any) -> tuple[TestClient, Any]:
        app = create_app(config(kx_home, **changes))
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        opened.append(client)
        return client, app

    yield make
    for client in reversed(opened):
        client.__exit__(None, None, None)
