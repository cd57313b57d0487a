from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from kiso.kernel import JsonlSessionStore, MemorySessionStore

# Machines here are noisy: a slow example is not a failure. Examples stay deterministic per run.
settings.register_profile(
    "kiso", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("kiso")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test ever touches the real ~/.kiso."""
    monkeypatch.setenv("KISO_HOME", str(tmp_path / "kiso-home"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return Path(os.environ["KISO_HOME"])


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


def ticking_clock(start: int = 1_790_000_000_000):  # type: ignore[no-untyped-def]
    counter = itertools.count(start)
    return lambda: next(counter)


@pytest.fixture
def jsonl_store(home: Path) -> JsonlSessionStore:
    return JsonlSessionStore(home, clock=ticking_clock())


@pytest.fixture(params=["jsonl", "memory"])
def store(request: pytest.FixtureRequest, home: Path) -> JsonlSessionStore | MemorySessionStore:
    if request.param == "jsonl":
        return JsonlSessionStore(home, clock=ticking_clock())
    return MemorySessionStore(clock=ticking_clock())
