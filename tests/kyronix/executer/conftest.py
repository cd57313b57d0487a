"""Shared fixtures: every executer test keeps its receipts (and KYRONIX_HOME) in its tmp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kyronix.executer import ROOT_POLICIES, KyronixExecuter, PermissionManager


@pytest.fixture(autouse=True)
def _kyronix_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KYRONIX_HOME", str(tmp_path / "kyronix-home"))


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """The base path tools run in (real, so results compare with resolved paths)."""
    root = tmp_path / "project"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def root_executer(tmp_path: Path) -> Iterator[KyronixExecuter]:
    ex = KyronixExecuter(
        permissions=PermissionManager(ROOT_POLICIES), receipts=tmp_path / "receipts.sqlite3"
    )
    yield ex
    ex.close()


@pytest.fixture
def safe_executer(tmp_path: Path) -> Iterator[KyronixExecuter]:
    ex = KyronixExecuter(receipts=tmp_path / "receipts.sqlite3")
    yield ex
    ex.close()
