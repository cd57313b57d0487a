"""AsyncKyronix against a real ``kyronix serve``: the same methods, awaited."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from kyronix import (
    AsyncKyronix,
    AsyncSession,
    AuthenticationError,
    KyronixError,
    ProjectNotFoundError,
    RunResponse,
    kml,
)
from kyronix.client import AsyncTextStream

from .conftest import Served, start
from .proxy import Drop, Pass, Proxy, Request

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from start(tmp_path_factory.mktemp("slow") / "home", KYRONIX_SCRIPTED_DELAY_MS="500")


def test_run_and_sessions_are_awaited(server: Served) -> None:
    async def main() -> tuple[RunResponse, list[dict[str, object]], str]:
        async with AsyncKyronix(api_key=server.key, base_url=server.url) as kx:
            once = await kx.run(agent="research", input="Find the pricing page")
            session = await kx.create_session(agent="sales")
            assert isinstance(session, AsyncSession)
            await session.send("Draft an email to ACME")
            await session.send("Shorter, please")
            return once, await session.get_messages(), session.get_id()

    once, messages, session_id = asyncio.run(main())
    assert [t.name for t in kml.parse(once.response).tools]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == "Shorter, please"
    assert session_id.startswith("sess_")


def test_async_errors_are_the_same_exceptions(server: Served) -> None:
    async def main() -> None:
        async with AsyncKyronix(api_key=server.key, base_url=server.url) as kx:
            with pytest.raises(ProjectNotFoundError):
                await kx.run(input="x", project_id="proj_nothere1")
        async with AsyncKyronix(api_key="kyr_" + "y" * 43, base_url=server.url) as bad:
            with pytest.raises(AuthenticationError):
                await bad.run(input="x")

    asyncio.run(main())


def test_concurrent_runs_share_one_client(server: Served) -> None:
    async def main() -> list[RunResponse]:
        async with AsyncKyronix(api_key=server.key, base_url=server.url) as kx:
            return await asyncio.gather(*(kx.run(input=f"task {i}") for i in range(8)))

    results = asyncio.run(main())
    assert len({r.run_id for r in results}) == 8
    for r in results:
        assert server.ledger(r.run_id)[-1] == ("settle", -500, r.run_id)


def test_a_lost_response_is_retried_with_the_same_key_and_charged_once(server: Served) -> None:
    def plan(index: int, _request: Request) -> Drop | Pass:
        return Drop() if index == 0 else Pass()

    async def main(url: str) -> RunResponse:
        async with AsyncKyronix(api_key=server.key, base_url=url) as kx:
            return await kx.run(input="Create src/async_once.py")

    with Proxy(server.url, plan) as proxy:
        got = asyncio.run(main(proxy.url))
    first, retry = proxy.requests
    assert first.headers["idempotency-key"] == retry.headers["idempotency-key"]
    assert proxy.responses[1].headers.get("idempotent-replayed") == "true"
    assert [r[0] for r in server.ledger(got.run_id)] == ["hold", "release", "settle"]


def test_async_streams_iterate_and_call_back(slow: Served) -> None:
    seen: list[str] = []

    async def on_chunk(chunk: str) -> None:  # a coroutine callback is awaited
        await asyncio.sleep(0)
        seen.append(chunk)

    async def main() -> tuple[AsyncTextStream, list[str], RunResponse | None]:
        async with AsyncKyronix(api_key=slow.key, base_url=slow.url) as kx:
            stream = await kx.stream(input="Create src/astream.py")
            chunks = [chunk async for chunk in stream]
            done = await kx.stream(input="Create src/acb.py", on_chunk=on_chunk)
            return stream, chunks, done

    stream, chunks, done = asyncio.run(main())
    assert stream.result is not None and stream.result.run_id == stream.run_id
    assert "".join(chunks) == slow.transcript(stream.result.run_id)[0]
    assert isinstance(done, RunResponse) and "".join(seen) == slow.transcript(done.run_id)[0]


def test_an_async_stream_is_resumed_after_a_drop(slow: Served) -> None:
    def plan(index: int, _request: Request) -> Pass:
        return Pass(cut_after=250) if index == 0 else Pass()

    async def main(url: str) -> tuple[list[str], AsyncTextStream]:
        async with AsyncKyronix(api_key=slow.key, base_url=url) as kx:
            stream = await kx.stream(input="Create src/aresumed.py")
            return [c async for c in stream], stream

    with Proxy(slow.url, plan) as proxy:
        chunks, stream = asyncio.run(main(proxy.url))
    assert stream.result is not None
    assert [r.path for r in proxy.requests][1] == f"/api/runs/{stream.result.run_id}/stream"
    assert "".join(chunks) == slow.transcript(stream.result.run_id)[0]


def test_async_on_error_gets_the_error(server: Served) -> None:
    errors: list[KyronixError] = []

    async def main() -> RunResponse | None:
        async with AsyncKyronix(api_key=server.key, base_url=server.url) as kx:
            return await kx.stream(input="x", project_id="proj_nothere1", on_error=errors.append)

    assert asyncio.run(main()) is None
    assert [type(e) for e in errors] == [ProjectNotFoundError]
    assert json.dumps(errors[0].details) == "{}"
