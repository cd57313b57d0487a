"""What a run has produced so far (:class:`RunHandle`), and the runs this process holds
(:class:`LiveRuns`).

An HTTP request or an SSE stream only *watches* a handle: the run itself is a task of its own,
so a client that goes away cancels nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from kyronix.server.errors import error_body

__all__ = ["RECENT_S", "RETRIED", "TAKEN_OVER", "LiveRuns", "RunHandle", "RunRequest"]

RECENT_S = 600.0
"""How long a finished run's handle stays in memory for SSE reconnects (then the DB serves)."""
RETRIED = (
    "the answer did not fit the agent's tools; the model was asked again: discard the text so far"
)
TAKEN_OVER = (
    "the server running this run stopped; another resumed it from its session log: discard the "
    "text so far (what follows is the run's text again, from its start)"
)


@dataclass(frozen=True)
class RunRequest:
    project_id: str
    agent: str
    input: str
    session_id: str | None = None
    custom_agent_id: str | None = None
    idem_key: str | None = None
    request_hash: str | None = None
    execute: str | None = None
    """``"tunnel"``: the server runs the tools over the tunnel (the server-driven loop)."""
    key_id: str | None = None
    """The API key that started it (None: the dashboard): its plan's results are recorded only
    from a runtime holding the same key."""


class RunHandle:
    """What a run has produced so far: the text of each model attempt, then its result."""

    def __init__(self, run_id: str, session_id: str, project_id: str) -> None:
        self.id = run_id
        self.session_id = session_id
        self.project_id = project_id
        self.texts: list[str] = [""]
        self.reasons: dict[int, str] = {}
        """Why each attempt after the first began (the stream's ``attempt`` event says it)."""
        self.writer: Any = None
        """The new kiso session's writer, when it was created with the admission."""
        self.status: int | None = None
        self.body: dict[str, Any] | None = None
        self.finished_at: float | None = None
        self._changed: asyncio.Event | None = None  # made when someone watches
        self._done = asyncio.Event()

    @classmethod
    def from_row(cls, row: Any) -> RunHandle:
        """The handle of a finished run, from its row."""
        texts = json.loads(row.transcript) if row.transcript else []
        body = json.loads(row.result) if row.result else error_body("internal_error", "no result")
        handle = cls(row.id, row.session_id, row.project_id)
        handle.texts = texts or [""]
        if row.mode == "tunnel":  # a server-driven run asks once: a second attempt is a takeover
            handle.reasons = {i: TAKEN_OVER for i in range(1, len(handle.texts))}
        handle.status, handle.body = row.http_status or 500, body
        handle.finished_at = time.monotonic()
        handle._done.set()
        return handle

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def add_text(self, text: str) -> None:
        self.texts[-1] += text
        self._wake()

    def new_attempt(self, reason: str = RETRIED) -> None:
        self.texts.append("")
        self.reasons[len(self.texts) - 1] = reason
        self._wake()

    def reason(self, attempt: int) -> str:
        return self.reasons.get(attempt, RETRIED)

    def finish(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.body = status, body
        self.finished_at = time.monotonic()
        self._done.set()
        self._wake()

    def mirror(self, other: RunHandle) -> None:
        """Show ``other``'s texts as this handle's (the same run, followed from elsewhere)."""
        self.texts, self.reasons = other.texts, other.reasons
        self._wake()

    def changed(self) -> asyncio.Event:
        """The event the next change sets (take it before reading, to miss nothing)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _wake(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def wait_change(self) -> None:
        if not self.done:
            await self.changed().wait()

    async def wait_done(self) -> None:
        await self._done.wait()


class LiveRuns:
    """The runs this process is running (their handles and tasks), and the handles of runs that
    finished here in the last :data:`RECENT_S` seconds."""

    def __init__(self) -> None:
        self.handles: dict[str, RunHandle] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def launch(self, handle: RunHandle, run: Coroutine[Any, Any, None]) -> None:
        self.handles[handle.id] = handle
        task = asyncio.get_running_loop().create_task(run, name=f"kyronix-run-{handle.id}")
        self.tasks[handle.id] = task
        run_id = handle.id

        def forget(_task: asyncio.Task[None]) -> None:
            self.tasks.pop(run_id, None)

        task.add_done_callback(forget)

    def get(self, run_id: str) -> RunHandle | None:
        return self.handles.get(run_id)

    def running_ids(self) -> set[str]:
        return {rid for rid, h in self.handles.items() if not h.done}

    @property
    def running(self) -> int:
        return len(self.tasks)

    def forget_old(self, now: float | None = None) -> None:
        at = time.monotonic() if now is None else now
        for rid, h in list(self.handles.items()):
            if h.finished_at is not None and at - h.finished_at > RECENT_S:
                del self.handles[rid]

    async def drain(self, timeout: float) -> int:
        """Let the running runs finish for up to ``timeout`` seconds; cancel the rest (their
        runs record themselves interrupted). Returns how many were cancelled."""
        if not self.tasks:
            return 0
        _, pending = await asyncio.wait(list(self.tasks.values()), timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)
