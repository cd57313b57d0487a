"""A real model, offline: kiso sessions against llama.cpp's server through each adapter.

SmolLM2-135M is far too small to use tools well, so these runs check the plumbing a real server
exercises that a scripted one cannot: real streaming quirks, real usage counts, real stop reasons.
A run either completes or ends honestly at the output limit; either way the committed turn is on
disk with the provider's own counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import Assistant, JsonlSessionStore, RunEnded
from kiso.providers import AnthropicAdapter, OpenAICompatAdapter, OpenAIResponsesAdapter
from kiso.runtime import Agent
from kiso.tools import builtin_tools

from .llama import llama_server


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with llama_server() as url:
        yield url


def adapter(kind: str, url: str) -> Any:
    if kind == "openai-compat":
        return OpenAICompatAdapter(
            model="smollm2", api_key="local", base_url=f"{url}/v1", max_output_tokens=48
        )
    if kind == "openai-responses":
        return OpenAIResponsesAdapter(
            model="smollm2", api_key="local", base_url=f"{url}/v1", max_output_tokens=48
        )
    return AnthropicAdapter(model="smollm2", api_key="local", base_url=url, max_output_tokens=48)


@pytest.mark.parametrize("kind", ["openai-compat", "openai-responses", "anthropic"])
def test_a_real_session_through_each_adapter(server: str, kind: str, tmp_path: Path) -> None:
    store = JsonlSessionStore(tmp_path / "home")
    agent = Agent(
        adapter=adapter(kind, server),
        tools=builtin_tools(),
        store=store,
        workspace=tmp_path,
        system_prompt="You are a terse assistant. Answer in one short sentence.",
        mode="plan",
        max_turns=2,
        retry_base_delay=0.05,
    )
    with agent.session("real") as session:
        seen = [e.type for e in session.run_sync("What is the capital of France?")]
    assert seen[-1] == "terminal"
    assert "text_delta" in seen  # streamed live
    log = store.load("real")
    turns = [e for e in log.events if isinstance(e, Assistant)]
    assert turns, "no model turn was committed"
    first = turns[0]
    assert first.text.strip() or first.calls
    assert first.usage.output is not None and first.usage.output > 0  # the server's own count
    assert first.usage.input is not None and first.usage.input > 0
    ended = log.events[-1]
    assert isinstance(ended, RunEnded)
    assert ended.outcome.kind in ("completed", "max_turns") or ended.outcome.code in (
        "max_tokens",
        "invalid_tool_call",
    ), ended.outcome


def test_a_prompt_longer_than_the_servers_context_is_a_context_overflow(server: str) -> None:
    import asyncio

    from kiso.kernel import TextBlock, UserMessage
    from kiso.providers import ModelRequest, ProviderError

    adapter = OpenAICompatAdapter(model="smollm2", api_key="local", base_url=f"{server}/v1")
    too_long = ModelRequest(None, (UserMessage((TextBlock("word " * 6000),)),))

    async def drain() -> None:
        async for _ in adapter.stream(too_long):
            pass

    with pytest.raises(ProviderError) as caught:
        asyncio.run(drain())
    assert (caught.value.status, caught.value.code) == (400, "context_overflow")
    assert not caught.value.retryable
    assert "4096" in caught.value.message  # the server's n_ctx
