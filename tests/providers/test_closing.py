"""A stream leaves no task behind on its loop, so ``Task was destroyed but it is pending!`` never
prints.

The SDKs break out of their own async generators when a stream ends (openai on ``data: [DONE]``;
the anthropic adapter at ``message_stop``), and asyncio closes such a generator with a task the
loop must still run. ``Session.run_sync`` closes its loop as soon as the run ends, so each stream
is driven here exactly that way: a fresh loop, one ``run_until_complete`` per event, the loop
closed right after the last one. Then nothing may be pending on it, and collecting what is left
may log nothing. ``until_close`` bodies (no chunked framing: the body ends when the server closes
the connection) are the case where the generators' close had not run when the loop closed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kiso.kernel import TextBlock, UserMessage
from kiso.providers import Adapter, ModelRequest, ProviderError, TextDelta, TurnDone
from kiso.providers.anthropic import AnthropicAdapter
from kiso.providers.openai_compat import OpenAICompatAdapter
from kiso.providers.openai_responses import OpenAIResponsesAdapter

from .anthropic_server import error, text_block, turn
from .sse import Event, SSEServer, Stream
from .test_openai_compat import chunk, usage_chunk
from .test_openai_responses import Wire

HELLO = ModelRequest(system="Be brief.", messages=(UserMessage((TextBlock("hello"),)),))
BIN = Path(sys.executable).parent / "kiso"


def chat_stream(*, until_close: bool) -> Stream:
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hello"}),
        chunk({}, "stop"),
        usage_chunk(9, 1),
    ]
    return Stream([*(Event(c) for c in chunks), Event("[DONE]")], until_close=until_close)


def messages_stream(*, until_close: bool) -> Stream:
    events = turn(text_block(0, "Hello")).events
    return Stream([Event(data, event=kind) for kind, data in events], until_close=until_close)


def responses_stream(*, until_close: bool) -> Stream:
    return Stream(Wire().message("Hello").completed().events, until_close=until_close)


@dataclass
class Driven:
    events: list[Any]
    error: ProviderError | None
    pending: list[str]
    """Tasks not done when the loop closed."""
    suspended: list[str]
    """Async generators first run on the loop and neither finished nor closed when it closed."""


def drive_like_run_sync(adapter: Adapter, *, stop_after: int | None = None) -> Driven:
    """Drive one stream the way ``Session.run_sync`` does; ``stop_after``: close it early."""
    loop = asyncio.new_event_loop()
    stream = adapter.stream(HELLO)
    events: list[Any] = []
    error: ProviderError | None = None
    try:
        while stop_after is None or len(events) < stop_after:
            try:
                events.append(loop.run_until_complete(stream.__anext__()))
            except StopAsyncIteration:
                break
            except ProviderError as exc:
                error = exc
                break
    finally:
        loop.run_until_complete(stream.aclose())  # type: ignore[attr-defined]
        pending = [repr(task) for task in asyncio.all_tasks(loop) if not task.done()]
        # What loop.shutdown_asyncgens() would have to close; run_sync never calls it.
        live = list(loop._asyncgens)  # type: ignore[attr-defined]
        suspended = [g.__qualname__ for g in live if g.ag_frame is not None]
        del live
        loop.close()
    return Driven(events, error, pending, suspended)


class _Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def openai_compat(server: SSEServer) -> Adapter:
    return OpenAICompatAdapter(model="m", api_key="sk-test", base_url=server.url + "/v1")


def openai_responses(server: SSEServer) -> Adapter:
    return OpenAIResponsesAdapter(model="m", api_key="sk-test", base_url=server.url + "/v1")


def anthropic(server: SSEServer) -> Adapter:
    return AnthropicAdapter(model="claude-test-1", api_key="sk-ant-test", base_url=server.url)


ADAPTERS = pytest.mark.parametrize(
    ("make", "reply"),
    [
        (openai_compat, chat_stream),
        (openai_responses, responses_stream),
        (anthropic, messages_stream),
    ],
    ids=["openai-compat", "openai-responses", "anthropic"],
)


def check_clean(driven: Driven, logged: _Logged) -> None:
    assert driven.pending == []
    assert driven.suspended == []
    gc.collect()  # whatever is still pending would say so now
    assert not [m for m in logged.messages if "destroyed" in m], logged.messages


@pytest.fixture
def logged() -> Iterator[_Logged]:
    handler = _Logged()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("until_close", [False, True], ids=["chunked", "until-close"])
@ADAPTERS
def test_a_whole_stream_leaves_nothing_on_its_loop(
    make: Any, reply: Any, until_close: bool, logged: _Logged
) -> None:
    with SSEServer([reply(until_close=until_close)]) as server:
        driven = drive_like_run_sync(make(server))
    assert driven.error is None
    assert isinstance(driven.events[-1], TurnDone)
    assert driven.events[-1].blocks == (TextBlock("Hello"),)
    check_clean(driven, logged)


@ADAPTERS
def test_a_stream_its_consumer_closes_early_leaves_nothing_on_its_loop(
    make: Any, reply: Any, logged: _Logged
) -> None:
    with SSEServer([reply(until_close=False)]) as server:
        driven = drive_like_run_sync(make(server), stop_after=1)
    assert driven.events == [TextDelta("Hello")]
    check_clean(driven, logged)


def failing(reply: Any) -> Stream:
    """The stream's first events, then the provider's own error event."""
    if reply is chat_stream:
        return Stream([Event(chunk({"content": "Hel"})), Event({"error": {"message": "boom",
                       "type": "server_error"}})])  # fmt: skip
    if reply is responses_stream:
        return Wire().message("Hel").failed("server_error", "boom")
    events = [*turn(text_block(0, "Hel")).events[:3], ("error", error("api_error", "boom"))]
    return Stream([Event(data, event=kind) for kind, data in events])


@ADAPTERS
def test_an_error_in_the_stream_leaves_nothing_on_its_loop(
    make: Any, reply: Any, logged: _Logged
) -> None:
    with SSEServer([failing(reply)]) as server:
        driven = drive_like_run_sync(make(server))
    assert driven.error is not None and driven.error.retryable, driven.error
    assert "boom" in driven.error.message
    check_clean(driven, logged)


def test_kiso_p_against_an_openai_compatible_server_prints_no_asyncio_noise(
    tmp_path: Path,
) -> None:
    home, workspace = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    workspace.mkdir()
    script = [chat_stream(until_close=False), chat_stream(until_close=True)]
    with SSEServer(script) as server:
        profile = {
            "kind": "openai-compat",
            "model": "local-model",
            "baseUrl": server.url + "/v1",
            "apiKeyEnv": "KISO_TEST_LOCAL_KEY",
        }
        config = {"model": "local", "models": {"local": profile}}
        (home / "config.json").write_text(json.dumps(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
        env.update(KISO_HOME=str(home), KISO_TEST_LOCAL_KEY="sk-local", PYTHONASYNCIODEBUG="1")
        env.pop("KISO_MODEL", None)
        runs = [
            subprocess.run(
                [str(BIN), "-p", "hi"],
                cwd=workspace,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            for _ in script
        ]
    for out in runs:
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "Hello"
        assert "Task was destroyed" not in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
        assert "was never awaited" not in out.stderr, out.stderr
    assert [r.credential for r in server.requests] == ["sk-local", "sk-local"]
