"""Work the server starts and does not wait for at once: :class:`Background`.

A task started with :func:`asyncio.ensure_future` and dropped can be collected while it runs, and
its failure is printed as "Task exception was never retrieved". A :class:`Background` keeps its
tasks until they end, logs what fails, and at shutdown awaits (or cancels) what is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["Background"]

log = logging.getLogger("kyronix.server")


class Background:
    def __init__(self, what: str = "background work") -> None:
        self.what = what
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` on the running loop; a failure is logged, never lost."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def in_thread(self, fn: Callable[[], object]) -> None:
        """Run a blocking function in a worker thread (best effort: a failure is logged)."""
        self.spawn(asyncio.to_thread(fn))

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.warning("%s failed (%s: %s)", self.what, type(exc).__name__, exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self, *, cancel: bool = False) -> None:
        """Wait for what is left (cancelled first, with ``cancel``)."""
        tasks = list(self._tasks)
        if cancel:
            for task in tasks:
                task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
