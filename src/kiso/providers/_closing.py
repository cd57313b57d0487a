"""Finish, before a stream is over, the closing of async generators an SDK left suspended.

Why. The SDKs stop reading a stream by ``break``-ing out of an ``async for`` over their own async
generators (openai's ``AsyncStream.__stream__`` breaks on ``data: [DONE]``, leaving
``_iter_events`` -> ``SSEDecoder.aiter_bytes`` -> ``Response.aiter_bytes`` -> the pool's byte
stream suspended), and an adapter that stops at the provider's own end event (``message_stop``,
``response.completed``) leaves the SDK's iterator suspended too. Nothing closes such a generator
but the garbage collector, and asyncio closes one by scheduling ``agen.aclose()`` as a *task* on
the loop (its async-generator finalizer hook); each level's close drops the next one down, so a
chain unwinds over several turns of the loop. A loop that is closed before then
(``Session.run_sync`` runs a fresh loop per call and closes it when the run ends) leaves those
tasks pending, and Python prints ``Task was destroyed but it is pending!`` for each.

What. Each adapter's ``stream()``:

1. reads the SDK's stream through :func:`sdk_items`, closed explicitly (``aclosing``), which
   closes the SDK's own reader generator too (it sits in a reference cycle with its stream);
2. on failure, maps the SDK's exception after :func:`released` has dropped the locals of the
   frames its traceback holds (the lines stay; the SDK objects they referenced do not);
3. then awaits :func:`finish_closing`, which lets the loop turn until no generator-close task is
   left, awaiting each (bounded: ``rounds`` turns, ``timeout`` seconds; none of them does I/O,
   the response is already closed),

so every task a stream causes is awaited before its last event, on the loop that ran it.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

_E = TypeVar("_E", bound=BaseException)

__all__ = ["finish_closing", "released", "sdk_items"]


async def sdk_items(opening: Callable[[], Awaitable[Any]]) -> AsyncGenerator[Any, None]:
    """The items of the SDK stream ``opening()`` opens; closing this closes that stream whole.

    The SDK's stream keeps its reader in ``_iterator``, an async generator whose frame holds the
    stream: a reference cycle, so a reader left suspended (the adapter stopped at the end event)
    would wait for the cyclic garbage collector, which runs whenever, on whatever loop. It is
    read with ``__anext__`` (no wrapper generator to abandon) and closed here, explicitly.
    """
    stream = await opening()
    try:
        while True:
            try:
                item = await stream.__anext__()
            except StopAsyncIteration:
                return
            yield item
    finally:
        try:
            reader = getattr(stream, "_iterator", None)
            if reader is not None and hasattr(reader, "aclose"):
                await reader.aclose()
        finally:
            await stream.close()


def released(exc: _E) -> _E:
    """``exc``, the locals of its traceback's frames (and its causes' and contexts') dropped."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)  # executing frames are left alone
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return exc


def _is_generator_close(task: asyncio.Task[Any]) -> bool:
    """A task asyncio's finalizer hook made: its coroutine is ``agen.aclose()``."""
    return type(task.get_coro()).__name__ == "async_generator_athrow"


async def finish_closing(*, rounds: int = 64, timeout: float = 2.0) -> None:
    """Await the close of every async generator left suspended on this loop (see the module).

    Done when two turns of the loop in a row find no close task: a finalizer hook's
    ``call_soon`` may land just after this task's own wake-up, so one empty turn proves nothing.
    """
    me = asyncio.current_task()
    deadline = time.monotonic() + timeout
    quiet = 0
    for _ in range(rounds):
        await asyncio.sleep(0)
        closing = [
            task
            for task in asyncio.all_tasks()
            if task is not me and not task.done() and _is_generator_close(task)
        ]
        if not closing:
            quiet += 1
            if quiet == 2:
                return
            continue
        quiet = 0
        left = deadline - time.monotonic()
        if left <= 0:
            return
        await asyncio.wait(closing, timeout=left)
