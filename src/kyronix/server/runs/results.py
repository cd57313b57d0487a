"""An executer's answer to a plan, recorded in the session whose run issued the plan.

A plan's tools carry execution ids the server gave them (:func:`kyronix.server.agents.finalize`);
when their ``kml_result`` comes back over the tunnel, its entries go into that session's log
(``setting_changed`` ``kyronix.results``), so the session's next input tells the model what
actually happened. Which session issued an id is remembered in memory for the ids this process
issued, and in ``kx_executions`` for every id (a plan of an earlier process, or of another
replica). The ids are signed with the server's key (:func:`~kyronix.server.agents.issued_by`):
a result whose ids no plan of this server gave (a client's own KML) is told apart without a
look-up, and is on its way to its client at once.

Recording is best effort: the executer's receipts keep the truth either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kiso.kernel import SessionLockedError
from kyronix.server.agents import issued_by
from kyronix.server.db import Database
from kyronix.server.runs import records
from kyronix.server.runs.pool import SessionPool

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster

__all__ = ["ISSUED_KEPT", "ResultsRecorder"]

log = logging.getLogger("kyronix.server")

ISSUED_KEPT = 100_000
"""Plan tool ids kept in memory to record their results without a look-up."""
RECORDED_CHARS = 64 * 1024
"""How much of one tool's output (and error) is recorded in its session (the rest is cut, and
the entry says ``truncated``; the executer's receipt keeps it whole)."""
RECORDED_BYTES = 3 * RECORDED_CHARS
"""The most one entry may take in the session (as JSON) with its arguments and data."""
_KEPT = ("success", "output", "executionId", "ms", "error", "errorType", "uncertain", "running")


def _execution_id(entry: Any) -> str | None:
    result = entry.get("result") if isinstance(entry, dict) else None
    eid = result.get("executionId") if isinstance(result, dict) else None
    return eid if isinstance(eid, str) else None


