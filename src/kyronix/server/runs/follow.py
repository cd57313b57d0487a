"""Following a run another replica runs: a handle that ends when the run's row does.

A stream (or a keyed retry) may reach any replica; when the run is not this one's, the replica
watches the run's row until it finishes and answers with what the row holds. When this replica
takes the run over meanwhile, the handle follows this replica's own run instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kyronix.server.db import Database
from kyronix.server.errors import error_body
from kyronix.server.runs import records
from kyronix.server.runs.handle import LiveRuns, RunHandle
from kyronix.server.tasks import Background

__all__ = ["POLL_S", "Follower"]

POLL_S = 0.25
"""How often a followed run's row is read."""


class Follower:
    def __init__(self, db: Database, live: LiveRuns) -> None:
        self.db = db
        self.live = live
        self._watching: dict[str, RunHandle] = {}
        self._tasks = Background("following a run")

    def watch(self, row: Any) -> RunHandle:
        """A handle for a run another replica runs (one per run, however many watch it)."""
        handle = self._watching.get(row.id)
        if handle is not None:
            return handle
        handle = self._watching[row.id] = RunHandle(row.id, row.session_id, row.project_id)

        async def follow() -> None:
            try:
                await self._follow(handle, row, ours_later=True)
            finally:
                self._watching.pop(row.id, None)

        self._tasks.spawn(follow())
        return handle

    async def answer_from_row(self, handle: RunHandle) -> None:
        """Finish ``handle`` with what the run's row says, once it says it (a run this replica
        lost to another: the other one finishes it)."""
        row = await asyncio.to_thread(self.db.read, lambda c: records.get(c, handle.id))
        if row is None:
            handle.finish(500, error_body("internal_error", "the run is gone"))
            return
        self._tasks.spawn(self._follow(handle, row, ours_later=False))

    async def _follow(self, handle: RunHandle, row: Any, *, ours_later: bool) -> None:
        while True:
            live = self.live.get(row.id) if ours_later else None
            if live is not None:  # taken over by this replica
                handle.mirror(live)
                while not live.done:
                    await live.wait_change()
                    handle.mirror(live)
                assert live.status is not None and live.body is not None
                handle.finish(live.status, live.body)
                return
            now = await asyncio.to_thread(self.db.read, lambda c: records.get(c, row.id))
            if now is None or now.status != "running":
                if now is None:
                    handle.finish(500, error_body("internal_error", "the run is gone"))
                    return
                done = RunHandle.from_row(now)
                handle.mirror(done)
                assert done.status is not None and done.body is not None
                handle.finish(done.status, done.body)
                return
            await asyncio.sleep(POLL_S)

    async def close(self) -> None:
        await self._tasks.close(cancel=True)
