"""Streams against a real ``kyronix serve``: iterators, callbacks, and a dropped stream resumed
with ``Last-Event-ID`` (the proxy cuts the connection mid-stream)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx2
import pytest

from kyronix import (
    APIConnectionError,
    Kyronix,
    KyronixError,
    NotFoundError,
    ProjectNotFoundError,
    RunResponse,
    kml,
)
from kyronix.client import TextStream
from tests.kyronix.server.helpers import auth

from .conftest import Served, start
from .proxy import Pass, Proxy, Request

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server whose scripted model spreads each answer over a second, in small pieces."""
    yield from start(tmp_path_factory.mktemp("slow") / "home", KYRONIX_SCRIPTED_DELAY_MS="1000")


def tools(text: str) -> list[str]:
    return [t.name for t in kml.parse(text).tools]


def test_a_stream_without_callbacks_is_an_iterator_of_chunks(slow: Served) -> None:
    with Kyronix(api_key=slow.key, base_url=slow.url) as kx:
        stream = kx.stream(agent="coding", input="Create src/stream.py")
        assert isinstance(stream, TextStream) and stream.result is None
        chunks = list(stream)
    assert len(chunks) > 3  # the model's text, as it was generated
    result = stream.result
    assert isinstance(result, RunResponse) and result.run_id == stream.run_id
    assert "".join(chunks) == slow.transcript(result.run_id)[0]
    assert tools("".join(chunks)) == tools(result.response)  # response: ids assigned
    assert slow.ledger(result.run_id)[-1] == ("settle", -500, result.run_id)


def test_callbacks_run_the_stream_to_its_end(slow: Served) -> None:
    chunks: list[str] = []
    done: list[RunResponse] = []
    with Kyronix(api_key=slow.key, base_url=slow.url) as kx:
        got = kx.stream(input="Create src/cb.py", on_chunk=chunks.append, on_complete=done.append)
    assert isinstance(got, RunResponse) and done == [got]
    assert "".join(chunks) == slow.transcript(got.run_id)[0]


def test_an_error_goes_to_on_error_and_is_not_raised(server: Served) -> None:
    errors: list[KyronixError] = []
    chunks: list[str] = []
    with Kyronix(api_key=server.key, base_url=server.url) as kx:
        got = kx.stream(
            input="x", project_id="proj_nothere1", on_chunk=chunks.append, on_error=errors.append
        )
        assert got is None and chunks == []
        assert [type(e) for e in errors] == [ProjectNotFoundError]
        assert kx.stream(agent="poetry", input="x", on_error=errors.append) is None
        assert isinstance(errors[-1], NotFoundError) and errors[-1].code == "agent_not_found"
        with pytest.raises(NotFoundError, match="no agent 'poetry'"):
            kx.stream(agent="poetry", input="x")  # no callback: raised, at the call


def test_a_custom_agent_streams(server: Served) -> None:
    made = httpx2.post(
        f"{server.url}/api/customagents",
        headers=auth(server.key),
        json={"name": "notes", "tools": [{"name": "note", "params": ["text"]}]},
        timeout=30,
    )
    agent_id = made.json()["id"]
    with Kyronix(api_key=server.key, base_url=server.url) as kx:
        stream = kx.stream_custom_agent(agent_id, "Write a note")
        text = "".join(stream)
        assert stream.result is not None and tools(stream.result.response) == ["note"]
        assert tools(text) == ["note"]


def test_a_dropped_stream_is_resumed_after_its_last_event(slow: Served) -> None:
    """The proxy cuts the first stream after a few events; the client joins the run again with
    Last-Event-ID and gets the rest: the text is whole, nothing is repeated, one charge."""

    def plan(index: int, _request: Request) -> Pass:
        return Pass(cut_after=300) if index == 0 else Pass()

    with Proxy(slow.url, plan) as proxy, Kyronix(api_key=slow.key, base_url=proxy.url) as kx:
        stream = kx.stream(input="Create src/resumed.py")
        chunks = list(stream)
    result = stream.result
    assert result is not None
    first, rejoin = proxy.requests
    assert (first.method, first.path) == ("POST", "/api/agents/coding/stream")
    assert (rejoin.method, rejoin.path) == ("GET", f"/api/runs/{result.run_id}/stream")
    resumed_at = rejoin.headers["last-event-id"]
    assert re.fullmatch(r"0:\d+", resumed_at) and resumed_at != "0:0"
    assert "".join(chunks) == slow.transcript(result.run_id)[0]  # whole, nothing twice
    assert [r[0] for r in slow.ledger(result.run_id)] == ["hold", "release", "settle"]


def test_a_stream_that_keeps_dropping_is_a_connection_error(slow: Served) -> None:
    def plan(index: int, _request: Request) -> Pass:
        return Pass(cut_after=5)  # not even one whole event, every time

    with Proxy(slow.url, plan) as proxy:
        with Kyronix(api_key=slow.key, base_url=proxy.url, max_retries=1) as kx:
            stream = kx.stream(input="Create src/flaky.py")
            with pytest.raises(APIConnectionError, match="kept dropping"):
                list(stream)
        assert len(proxy.requests) == 2


def test_closing_a_stream_early_leaves_the_run_going(slow: Served) -> None:
    with Kyronix(api_key=slow.key, base_url=slow.url) as kx:
        with kx.stream(input="Create src/early.py") as stream:
            first = next(stream)
        run_id = stream.run_id
        assert first and run_id
        got = httpx2.get(f"{slow.url}/api/runs/{run_id}", headers=auth(slow.key), timeout=60)
    assert got.status_code == 200 and got.json()["runId"] == run_id  # it finished anyway