def _capped(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry as recorded: its output and error cut to :data:`RECORDED_CHARS`; and when the
    rest of it (the arguments, the structured ``data``) is still over :data:`RECORDED_BYTES`,
    those are dropped too (``truncated``): the receipt keeps them."""
    result = dict(entry["result"])
    cut = False
    for name in ("output", "error"):
        text = result.get(name)
        if isinstance(text, str) and len(text) > RECORDED_CHARS:
            result[name] = text[:RECORDED_CHARS]
            cut = True
    capped = {**entry, "result": result}
    if len(json.dumps(capped, default=str)) > RECORDED_BYTES:
        result.pop("data", None)
        capped = {"tool": str(entry.get("tool", ""))[:200], "args": {}, "result": result}
        if len(json.dumps(capped, default=str)) > RECORDED_BYTES:  # other fields, made up
            result = {k: result[k] for k in _KEPT if k in result}
            capped["result"] = result
        cut = True
    if not cut:
        return entry
    result["truncated"] = True
    return capped


def _same_key(issuer: str | None, asker: str | None) -> bool:
    """May results asked for by the key ``asker`` go where the key ``issuer`` ran the plan? A
    plan issued before keys were recorded (or by the dashboard: no key) takes any of the
    project's."""
    return issuer is None or issuer == asker


class ResultsRecorder:
    def __init__(
        self,
        db: Database,
        pool: SessionPool,
        *,
        id_key: bytes = b"",
        cluster: Cluster | None = None,
    ) -> None:
        self.db = db
        self.pool = pool
        self.id_key = id_key
        """What signs the plans' tool ids: an id it did not sign is no plan's (no look-up)."""
        self.cluster = cluster
        self._issued: OrderedDict[str, tuple[str, str, str | None]] = OrderedDict()
        """Plan tool ids this process issued -> (project, session, the API key that ran the
        plan): where their results go, and from whom."""
        self._recorded: OrderedDict[str, None] = OrderedDict()
        """Tool ids whose result was recorded (a result comes into its session once)."""
        if cluster is not None:
            cluster.on("record", self._forwarded)

    def remember(
        self,
        project_id: str,
        session_id: str,
        execution_ids: Sequence[str],
        key_id: str | None = None,
    ) -> None:
        """The session's run (of the API key ``key_id``) issued these tool ids (its plan was
        answered)."""
        for eid in execution_ids:
            self._issued[eid] = (project_id, session_id, key_id)
        while len(self._issued) > ISSUED_KEPT:
            self._issued.popitem(last=False)

    async def record(
        self,
        project_id: str,
        request_id: str,
        results: Sequence[Any],
        session_id: str | None = None,
        key_id: str | None = None,
    ) -> None:
        """The relay's hook: a ``kml_result`` of the project answered a request it sent, for a
        runtime holding the API key ``key_id``. Each entry goes to the session that issued its
        tool id, once, and only when that session's plan was run with the same key (an entry
        whose id no session of the project issued, issued to another key, or recorded already,
        goes nowhere; with ``session_id``, the session the client named, only its own entries
        go anywhere); ids this server signed that this process did not issue are looked up in
        ``kx_executions`` (one indexed query). Recorded before the runtime client gets the
        result: a client that reads the session then finds it."""
        known: dict[str, list[Any]] = {}
        unknown: list[tuple[str, Any]] = []
        for entry in results:
            eid = _execution_id(entry)
            if eid is None or eid in self._recorded:
                continue
            issued = self._issued.get(eid)
            if issued is None:
                if issued_by(eid, self.id_key):  # a plan of this server's: where, and whose?
                    unknown.append((eid, entry))
            elif issued[0] == project_id and _same_key(issued[2], key_id):
                known.setdefault(issued[1], []).append(entry)
        if unknown:
            found_by = await self._look_up(project_id, request_id, key_id, unknown)
            for found, entries in found_by.items():
                known.setdefault(found, []).extend(entries)
        for target, entries in known.items():
            if session_id is None or target == session_id:
                await self._deliver_entries(target, request_id, entries)

    async def _look_up(
        self, project_id: str, request_id: str, key_id: str | None, entries: list[tuple[str, Any]]
    ) -> dict[str, list[Any]]:
        """The entries by the session that issued them (of this project, to the key ``key_id``;
        others: nowhere)."""
        ids = [eid for eid, _ in entries]
        try:
            owners = await asyncio.to_thread(
                self.db.read, lambda c: records.sessions_of_executions(c, ids, project_id)
            )
        except Exception:
            log.warning("could not look up the sessions of request %s", request_id)
            return {}
        by_session: dict[str, list[Any]] = {}
        for eid, entry in entries:
            owner = owners.get(eid)
            if owner is not None and _same_key(owner[1], key_id):  # else: not for this key
                by_session.setdefault(owner[0], []).append(entry)
        return by_session

    async def _deliver_entries(self, session_id: str, request_id: str, entries: list[Any]) -> None:
        for entry in entries:
            eid = _execution_id(entry)
            if eid is not None:
                self._recorded[eid] = None
        while len(self._recorded) > ISSUED_KEPT:
            self._recorded.popitem(last=False)
        await self._deliver(
            session_id, {"requestId": request_id, "results": [_capped(e) for e in entries]}
        )

    async def _deliver(
        self, target: str, value: dict[str, Any], *, forwarded: bool = False
    ) -> None:
        try:
            await self.pool.deliver(target, value)
        except SessionLockedError:
            # another replica has the session open (running it, or idle between its runs): it
            # records them, as this one would
            holder = (
                None
                if forwarded or self.cluster is None
                else await asyncio.to_thread(self.cluster.lease_holder, target)
            )
            if holder is not None and self.cluster is not None:
                await self.cluster.send(holder, "record", {"session": target, "value": value})
                return
            log.warning("could not record request %s in session %s: it is in use elsewhere",
                        value.get("requestId"), target)  # fmt: skip
        except Exception:
            log.warning("could not record request %s in session %s", value.get("requestId"), target)

    async def _forwarded(self, body: dict[str, Any]) -> None:
        await self._deliver(str(body["session"]), body["value"], forwarded=True)
