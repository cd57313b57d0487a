"""The kiso sessions of Kyronix sessions, kept open between their runs.

A run takes its session's kiso session from the pool (:meth:`SessionPool.acquire`) and gives it
back when it is done (:meth:`SessionPool.done_with`): between runs the writer stays open (lease
held, log loaded), so the next run needs no open, no load and no lease transaction. Up to
:data:`OPEN_SESSIONS` stay open, each for at most :data:`IDLE_S` idle seconds.

Tool results the tunnel brings back are delivered into their session here
(:meth:`SessionPool.deliver`): staged in the session kept open, held until the run using the
session is done, or appended to the closed log. With several replicas, a session another replica
keeps open is asked for through the cluster mailbox (``release``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kiso.kernel import (
    SessionLockedError,
    SessionNotFoundError,
    SessionStore,
    SessionWriter,
    SettingChanged,
)
from kiso.runtime import Agent, Session
from kyronix.server.agents import Persona
from kyronix.server.sessions import RESULTS_KEY

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster

__all__ = ["IDLE_S", "OPEN_SESSIONS", "RELEASE_WAIT_S", "SessionKey", "SessionPool"]

log = logging.getLogger("kyronix.server")
T = TypeVar("T")

OPEN_SESSIONS = 256
"""How many idle kiso sessions stay open (their writer lease held) for their next run."""
IDLE_S = 300.0
"""How long an idle kiso session stays open before the sweep closes it."""
RELEASE_WAIT_S = 10.0
"""How long a run waits for another replica to let go of the session it keeps open."""
SessionKey = tuple[Persona, str | None]
"""What an open kiso session was opened for: its persona and its mode."""


class SessionPool:
    def __init__(
        self, store: SessionStore, workspace: Path, *, cluster: Cluster | None = None
    ) -> None:
        self.store = store
        self.workspace = workspace
        self.cluster = cluster
        self._scoped = "project" in inspect.signature(store.create).parameters
        self._idle: OrderedDict[str, tuple[SessionKey, Session, float]] = OrderedDict()
        """Open kiso sessions between their runs, least recently used first."""
        self._idle_lock = threading.Lock()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        """One asyncio lock a session: a run taking it and a delivery of results take turns."""
        self._busy: set[str] = set()
        """Sessions a run is using now."""
        self._waiting: dict[str, list[dict[str, Any]]] = {}
        """Results that came back while the session's run was going: staged before its next."""
        if cluster is not None:
            cluster.on("release", self._released)

    # -- a run's session -------------------------------------------------------------------

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def acquire(
        self, agent: Agent, session_id: str, project_id: str, key: SessionKey, writer: Any = None
    ) -> Session:
        """The run's kiso session: on ``writer`` (created with the admission), the one left open
        by the session's last run (same persona and mode), or opened from the store. Results
        that came back while the session was busy are staged in it first."""
        async with self._lock(session_id):
            session = await self._take(agent, session_id, project_id, key, writer)
            self._busy.add(session_id)
            waiting = self._waiting.pop(session_id, [])
        for value in waiting:
            session.stage(SettingChanged(key=RESULTS_KEY, value=value))
        return session

    async def _take(
        self, agent: Agent, session_id: str, project_id: str, key: SessionKey, writer: Any
    ) -> Session:
        if writer is not None:
            return Session(agent, writer, headless=True)
        stale: Session | None = None
        with self._idle_lock:
            entry = self._idle.pop(session_id, None)
        if entry is not None:
            if entry[0] == key:
                return entry[1]
            stale = entry[1]  # the custom agent (or the mode) changed: open again
        if stale is not None:
            await asyncio.to_thread(stale.close)
        try:
            return await asyncio.to_thread(self._open, agent, session_id, project_id, key[0])
        except SessionLockedError:
            holder = await asyncio.to_thread(self.holder_of, session_id)
            if holder is None or self.cluster is None:
                raise
        # another replica keeps it open between its runs: ask it to let go, then open it
        await self.cluster.send(holder, "release", {"session": session_id})
        deadline = time.monotonic() + RELEASE_WAIT_S
        while True:
            await asyncio.sleep(0.02)
            try:
                return await asyncio.to_thread(self._open, agent, session_id, project_id, key[0])
            except SessionLockedError:
                if time.monotonic() > deadline:
                    raise

    def _open(self, agent: Agent, session_id: str, project_id: str, persona: Persona) -> Session:
        """Open the kiso session for writing (created, scoped to its project, on its first
        run)."""
        prompt: str | None = persona.instructions  # recorded if it changed (a custom agent edited)
        try:
            writer = self.store.open(session_id)
        except SessionNotFoundError:
            scope = {"project": project_id} if self._scoped else {}
            writer = self.store.create(str(agent.workspace), session_id=session_id, **scope)
            prompt = None  # new: the agent's prompt is recorded with the first model request
        try:
            return Session(agent, writer, headless=True, system_prompt=prompt)
        except BaseException:
            writer.close()
            raise

    async def done_with(
        self, session_id: str, key: SessionKey, session: Session, *, keep: bool
    ) -> None:
        """The run is done with its session: results that came in meanwhile are recorded, then
        the session is kept open for its next run (or closed if the run failed)."""
        async with self._lock(session_id):
            self._busy.discard(session_id)
            waiting = self._waiting.pop(session_id, [])
            if keep and not session.writer.closed:
                try:
                    if waiting:
                        session.stage(*(SettingChanged(key=RESULTS_KEY, value=v) for v in waiting))
                        await session.committed()
                except Exception:
                    log.warning("could not record tunnel results in session %s", session_id)
                    await asyncio.to_thread(close_all, [session])
                    return
                await self._keep(session_id, key, session)
                return
            await asyncio.to_thread(close_all, [session])
            for value in waiting:
                try:
                    await asyncio.to_thread(self._append_closed, session_id, value)
                except Exception:
                    log.warning("could not record tunnel results in session %s", session_id)

    async def _keep(self, session_id: str, key: SessionKey, session: Session) -> None:
        """Keep the session open for its next run; close the least recently used past the cap."""
        with self._idle_lock:
            self._idle[session_id] = (key, session, time.monotonic())
            over = [
                self._idle.popitem(last=False)[1][1] for _ in range(len(self._idle) - OPEN_SESSIONS)
            ]
        if over:
            await asyncio.to_thread(close_all, over)

    # -- results ---------------------------------------------------------------------------

    async def deliver(self, session_id: str, value: dict[str, Any]) -> None:
        """Record an executer's results in the session: held for the run using it, staged in the
        session kept open, or appended to its closed log. Raises
        :class:`~kiso.kernel.SessionLockedError` when another process holds the session."""
        async with self._lock(session_id):
            if session_id in self._busy:
                self._waiting.setdefault(session_id, []).append(value)
                return
            with self._idle_lock:
                entry = self._idle.get(session_id)
            if entry is not None:
                entry[1].stage(SettingChanged(key=RESULTS_KEY, value=value))
                await entry[1].committed()
                return
            await asyncio.to_thread(self._append_closed, session_id, value)

    def _append_closed(self, session_id: str, value: dict[str, Any]) -> None:
        self.write_closed(
            session_id, lambda w: w.append(SettingChanged(key=RESULTS_KEY, value=value))
        )

    def write_closed(self, session_id: str, fn: Callable[[SessionWriter], T]) -> T:
        """``fn(writer)`` on the session's log, opened for it (closed in this process first if
        it was kept open here) and closed after. Raises
        :class:`~kiso.kernel.SessionNotFoundError` and :class:`~kiso.kernel.SessionLockedError`."""
        self.evict(session_id)
        writer = self.store.open(session_id)
        try:
            return fn(writer)
        finally:
            writer.close()

    # -- letting go ------------------------------------------------------------------------

    def holder_of(self, session_id: str) -> str | None:
        """The replica holding the session's writer lease, if another than this one."""
        if self.cluster is None:
            return None
        return self.cluster.lease_holder(session_id)

    def evict(self, session_id: str) -> None:
        """Close the session if it is idle in this process (before someone else writes it)."""
        with self._idle_lock:
            entry = self._idle.pop(session_id, None)
        if entry is not None:
            entry[1].close()

    async def _released(self, body: dict[str, Any]) -> None:
        """Another replica needs a session this one keeps open between runs: let it go."""
        await asyncio.to_thread(self.evict, str(body["session"]))

    def close_idle(self, older_than: float = 0.0) -> int:
        """Close the idle sessions unused for ``older_than`` seconds (all of them by default)."""
        cutoff = time.monotonic() - older_than
        with self._idle_lock:
            old = [sid for sid, (_, _, used) in self._idle.items() if used <= cutoff]
            closing = [self._idle.pop(sid)[1] for sid in old]
        close_all(closing)
        return len(closing)


def close_all(sessions_: list[Session]) -> None:
    for session in sessions_:
        try:
            session.close()
        except Exception:  # its lease goes stale with this process; the log is intact
            log.warning("could not close kiso session %s", session.id)
