from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

from kiso.kernel import JsonlSessionStore, MemorySessionStore

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from tests.pg import PgCluster

# Machines here are noisy: a slow example is not a failure. Examples stay deterministic per run.
settings.register_profile(
    "kiso", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("kiso")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test ever touches the real ~/.kiso, nor asks a package index for a new kiso (the
    release check's tests turn it back on against their own index)."""
    monkeypatch.setenv("KISO_HOME", str(tmp_path / "kiso-home"))
    monkeypatch.setenv("KISO_NO_UPDATE_CHECK", "1")


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


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One PostgreSQL for the whole session (tests/pg.py): KYRONIX_TEST_PG_URL's, or our own."""
    from tests.pg import PgUnavailable, start_cluster

    missing = None
    try:
        cluster = start_cluster()
    except PgUnavailable as exc:
        missing = str(exc)
    if missing is not None:  # outside the except: the message alone, no chained traceback
        pytest.fail(missing, pytrace=False)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[URL]:
    """A new, empty PostgreSQL database of this test's own, dropped after it."""
    url = pg_cluster.create_database()
    try:
        yield url
    finally:
        pg_cluster.drop_database(url)
