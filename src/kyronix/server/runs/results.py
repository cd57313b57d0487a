"""An executer's answer to a plan, recorded in the session whose run issued the plan.

A plan's tools carry execution ids the server gave them (:func:`kyronix.server.agents.finalize`);
when their ``kml_result`` comes back over the tunnel, its entries go into that session's log
(``setting_changed`` ``kyronix.results``), so the session's next input tells the model what
actually happened. Which session issued an id is remembered in memory for the ids this process
issued, and in ``kx_executions`` for every id (a plan of an earlier process, or of another
replica).

Recording is best effort: the executer's receipts keep the truth either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

from kiso.kernel import SessionLockedError
from kyronix.server.db import Database
from kyronix.server.runs import records
from kyronix.server.runs.pool import SessionPool

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster

__all__ = ["ISSUED_KEPT", "ResultsRecorder"]

log = logging.getLogger("kyronix.server")

ISSUED_KEPT = 100_000
"""Plan tool ids kept in memory to record their results without a look-up."""


class ResultsRecorder:
    def __init__(self, db: Database, pool: SessionPool, *, cluster: Cluster | None = None) -> None:
        self.db = db
        self.pool = pool
        self.cluster = cluster
        self._issued: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Plan tool ids this process issued -> (project, session): where their results go."""
        self._background: set[asyncio.Task[Any]] = set()
        if cluster is not None:
            cluster.on("record", self._forwarded)

    def remember(self, project_id: str, session_id: str, execution_ids: Sequence[str]) -> None:
        """The session's run issued these tool ids (its plan was answered)."""
        for eid in execution_ids:
            self._issued[eid] = (project_id, session_id)
        while len(self._issued) > ISSUED_KEPT:
            self._issued.popitem(last=False)

    async def record(self, project_id: str, request_id: str, results: Sequence[Any]) -> None:
        """The relay's hook: a ``kml_result`` of the project came back. Its entries are recorded
        in the session that issued their tool ids (looked up off the round trip when this
        process did not issue them)."""
        ids = [
            e["result"].get("executionId")
            for e in results
            if isinstance(e, dict) and isinstance(e.get("result"), dict)
        ]
        first = next((i for i in ids if isinstance(i, str)), None)
        if first is None:
            return
        value = {"requestId": request_id, "results": list(results)}
        issued = self._issued.get(first)
        if issued is not None and issued[0] == project_id:
            await self._deliver(issued[1], value)
            return
        self._spawn(self._look_up(project_id, first, value))

    async def _look_up(self, project_id: str, execution_id: str, value: dict[str, Any]) -> None:
        try:
            target = await asyncio.to_thread(
                self.db.read, lambda c: records.session_of_execution(c, execution_id, project_id)
            )
        except Exception:
            log.warning("could not look up the session of request %s", value.get("requestId"))
            return
        if target is not None:  # None: not a plan of this server's
            await self._deliver(target, value)

    async def _deliver(
        self, target: str, value: dict[str, Any], *, forwarded: bool = False
    ) -> None:
        try:
            await self.pool.deliver(target, value)
        except SessionLockedError:
            # another replica has the session open (running it, or idle between its runs): it
            # records them, as this one would
            holder = None if forwarded else await asyncio.to_thread(self.pool.holder_of, target)
            if holder is not None and self.cluster is not None:
                await self.cluster.send(holder, "record", {"session": target, "value": value})
                return
            log.warning("could not record request %s in session %s: it is in use elsewhere",
                        value.get("requestId"), target)  # fmt: skip
        except Exception:
            log.warning("could not record request %s in session %s", value.get("requestId"), target)

    async def _forwarded(self, body: dict[str, Any]) -> None:
        await self._deliver(str(body["session"]), body["value"], forwarded=True)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
