"""Driving an adapter against a scripted local server, shared by the OpenAI adapter tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kiso.providers import Adapter, ModelRequest, ProviderError, StreamEvent, TurnDone

from .sse import Recorded, Reply, SSEServer, Stream

AdapterFactory = Callable[..., Adapter]


def collect(
    make: AdapterFactory, script: Sequence[Stream | Reply], request: ModelRequest, **kw: Any
) -> tuple[list[StreamEvent], list[Recorded]]:
    """Every event of one stream, and every request the server received."""
    with SSEServer(script) as server:
        events = asyncio.run(drain(make(server, **kw), request))
    return events, server.requests


def failure(
    make: AdapterFactory, script: Sequence[Stream | Reply], request: ModelRequest
) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        collect(make, script, request)
    return caught.value


async def drain(adapter: Adapter, request: ModelRequest) -> list[StreamEvent]:
    return [event async for event in adapter.stream(request)]


def done_of(events: list[StreamEvent]) -> TurnDone:
    """The one TurnDone, which must come last."""
    assert isinstance(events[-1], TurnDone)
    assert sum(isinstance(e, TurnDone) for e in events) == 1
    return events[-1]
