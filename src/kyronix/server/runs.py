"""Runs: admitted in one transaction, executed outside any request, settled with their answer.

A run is a Kyronix agent turn: the request's input goes into a **kiso session** (the Kyronix
session's id is the kiso session's id) and the session's run produces the model's KML. The
HTTP request, or the SSE stream, only watches a :class:`RunHandle`: a client that disconnects
neither cancels the run nor loses its charge record.

1. **Admit** (one write transaction): the idempotency key, the session (created when the
   request names none; ``session_busy`` if it has an active run: enforced by a conditional
   update of ``kx_sessions.active_run``), the persona, the credit hold (``insufficient_credits``
   before anything is called), the ``kx_runs`` row and, for a new session on the SQL store, the
   kiso log's header and writer lease (``SqlSessionStore.create(connection=...)``).
2. **Execute** (no transaction open): the kiso session runs on the persona's model; its text
   streams to the handle; the answer is parsed and checked against the persona's tools, and a
   bad answer is sent back to the model once (a second kiso run whose input is the problems,
   ``source: system``). The outcome is recorded in the session log as a ``setting_changed``
   ``kyronix.result`` (the final envelope with its execution ids): ``chat`` is a projection
   of the log.
3. **Settle**: the charge and the release of the hold, the run row, the session freed — in the
   transaction of the batch that records the result (``SqlWriter.attach``), so the answer and
   its charge are durable together or not at all; in a transaction of its own otherwise (a JSONL
   session store, a failed run, which releases its hold and is charged nothing).

Between its runs a session's kiso writer stays open (lease held, log loaded) for the next run:
up to :data:`OPEN_SESSIONS`, closed after :data:`IDLE_S` idle seconds or at shutdown
(docs/adr/0017-a-run-in-two-transactions.md).

A run cut short by shutdown, or found ``running`` at start (the server was killed), is
**interrupted**: its open kiso run is ended (``error``, code ``interrupted``), the outcome is
recorded in the session log, its hold is released and its idempotency key freed (the client
never got an answer, so a retry runs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import json
import logging
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, select, update

from kiso.kernel import (
    Assistant,
    Event,
    ModelRef,
    Outcome,
    RunEnded,
    RunStarted,
    SessionLockedError,
    SessionNotFoundError,
    SessionStore,
    SettingChanged,
    TextBlock,
    Usage,
    User,
    new_id,
    replay,
)
from kiso.kernel.sql import SqlSessionStore, SqlWriter
from kiso.providers.registry import cost as provider_cost
from kiso.runtime import Agent, Compaction, ModelTurn, Session, Terminal, TextDelta
from kiso.runtime.rules import RulesFile
from kyronix import kml
from kyronix.errors import KmlError
from kyronix.server import billing
from kyronix.server.agents import (
    RESULTS_HEADER,
    Persona,
    asked_text,
    builtin_persona,
    check_plan,
    custom_persona,
    finalize,
)
from kyronix.server.config import MILLI, ServerConfig, to_credits
from kyronix.server.db import (
    Database,
    custom_agents,
    executions,
    now_ms,
    replicas,
    runs,
    sessions,
)
from kyronix.server.driven import TunnelAgent, results_of_run, tunnel_tools
from kyronix.server.errors import ApiError, error_body, not_found

if TYPE_CHECKING:
    from kyronix.server.cluster import Cluster
    from kyronix.server.models import ModelChoice
    from kyronix.server.tunnel import Relay

__all__ = ["RESULTS_KEY", "RESULT_KEY", "RunHandle", "RunManager", "RunRequest", "chat_of"]

log = logging.getLogger("kyronix.server")

RESULT_KEY = "kyronix.result"
"""The ``setting_changed`` key that records a Kyronix run's outcome in its kiso session."""
RESULTS_KEY = "kyronix.results"
"""The ``setting_changed`` key that records what an executer answered for the session's plan
(``{"requestId", "results"}``): shown to the model with the session's next input."""
TUNNEL_TURNS = 20
ISSUED_KEPT = 100_000
"""Plan tool ids kept in memory to record their results without a lookup."""
"""Model turns a server-driven run may take."""
SessionKey = tuple[Persona, str | None]
"""What an open kiso session was opened for: its persona and its mode."""
RECENT_S = 600.0
"""How long a finished run's handle stays in memory for SSE reconnects (then the DB serves)."""
OPEN_SESSIONS = 256
"""How many idle kiso sessions stay open (their writer lease held) for their next run."""
IDLE_S = 300.0
"""How long an idle kiso session stays open before the sweep closes it."""
RELEASE_WAIT_S = 10.0
"""How long a run waits for another replica to let go of the session it keeps open."""
RETRIED = (
    "the answer did not fit the agent's tools; the model was asked again: discard the text so far"
)
TAKEN_OVER = (
    "the server running this run stopped; another resumed it from its session log: discard the "
    "text so far (what follows is the run's text again, from its start)"
)

# Built once: the statements on every run's path (reused with parameters, SQLAlchemy skips
# building them and their cache keys again).
_IDEM = select(runs).where(
    (runs.c.project_id == bindparam("b_project")) & (runs.c.idem_key == bindparam("b_key"))
)
_SESSION = select(sessions).where(
    (sessions.c.id == bindparam("b_session")) & (sessions.c.project_id == bindparam("b_project"))
)
_NEW_SESSION = sessions.insert()
_CLAIM = (
    update(sessions)
    .where((sessions.c.id == bindparam("b_session")) & sessions.c.active_run.is_(None))
    .values(active_run=bindparam("b_run"))
)
_FREE = (
    update(sessions)
    .where(
        (sessions.c.id == bindparam("b_session")) & (sessions.c.active_run == bindparam("b_run"))
    )
    .values(active_run=None)
)
_NEW_RUN = runs.insert()
_NEW_EXECUTION = executions.insert()
_EXECUTION = select(executions.c.session_id).where(
    (executions.c.id == bindparam("b_id")) & (executions.c.project_id == bindparam("b_project"))
)
_FINISH = (
    update(runs)
    .where(runs.c.id == bindparam("b_run"))
    .values(
        status=bindparam("b_status"),
        finished_at=bindparam("b_at"),
        http_status=bindparam("b_http"),
        result=bindparam("b_result"),
        transcript=bindparam("b_transcript"),
        cost=bindparam("b_cost"),
        usage_input=bindparam("b_in"),
        usage_output=bindparam("b_out"),
    )
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
    def finished(cls, row: Any, texts: list[str], status: int, body: dict[str, Any]) -> RunHandle:
        handle = cls(row.id, row.session_id, row.project_id)
        handle.texts = texts or [""]
        handle.status, handle.body = status, body
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


def request_hash(route: str, body: dict[str, Any]) -> str:
    canonical = json.dumps([route, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def chat_of(events: Any) -> list[dict[str, Any]]:
    """The document's ``chat``: the user inputs and the recorded answers, in order."""
    out: list[dict[str, Any]] = []
    for ev in events:
        if isinstance(ev, User) and ev.source == "user":
            out.append({"role": "user", "content": _asked(ev)})
        elif (
            isinstance(ev, SettingChanged) and ev.key == RESULTS_KEY and isinstance(ev.value, dict)
        ):
            out.append(
                {
                    "role": "tool",
                    "content": _results_text(ev.value.get("results") or []),
                    "requestId": ev.value.get("requestId"),
                    "results": ev.value.get("results") or [],
                }
            )
        elif isinstance(ev, SettingChanged) and ev.key == RESULT_KEY and isinstance(ev.value, dict):
            entry: dict[str, Any] = {
                "role": "assistant",
                "content": str(ev.value.get("response", "")),
                "status": str(ev.value.get("status", "completed")),
            }
            if ev.value.get("runId"):
                entry["runId"] = ev.value["runId"]
            out.append(entry)
    return out


def _asked(ev: User) -> str:
    """What the user asked: the input without the tool results put in front of it."""
    return ev.content if isinstance(ev.content, str) else asked_text(ev.content)


def _results_text(results: list[Any]) -> str:
    lines = []
    for entry in results:
        if not isinstance(entry, dict):
            continue
        raw = entry.get("result")
        result: dict[str, Any] = raw if isinstance(raw, dict) else {}
        state = (
            "uncertain (started, never finished: not run again until someone rules on it)"
            if result.get("uncertain")
            else "succeeded"
            if result.get("success")
            else "failed"
        )
        text = str(result.get("output") or result.get("error") or "")
        if len(text) > 2000:
            text = text[:2000] + f"… ({len(text) - 2000} more characters)"
        lines.append(
            f"- {entry.get('tool')} ({result.get('executionId')}): {state}"
            + (f"\n  {text}" if text else "")
        )
    return "\n".join(lines) or "- (no tools ran)"


def _unseen_results(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The results recorded since the session's last run started: not yet shown to the model."""
    found: list[dict[str, Any]] = []
    for ev in events:
        if isinstance(ev, RunStarted):
            found = []
        elif (
            isinstance(ev, SettingChanged) and ev.key == RESULTS_KEY and isinstance(ev.value, dict)
        ):
            found.append(ev.value)
    return found


def _with_results(text: str, events: Sequence[Event]) -> str | tuple[TextBlock, ...]:
    unseen = _unseen_results(events)
    if not unseen:
        return text
    shown = "\n".join(_results_text(v.get("results") or []) for v in unseen)
    return (
        TextBlock(f"{RESULTS_HEADER} (as the executer reported them):\n{shown}"),
        TextBlock(text),
    )


class _Meter:
    """A run's usage and provider cost, summed over its model turns (cost None: unknown)."""

    def __init__(self) -> None:
        self.input = self.output = 0
        self.usd: float | None = 0.0

    def add(self, model: str, usage: Usage) -> None:
        self.input += usage.input or 0
        self.output += usage.output or 0
        cost = provider_cost(model, usage)
        self.usd = None if self.usd is None or cost is None else self.usd + cost

    @property
    def usage(self) -> tuple[int, int]:
        return (self.input, self.output)


@dataclass
class _Outcome:
    status: int
    body: dict[str, Any]
    cost: int | None = None
    """Millicredits charged (None: the hold is released, nothing charged)."""
    texts: list[str] = field(default_factory=list)
    usage: tuple[int, int] = (0, 0)
    result: dict[str, Any] | None = None
    """What is recorded in the session log."""
    recorded: bool = False
    """The result is already staged in the kiso run (it becomes durable with ``run_ended``)."""
    settle_seq: int | None = None
    """The charge is settled in the transaction that makes this event of the log durable."""
    settled: bool = False
    """That transaction committed (the log is durable past ``settle_seq``)."""
    plan_ids: list[str] = field(default_factory=list)
    """The plan's tool execution ids (recorded so the tunnel knows which session issued them)."""


class RunManager:
    def __init__(
        self,
        config: ServerConfig,
        db: Database,
        store: SessionStore,
        models: ModelChoice,
        *,
        owner: str | None = None,
        cluster: Cluster | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.store = store
        self.models = models
        self.cluster = cluster
        """Several replicas on one database (PostgreSQL): runs of a dead one are taken over."""
        self.owner = cluster.id if cluster is not None else owner or f"srv_{secrets.token_hex(6)}"
        self._watching: dict[str, RunHandle] = {}
        """Runs of other replicas that a stream here follows (from the database)."""
        self.live: dict[str, RunHandle] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._agents: dict[str, Agent] = {}
        self._workspace = config.sessions_dir
        self._rules = RulesFile(config.home / "rules.json")  # never written: agents run no tools
        self._scoped = "project" in inspect.signature(store.create).parameters
        self._in_tx = isinstance(store, SqlSessionStore) and store.engine is db.engine
        """New kiso sessions are created in the admission's transaction, and a run's charge is
        settled in the transaction of the batch that records its result."""
        self._idle: OrderedDict[str, tuple[SessionKey, Session, float]] = OrderedDict()
        """Open kiso sessions between their runs, least recently used first (their lease held:
        the next run needs no open, no load, no lease transaction)."""
        self._idle_lock = threading.Lock()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        """One asyncio lock a session: a run taking its kiso session and the tunnel recording
        results in it take turns."""
        self._busy: set[str] = set()
        """Sessions a run is using now."""
        self._unrecorded: dict[str, list[dict[str, Any]]] = {}
        """Results that came back while the session's run was going: staged before its next."""
        self.relay: Relay | None = None
        """The tunnel (set by the app): the server-driven loop sends tool calls through it."""
        self._issued: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Plan tool ids this process issued -> (project, session): where their results go."""
        self._background: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ admission

    def _persona(
        self, conn: Connection, project_id: str, agent: str, custom: str | None
    ) -> Persona:
        if custom is None:
            return builtin_persona(agent)
        row = conn.execute(
            select(custom_agents).where(
                (custom_agents.c.id == custom) & (custom_agents.c.project_id == project_id)
            )
        ).first()
        if row is None:
            raise ApiError(404, "agent_not_found", f"no custom agent {custom!r} in this project")
        return custom_persona(row.id, row.name, row.description, json.loads(row.tools))

    def _hold_amount(self) -> int:
        return self.config.minimum_charge if self.models.scripted else self.config.hold

    def _admit(self, conn: Connection, req: RunRequest) -> tuple[RunHandle, Persona | None, bool]:
        """(handle, persona to run it with, True if it is new)."""
        if req.idem_key is not None:
            row = conn.execute(_IDEM, {"b_project": req.project_id, "b_key": req.idem_key}).first()
            if row is not None:
                if row.request_hash != req.request_hash:
                    raise ApiError(
                        422,
                        "idempotency_key_reused",
                        "this Idempotency-Key was used with a different request; use a new key "
                        "for a new request",
                        {"runId": row.id},
                    )
                return self._existing(row), None, False
        custom = req.custom_agent_id
        at = now_ms()
        if req.session_id is not None:
            srow = conn.execute(
                _SESSION, {"b_session": req.session_id, "b_project": req.project_id}
            ).first()
            if srow is None:
                raise not_found("session", req.session_id)
            if srow.active_run is not None:
                raise ApiError(
                    409,
                    "session_busy",
                    f"session {srow.id} is already running a request; wait for it to finish "
                    f"(or stream it) and send again",
                    {"sessionId": srow.id, "runId": srow.active_run},
                )
            session_id = srow.id
            if custom is None:
                custom = srow.custom_agent_id
            new_session = False
        else:
            session_id = f"sess_{secrets.token_hex(12)}"
            new_session = True
        persona = self._persona(conn, req.project_id, req.agent, custom)
        run_id = f"run_{secrets.token_hex(12)}"
        try:
            billing.reserve(
                conn, req.project_id, run_id, self._hold_amount(), int(self.config.hold_ttl * 1000)
            )
        except billing.InsufficientCredits as exc:
            in_flight = exc.held > 0 and exc.available + exc.held >= exc.required
            message = (
                "not enough credits right now: the rest are held by runs in flight; retry when "
                "they finish"
                if in_flight
                else "this project is out of credits; grant more with `kyronix credits grant`"
            )
            raise ApiError(
                402,
                "insufficient_credits",
                message,
                {
                    "required": to_credits(exc.required),
                    "available": to_credits(exc.available),
                    "held": to_credits(exc.held),
                },
            ) from None
        if new_session:
            conn.execute(
                _NEW_SESSION,
                {
                    "id": session_id,
                    "project_id": req.project_id,
                    "agent": req.agent,
                    "custom_agent_id": custom,
                    "created_at": at,
                    "active_run": run_id,
                },
            )
        else:
            claimed = conn.execute(_CLAIM, {"b_session": session_id, "b_run": run_id}).rowcount
            if claimed != 1:
                raise ApiError(409, "session_busy", f"session {session_id} is busy")
        conn.execute(
            _NEW_RUN,
            {
                "id": run_id,
                "project_id": req.project_id,
                "session_id": session_id,
                "agent": req.agent,
                "custom_agent_id": custom,
                "status": "running",
                "idem_key": req.idem_key,
                "request_hash": req.request_hash,
                "owner": self.owner,
                "input": req.input,
                "created_at": at,
                "mode": req.execute,
            },
        )
        handle = RunHandle(run_id, session_id, req.project_id)
        if new_session and self._in_tx:
            # the kiso session commits with the admission: one transaction, not two
            handle.writer = self.store.create(  # type: ignore[call-arg]
                str(self._workspace),
                session_id=session_id,
                project=req.project_id,
                connection=conn,
            )
        return handle, persona, True

    def _existing(self, row: Any) -> RunHandle:
        live = self.live.get(row.id)
        if live is not None:
            return live
        if row.status == "running":
            raise ApiError(
                409,
                "idempotency_in_flight",
                "a request with this Idempotency-Key is still running on another server; retry",
                {"runId": row.id},
            )
        return self._from_row(row)

    def _from_row(self, row: Any) -> RunHandle:
        texts = json.loads(row.transcript) if row.transcript else []
        body = json.loads(row.result) if row.result else error_body("internal_error", "no result")
        handle = RunHandle.finished(row, texts, row.http_status or 500, body)
        if row.mode == "tunnel":  # a server-driven run asks once: a second attempt is a takeover
            handle.reasons = {i: TAKEN_OVER for i in range(1, len(handle.texts))}
        return handle

    def _admit_tx(self, req: RunRequest) -> tuple[RunHandle, Persona | None, bool]:
        made: list[RunHandle] = []

        def tx(conn: Connection) -> tuple[RunHandle, Persona | None, bool]:
            out = self._admit(conn, req)
            made.append(out[0])
            return out

        try:
            return self.db.write(tx)
        except BaseException:
            for handle in made:  # the transaction rolled back: so did the session's creation
                if handle.writer is not None:
                    handle.writer.close()
            raise

    async def start(self, req: RunRequest) -> tuple[RunHandle, bool]:
        """Admit the run and start it in the background; (handle, True if new)."""
        if req.execute == "tunnel" and (
            self.relay is None or await self.relay.reachable(req.project_id) == 0
        ):
            raise ApiError(
                409,
                "no_executer",
                "no executer of this project is connected to the tunnel; start one with "
                "`kyronix executer --ws URL --base DIR` (a key of this project), then send again",
            )
        handle, persona, new = await asyncio.to_thread(self._admit_tx, req)
        if new:
            assert persona is not None
            self.live[handle.id] = handle
            task = asyncio.get_running_loop().create_task(
                self._execute(handle, persona, req), name=f"kyronix-run-{handle.id}"
            )
            self.tasks[handle.id] = task
            run_id = handle.id

            def forget(_task: asyncio.Task[None]) -> None:
                self.tasks.pop(run_id, None)

            task.add_done_callback(forget)
            log.info("run %s started (project %s, agent %s)", handle.id, req.project_id, req.agent)
        return handle, new

    async def handle_of(self, project_id: str, run_id: str) -> RunHandle:
        live = self.live.get(run_id)
        if live is not None and live.project_id == project_id:
            return live

        def load(conn: Connection) -> Any:
            return conn.execute(
                select(runs).where((runs.c.id == run_id) & (runs.c.project_id == project_id))
            ).first()

        row = await asyncio.to_thread(self.db.read, load)
        if row is not None and row.status == "running" and self.cluster is not None:
            return self._watch(row)  # running on another replica: follow it
        if row is None or row.status == "running":
            raise not_found("run", run_id)
        return self._from_row(row)

    def _watch(self, row: Any) -> RunHandle:
        """A handle for a run another replica runs: it ends when the run's row does (its texts
        are the transcript that replica streamed), or follows this replica's own handle if
        this one takes the run over."""
        handle = self._watching.get(row.id)
        if handle is not None:
            return handle
        handle = self._watching[row.id] = RunHandle(row.id, row.session_id, row.project_id)

        async def follow() -> None:
            try:
                while True:
                    live = self.live.get(row.id)
                    if live is not None:  # taken over by this replica
                        handle.texts, handle.reasons = live.texts, live.reasons
                        while not live.done:
                            await live.wait_change()
                            handle._wake()
                        assert live.status is not None and live.body is not None
                        handle.finish(live.status, live.body)
                        return
                    now = await asyncio.to_thread(
                        self.db.read,
                        lambda c: c.execute(select(runs).where(runs.c.id == row.id)).first(),
                    )
                    if now is None or now.status != "running":
                        gone = error_body("internal_error", "the run is gone")
                        done = (
                            self._from_row(now)
                            if now is not None
                            else RunHandle.finished(row, [], 500, gone)
                        )
                        handle.texts, handle.reasons = done.texts, done.reasons
                        assert done.status is not None and done.body is not None
                        handle.finish(done.status, done.body)
                        return
                    await asyncio.sleep(0.25)
            finally:
                self._watching.pop(row.id, None)

        self._spawn(follow())
        return handle

    # ------------------------------------------------------------------ execution

    def _agent(self, persona: Persona, req: RunRequest | None = None) -> Agent:
        if req is not None and req.execute == "tunnel":
            return self._tunnel_agent(persona, req.project_id)
        agent = self._agents.get(persona.id) if not persona.custom else None
        if agent is None:
            agent = Agent(
                adapter=self.models.adapter(persona),
                tools=(),
                store=self.store,
                system_prompt=persona.instructions,
                workspace=self._workspace,
                rules=self._rules,
                max_turns=1,
                max_retries=2,
                trigger="api",
                home=self.config.home,
            )
            if not persona.custom:
                self._agents[persona.id] = agent
        return agent

    def _tunnel_agent(self, persona: Persona, project_id: str) -> Agent:
        if self.relay is None:
            raise ApiError(503, "tunnel_unavailable", "this server has no tunnel")
        return TunnelAgent(
            adapter=self.models.tunnel_adapter(persona),
            tools=tunnel_tools(persona, self.relay, project_id),
            store=self.store,
            system_prompt=persona.tunnel_instructions,
            workspace=self._workspace,
            rules=self._rules,
            mode="bypass",  # the executer's permissions are the boundary; nobody here can ask
            max_turns=TUNNEL_TURNS,
            max_retries=2,
            trigger="api",
            home=self.config.home,
        )

    async def _execute(
        self, handle: RunHandle, persona: Persona, req: RunRequest, *, resume: bool = False
    ) -> None:
        outcome: _Outcome | None = None
        try:
            async with asyncio.timeout(self.config.run_timeout):
                outcome = await self._converse(handle, persona, req, resume=resume)
        except TimeoutError:
            outcome = None
            await self._interrupt(handle.id, handle, "timeout")
            return
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._interrupt(handle.id, handle, "shutdown"))
            raise
        except Exception as exc:  # a bug: the run fails, its hold goes back, the server lives
            log.exception("run %s failed unexpectedly", handle.id)
            outcome = _Outcome(
                500,
                error_body(
                    "internal_error", f"the run failed inside the server ({type(exc).__name__})"
                ),
            )
        await asyncio.shield(self._settle(handle, outcome))

    async def _converse(
        self, handle: RunHandle, persona: Persona, req: RunRequest, *, resume: bool = False
    ) -> _Outcome:
        agent = self._agent(persona, req)
        key = (persona, req.execute)
        session = await self._acquire(agent, handle, key)
        keep = False
        try:
            if req.execute == "tunnel":
                outcome = await self._tunnel_run(handle, session, req, resume=resume)
            else:
                outcome = await self._attempts(handle, session, persona, req)
            if outcome.result is not None and not outcome.recorded:
                session.stage(SettingChanged(key=RESULT_KEY, value=outcome.result))
                await session.committed()
            if outcome.settle_seq is not None:
                outcome.settled = session.writer.durable_seq >= outcome.settle_seq
            keep = True
            return outcome
        except BaseException:
            # cut short (shutdown, timeout): end the open kiso run so the log says so
            with contextlib.suppress(Exception):
                _end_open_run(session.writer, handle.id, "the run was cut short")
            raise
        finally:
            await self._done_with(handle.session_id, key, session, keep=keep)

    async def _done_with(self, sid: str, key: SessionKey, session: Session, *, keep: bool) -> None:
        """The run is done with its session: results that came in meanwhile are recorded, then
        the session is kept open for its next run (or closed if the run failed)."""
        async with self._lock(sid):
            self._busy.discard(sid)
            waiting = self._unrecorded.pop(sid, [])
            if keep and not session.writer.closed:
                try:
                    if waiting:
                        session.stage(*(SettingChanged(key=RESULTS_KEY, value=v) for v in waiting))
                        await session.committed()
                except Exception:
                    log.warning("could not record tunnel results in session %s", sid)
                    await asyncio.to_thread(session.close)
                    return
                await self._release(sid, key, session)
                return
            await asyncio.to_thread(session.close)
            for value in waiting:
                try:
                    await asyncio.to_thread(self._append_closed, sid, value)
                except Exception:
                    log.warning("could not record tunnel results in session %s", sid)

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def _acquire(self, agent: Agent, handle: RunHandle, key: SessionKey) -> Session:
        """The run's kiso session: the one created with the admission, the one left open by the
        session's last run (same persona and mode), or opened from the store. Results that came
        back over the tunnel while the session was busy are staged in it first."""
        async with self._lock(handle.session_id):
            session = await self._take(agent, handle, key)
            self._busy.add(handle.session_id)
            waiting = self._unrecorded.pop(handle.session_id, [])
        for value in waiting:
            session.stage(SettingChanged(key=RESULTS_KEY, value=value))
        return session

    async def _take(self, agent: Agent, handle: RunHandle, key: SessionKey) -> Session:
        if handle.writer is not None:
            writer, handle.writer = handle.writer, None
            return Session(agent, writer, headless=True)
        stale: Session | None = None
        with self._idle_lock:
            entry = self._idle.pop(handle.session_id, None)
        if entry is not None:
            if entry[0] == key:
                return entry[1]
            stale = entry[1]  # the custom agent (or the mode) changed: open again
        if stale is not None:
            await asyncio.to_thread(stale.close)
        try:
            return await asyncio.to_thread(self._open_session, agent, handle, key[0])
        except SessionLockedError:
            holder = await asyncio.to_thread(self._holder_of, handle.session_id)
            if holder is None or self.cluster is None:
                raise
        # another replica keeps it open between its runs: ask it to let go, then open it
        await self.cluster.send(holder, "release", {"session": handle.session_id})
        deadline = time.monotonic() + RELEASE_WAIT_S
        while True:
            await asyncio.sleep(0.02)
            try:
                return await asyncio.to_thread(self._open_session, agent, handle, key[0])
            except SessionLockedError:
                if time.monotonic() > deadline:
                    raise

    async def _release(self, session_id: str, key: SessionKey, session: Session) -> None:
        """Keep the session open for its next run; close the least recently used past the cap."""
        with self._idle_lock:
            self._idle[session_id] = (key, session, time.monotonic())
            over = [
                self._idle.popitem(last=False)[1][1] for _ in range(len(self._idle) - OPEN_SESSIONS)
            ]
        if over:
            await asyncio.to_thread(_close_all, over)

    def _evict(self, session_id: str) -> None:
        """Close the session if it is idle in this process (before someone else writes it)."""
        with self._idle_lock:
            entry = self._idle.pop(session_id, None)
        if entry is not None:
            entry[1].close()

    def close_idle(self, older_than: float = 0.0) -> int:
        """Close the idle sessions unused for ``older_than`` seconds (all of them by default)."""
        cutoff = time.monotonic() - older_than
        with self._idle_lock:
            old = [sid for sid, (_, _, used) in self._idle.items() if used <= cutoff]
            closing = [self._idle.pop(sid)[1] for sid in old]
        _close_all(closing)
        return len(closing)

    def _open_session(self, agent: Agent, handle: RunHandle, persona: Persona) -> Session:
        """The run's kiso session, opened for writing (created, scoped to its project, on the
        session's first run)."""
        prompt: str | None = persona.instructions  # recorded if it changed (a custom agent edited)
        try:
            writer = self.store.open(handle.session_id)
        except SessionNotFoundError:
            scope = {"project": handle.project_id} if self._scoped else {}
            writer = self.store.create(str(agent.workspace), session_id=handle.session_id, **scope)
            prompt = None  # new: the agent's prompt is recorded with the first model request
        try:
            return Session(agent, writer, headless=True, system_prompt=prompt)
        except BaseException:
            writer.close()
            raise

    async def _attempts(
        self, handle: RunHandle, session: Any, persona: Persona, req: RunRequest
    ) -> _Outcome:
        prompt: str | tuple[TextBlock, ...] = _with_results(req.input, session.events)
        source = "user"
        meter = _Meter()
        texts: list[str] = []
        for attempt in range(2):
            if attempt:
                handle.new_attempt()
            text = ""
            ended: Outcome | None = None
            accepted: _Outcome | None = None
            problems: list[str] = []
            async for ev in session.run(prompt, source=source):
                if isinstance(ev, TextDelta):
                    handle.add_text(ev.text)
                elif isinstance(ev, ModelTurn):
                    text = ev.event.text
                    meter.add(ev.event.model, ev.event.usage)
                    try:
                        plan = kml.parse(text)
                        problems = check_plan(plan, persona)
                    except KmlError as exc:
                        problems = [f"the answer is not valid KML: {exc}"]
                    if text and not problems:
                        accepted = self._success(
                            handle, plan=plan, run_key=ev.event.run, texts=[*texts, text],
                            charge=self._charge(meter.usd), usage=meter.usage,
                        )  # fmt: skip
                        # recorded with the turn's run_ended: one commit, not two
                        (staged,) = session.stage(
                            SettingChanged(key=RESULT_KEY, value=accepted.result, run=ev.event.run)
                        )
                        accepted.recorded = True
                        if self._in_tx:  # and charged in that same transaction
                            session.writer.attach(
                                functools.partial(self._settle_tx, handle, accepted), seq=staged.seq
                            )
                            accepted.settle_seq = staged.seq
                elif isinstance(ev, Compaction) and ev.event.usage is not None:
                    meter.add(ev.event.model or "", ev.event.usage)  # the summary is paid for too
                elif isinstance(ev, Terminal):
                    ended = ev.outcome
            texts.append(text)
            if ended is None or ended.kind not in ("completed", "max_turns") or not text:
                why = ended.message if ended is not None and ended.message else "no answer"
                return _Outcome(
                    502,
                    error_body("model_error", f"the model failed: {why}", {"runId": handle.id}),
                    texts=texts,
                    usage=meter.usage,
                    result={"runId": handle.id, "status": "failed", "response": ""},
                )
            if accepted is not None:
                return accepted
            prompt = (
                "Your answer was not accepted:\n- "
                + "\n- ".join(problems[:10])
                + "\nAnswer again with one corrected <kyronix> envelope, using only the listed "
                "tools and their parameters."
            )
            source = "system"
        return _Outcome(
            502,
            error_body(
                "invalid_kml",
                "the model's answer did not fit the agent's tools, even after a correction",
                {"runId": handle.id, "problems": problems[:10]},
            ),
            texts=texts,
            usage=meter.usage,
            result={"runId": handle.id, "status": "failed", "response": ""},
        )

    async def _tunnel_run(
        self, handle: RunHandle, session: Session, req: RunRequest, *, resume: bool
    ) -> _Outcome:
        """The server-driven loop: kiso runs the agent, each tool over the tunnel, to the end."""
        meter = _Meter()
        text = ""
        ended: Outcome | None = None
        kiso_run: str | None = session.fold.open_run if resume else None
        if resume:  # the stream starts again: this run's text so far, from the log
            handle.new_attempt(TAKEN_OVER)
            this = kiso_run or _last_run(session.events)
            said = [e.text for e in session.events if isinstance(e, Assistant) and e.run == this]
            handle.add_text("".join(said))
        stream = (
            session.resume()
            if resume
            else session.run(_with_results(req.input, session.events), source="user")
        )
        async for ev in stream:
            if isinstance(ev, TextDelta):
                handle.add_text(ev.text)
            elif isinstance(ev, ModelTurn):
                kiso_run = ev.event.run
                text = ev.event.text
                meter.add(ev.event.model, ev.event.usage)
            elif isinstance(ev, Compaction) and ev.event.usage is not None:
                meter.add(ev.event.model or "", ev.event.usage)  # the summary is paid for too
            elif isinstance(ev, Terminal):
                ended = ev.outcome
        if kiso_run is None:
            kiso_run = _last_run(session.events)
        results = results_of_run(session.events, kiso_run) if kiso_run else []
        if ended is None or ended.kind not in ("completed", "max_turns"):
            why = ended.message if ended is not None and ended.message else "no answer"
            return _Outcome(
                502,
                error_body(
                    "model_error", f"the run did not finish: {why}",
                    {"runId": handle.id, "results": results},
                ),
                texts=list(handle.texts), usage=meter.usage,
                result={"runId": handle.id, "status": "failed", "response": "", "results": results},
            )  # fmt: skip
        charge = self._charge(meter.usd)
        usage_in, usage_out = meter.usage
        ids = [str((r.get("result") or {}).get("executionId", "")) for r in results]
        body = {
            "response": text,
            "sessionId": handle.session_id,
            "creditsRemaining": 0.0,  # filled in when settled
            "usage": {"input": usage_in, "output": usage_out},
            "cost": to_credits(charge),
            "executionIds": ids,
            "runId": handle.id,
            "results": results,
        }
        result = {
            "runId": handle.id, "status": "completed", "response": text,
            "executionIds": ids, "cost": to_credits(charge), "results": results,
        }  # fmt: skip
        outcome = _Outcome(200, body, charge, list(handle.texts), meter.usage, result)
        if self._in_tx:  # the answer, its results and the charge: one transaction
            (staged,) = session.stage(SettingChanged(key=RESULT_KEY, value=result))
            outcome.recorded = True
            writer = session.writer
            assert isinstance(writer, SqlWriter)
            writer.attach(functools.partial(self._settle_tx, handle, outcome), seq=staged.seq)
            outcome.settle_seq = staged.seq
            await session.committed()
        return outcome

    # ------------------------------------------------------------------ tunnel results

    async def record_results(
        self, project_id: str, session_id: str | None, frame: dict[str, Any]
    ) -> None:
        """Record what an executer answered in the session whose plan issued those tool ids
        (best effort: the executer's receipts keep the truth either way)."""
        results = frame.get("results")
        if not isinstance(results, list) or not results:
            return
        ids = [
            (e.get("result") or {}).get("executionId")
            for e in results
            if isinstance(e, dict) and isinstance(e.get("result"), dict)
        ]
        ids = [i for i in ids if isinstance(i, str)]
        if not ids or not isinstance(ids[0], str):
            return
        first: str = ids[0]
        value = {"requestId": frame.get("executionId"), "results": results}
        issued = self._issued.get(first)
        if issued is not None and issued[0] == project_id:
            await self._record(issued[1], value)
            return
        # Not issued by this process since it started: look it up in the background (a plan of
        # a previous run of the server), so the round trip of everything else pays nothing.
        self._spawn(self._record_lookup(project_id, first, value))

    async def _record_lookup(
        self, project_id: str, execution_id: str, value: dict[str, Any]
    ) -> None:
        def owner(conn: Connection) -> str | None:
            row = conn.execute(_EXECUTION, {"b_id": execution_id, "b_project": project_id}).first()
            return None if row is None else str(row.session_id)

        try:
            target = await asyncio.to_thread(self.db.read, owner)
        except Exception:
            log.warning("could not look up the session of request %s", value.get("requestId"))
            return
        if (
            target is not None
        ):  # None: not a plan of ours (or the server's own loop: kiso records it)
            await self._record(target, value)

    async def _record(self, target: str, value: dict[str, Any], *, forwarded: bool = False) -> None:
        try:
            async with self._lock(target):
                if target in self._busy:
                    self._unrecorded.setdefault(target, []).append(value)
                    return
                with self._idle_lock:
                    entry = self._idle.get(target)
                if entry is not None:
                    entry[1].stage(SettingChanged(key=RESULTS_KEY, value=value))
                    await entry[1].committed()
                    return
                await asyncio.to_thread(self._append_closed, target, value)
        except SessionLockedError:
            # another replica has the session open (running it, or idle between its runs): it
            # records them, as this one would
            holder = None if forwarded else await asyncio.to_thread(self._holder_of, target)
            if holder is not None and self.cluster is not None:
                await self.cluster.send(holder, "record", {"session": target, "value": value})
                return
            log.warning("could not record request %s in session %s: it is in use elsewhere",
                        value.get("requestId"), target)  # fmt: skip
        except Exception:
            log.warning("could not record request %s in session %s", value.get("requestId"), target)

    def _holder_of(self, session_id: str) -> str | None:
        """The replica holding the session's writer lease, if another than this one."""
        if self.cluster is None:
            return None
        return self.cluster.lease_holder(session_id)

    async def _remote_record(self, body: dict[str, Any]) -> None:
        await self._record(str(body["session"]), body["value"], forwarded=True)

    async def _remote_release(self, body: dict[str, Any]) -> None:
        """Another replica needs a session this one keeps open between runs: let it go."""
        await asyncio.to_thread(self._evict, str(body["session"]))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _remember(self, handle: RunHandle, ids: Sequence[str]) -> None:
        for eid in ids:
            self._issued[eid] = (handle.project_id, handle.session_id)
        while len(self._issued) > ISSUED_KEPT:
            self._issued.popitem(last=False)

    def _append_closed(self, session_id: str, value: dict[str, Any]) -> None:
        writer = self.store.open(session_id)
        try:
            writer.append(SettingChanged(key=RESULTS_KEY, value=value))
        finally:
            writer.close()

    # ------------------------------------------------------------------ resuming

    async def resume_tunnel_runs(self, rows: list[Any]) -> None:
        """Carry on the server-driven runs a killed server left running: each resumes from its
        session's log and sends its tool requests again, with the same ids."""
        for row in rows:
            persona = await asyncio.to_thread(
                self.db.read,
                lambda c, r=row: self._persona(c, r.project_id, r.agent, r.custom_agent_id),
            )
            req = RunRequest(
                project_id=row.project_id, agent=row.agent, input=row.input or "",
                session_id=row.session_id, custom_agent_id=row.custom_agent_id,
                execute="tunnel",
            )  # fmt: skip
            handle = RunHandle(row.id, row.session_id, row.project_id)
            self.live[handle.id] = handle
            task = asyncio.get_running_loop().create_task(
                self._execute(handle, persona, req, resume=True), name=f"kyronix-run-{handle.id}"
            )
            self.tasks[handle.id] = task
            task.add_done_callback(functools.partial(_forget_task, self.tasks, handle.id))
            log.info("run %s resumed from its session log (server-driven)", handle.id)

    def _charge(self, usd: float | None) -> int:
        """Millicredits for a run: ``max(minimum, provider cost x multiplier)``."""
        if not usd:
            return self.config.minimum_charge
        priced = round(usd * self.config.credits_per_usd * self.config.multiplier * MILLI)
        return max(self.config.minimum_charge, priced)

    def _success(
        self,
        handle: RunHandle,
        *,
        plan: kml.Plan,
        run_key: str,
        texts: list[str],
        charge: int,
        usage: tuple[int, int],
    ) -> _Outcome:
        response, ids = finalize(plan, run_key)
        body = {
            "response": response,
            "sessionId": handle.session_id,
            "creditsRemaining": 0.0,  # filled in when settled
            "usage": {"input": usage[0], "output": usage[1]},
            "cost": to_credits(charge),
            "executionIds": ids,
            "runId": handle.id,
        }
        result = {
            "runId": handle.id,
            "status": "completed",
            "response": response,
            "executionIds": ids,
            "cost": to_credits(charge),
        }
        return _Outcome(200, body, charge, texts, usage, result, plan_ids=list(ids))

    def _settle_tx(self, handle: RunHandle, outcome: _Outcome, conn: Connection) -> None:
        left: int | None = None
        if outcome.cost is not None:
            left = billing.settle(conn, handle.id, outcome.cost)
        else:
            billing.release(conn, handle.id, note=outcome.body.get("error", {}).get("code"))
        if outcome.status == 200:
            if left is None:  # settled before (a retry of this transaction)
                left = billing.balance(conn, handle.project_id)
            outcome.body["creditsRemaining"] = to_credits(left)
        conn.execute(
            _FINISH,
            {
                "b_run": handle.id,
                "b_status": "completed" if outcome.status == 200 else "failed",
                "b_at": now_ms(),
                "b_http": outcome.status,
                "b_result": json.dumps(outcome.body),
                "b_transcript": json.dumps(outcome.texts),
                "b_cost": outcome.cost or 0,
                "b_in": outcome.usage[0],
                "b_out": outcome.usage[1],
            },
        )
        conn.execute(_FREE, {"b_session": handle.session_id, "b_run": handle.id})
        if outcome.status == 200 and outcome.plan_ids:  # where the tunnel records their results
            at = now_ms()
            conn.execute(
                _NEW_EXECUTION,
                [
                    {"id": eid, "project_id": handle.project_id, "session_id": handle.session_id,
                     "run_id": handle.id, "created_at": at}
                    for eid in outcome.plan_ids
                ],
            )  # fmt: skip

    async def _settle(self, handle: RunHandle, outcome: _Outcome) -> None:
        """Settle the run, unless the batch that recorded its result already did (that batch is
        durable: the session's log has moved past the event it was attached to)."""
        if not outcome.settled:
            await asyncio.to_thread(
                self.db.write, functools.partial(self._settle_tx, handle, outcome)
            )
        if outcome.status == 200 and outcome.plan_ids:
            self._remember(handle, outcome.plan_ids)
        handle.finish(outcome.status, outcome.body)
        log.info("run %s finished %s (cost %s)", handle.id, outcome.status, outcome.cost)

    # ------------------------------------------------------------------ interruption

    def _interrupted_body(self, run_id: str, why: str) -> dict[str, Any]:
        return error_body(
            "run_interrupted",
            f"the run was interrupted ({why}) before it answered; nothing was charged. Send the "
            f"request again.",
            {"runId": run_id},
        )

    async def _interrupt(self, run_id: str, handle: RunHandle | None, why: str) -> None:
        cut = await asyncio.to_thread(self.interrupt_sync, run_id, why)
        if handle is not None:
            if cut:
                handle.finish(503, self._interrupted_body(run_id, why))
            else:  # it finished first (settled with its result): answer what it answered
                done = await self.handle_of(handle.project_id, run_id)
                handle.finish(done.status or 500, done.body or {})

    def interrupt_sync(self, run_id: str, why: str) -> bool:
        """Record a run as interrupted: its session log, its hold, its row (idempotent); False
        if it was not running."""

        def load(conn: Connection) -> Any:
            return conn.execute(select(runs).where(runs.c.id == run_id)).first()

        row = self.db.read(load)
        if row is None or row.status != "running":
            return False
        self._record_interrupted_in_log(row.session_id, run_id, why, row.input or "")
        body = self._interrupted_body(run_id, why)

        def tx(conn: Connection) -> None:
            billing.release(conn, run_id, note=f"interrupted: {why}")
            conn.execute(
                update(runs)
                .where((runs.c.id == run_id) & (runs.c.status == "running"))
                .values(
                    status="interrupted",
                    finished_at=now_ms(),
                    http_status=503,
                    result=json.dumps(body),
                    transcript=json.dumps([]),
                    cost=0,
                    idem_key=None,
                )
            )
            conn.execute(
                update(sessions)
                .where((sessions.c.id == row.session_id) & (sessions.c.active_run == run_id))
                .values(active_run=None)
            )

        self.db.write(tx)
        log.info("run %s interrupted (%s); its hold was released", run_id, why)
        return True

    def _record_interrupted_in_log(
        self, session_id: str, run_id: str, why: str, asked: str
    ) -> None:
        """End the run's open kiso run (``error: interrupted``) and record the outcome. A run
        whose input never became durable (it is written with the model's turn) gets it back
        from its row, so the log shows what was asked and that it was interrupted."""
        self._evict(session_id)
        try:
            writer = self.store.open(session_id)
        except SessionNotFoundError:
            return  # the run never reached its session: nothing to record there
        except Exception:
            log.warning(
                "could not open session %s to record run %s as interrupted", session_id, run_id
            )
            return
        try:
            for ev in writer.events:
                if (
                    isinstance(ev, SettingChanged)
                    and ev.key == RESULT_KEY
                    and isinstance(ev.value, dict)
                    and ev.value.get("runId") == run_id
                ):
                    return
            if replay(writer.events).open_run is None and asked:
                kiso_run = new_id()
                writer.stage(
                    RunStarted(
                        run=kiso_run, trigger="api", model=ModelRef("kyronix", "none"),
                        mode="default",
                    ),
                    User(run=kiso_run, content=asked),
                )  # fmt: skip
            _end_open_run(writer, run_id, f"the server stopped ({why})")
            writer.append(
                SettingChanged(
                    key=RESULT_KEY,
                    value={"runId": run_id, "status": "interrupted", "response": ""},
                )
            )
        finally:
            writer.close()

    def sweep_at_start(self) -> tuple[int, list[Any]]:
        """At start: take over the runs no live server runs (with one server, every run still
        ``running``: its server was killed). See :meth:`take_over`."""
        stale, resumable = self.take_over(why="server restart")
        self._sweep_holds(live={r.id for r in resumable})
        return stale, resumable

    def take_over(self, *, why: str = "its server stopped") -> tuple[int, list[Any]]:
        """Claim every ``running`` run whose server is not alive (one statement: a run goes to
        exactly one replica), then: a plan run is recorded interrupted; a server-driven run is
        returned, to be resumed from its session log. Returns (interrupted, to resume)."""
        live: Any
        dead: list[str] = []
        if self.cluster is None:
            live = {self.owner}
        else:
            _, dead = self.cluster.liveness()
            fresh = now_ms() - int(self.cluster.timeout * 1000)
            live = select(replicas.c.id).where(
                (replicas.c.heartbeat_at > fresh) & replicas.c.id.not_in(dead)
            )  # in the claiming statement: a replica registers before its first run

        def claim(conn: Connection) -> list[Any]:
            return list(
                conn.execute(
                    update(runs)
                    .where(
                        (runs.c.status == "running")
                        & (runs.c.owner != self.owner)
                        & runs.c.owner.not_in(live)
                    )
                    .values(owner=self.owner)
                    .returning(*runs.c)
                )
            )

        claimed = self.db.write(claim)
        if self.cluster is not None and dead:
            self.cluster.forget(dead)
        resumable = [r for r in claimed if r.mode == "tunnel" and self.relay is not None]
        for row in claimed:
            if row not in resumable:
                self.interrupt_sync(row.id, why)
        if claimed:
            log.info("took over %d run(s) left by a stopped server (%s)", len(claimed), why)
        return len(claimed) - len(resumable), resumable

    async def watch_replicas_forever(self) -> None:
        """With several replicas: renew this one's heartbeat, and take over the runs of any that
        died; each beat."""
        assert self.cluster is not None
        cluster = self.cluster
        while True:
            await asyncio.sleep(cluster.beat)
            try:
                await asyncio.to_thread(cluster.heartbeat)
                await asyncio.to_thread(cluster.prune)
                if self.relay is not None:
                    await asyncio.to_thread(cluster.seen, self.relay.heard())
                    await self.relay.reroute()
                _, resumable = await asyncio.to_thread(self.take_over, why="replica lost")
                if resumable:
                    await self.resume_tunnel_runs(resumable)
            except Exception:
                log.exception("the replica heartbeat failed; it runs again in %gs", cluster.beat)

    def _sweep_holds(self, live: set[str]) -> int:
        expired = self.db.read(lambda c: billing.expired_holds(c, now_ms()))
        if self.cluster is not None and expired:  # another replica's runs are its own to sweep
            elsewhere = self.db.read(
                lambda c: {
                    r.id
                    for r in c.execute(
                        select(runs.c.id).where(
                            runs.c.id.in_(expired)
                            & (runs.c.status == "running")
                            & (runs.c.owner != self.owner)
                        )
                    )
                }
            )
            live = live | elsewhere
        count = 0
        for run_id in expired:
            if run_id in live:
                continue
            self.interrupt_sync(run_id, "hold expired")
            self.db.write(functools.partial(_release_expired, run_id=run_id))
            count += 1
        return count

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            try:
                live = {rid for rid, h in self.live.items() if not h.done}
                await asyncio.to_thread(self._sweep_holds, live)
                await asyncio.to_thread(self.close_idle, IDLE_S)
                self._forget_old()
            except Exception:
                log.exception("the hold sweep failed; it runs again later")

    def _forget_old(self) -> None:
        now = time.monotonic()
        for rid, h in list(self.live.items()):
            if h.finished_at is not None and now - h.finished_at > RECENT_S:
                del self.live[rid]

    @property
    def running(self) -> int:
        return len(self.tasks)

    async def drain(self, timeout: float) -> None:
        """Let running runs finish for up to ``timeout`` seconds; interrupt the rest."""
        if self.tasks:
            log.info("draining: waiting up to %gs for %d run(s)", timeout, len(self.tasks))
            _, pending = await asyncio.wait(list(self.tasks.values()), timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)


def _end_open_run(writer: Any, run_id: str, why: str) -> None:
    """Append ``run_ended`` (``error``, ``interrupted``) to the log's open kiso run, if any."""
    open_run = replay(writer.events).open_run
    if open_run is not None:
        writer.append(
            RunEnded(
                run=open_run,
                outcome=Outcome.error(
                    "interrupted", f"{why}; Kyronix run {run_id}", retryable=True
                ),
            )
        )


def _close_all(sessions_: list[Session]) -> None:
    for session in sessions_:
        try:
            session.close()
        except Exception:  # its lease goes stale with this process; the log is intact
            log.warning("could not close kiso session %s", session.id)


def _release_expired(conn: Connection, *, run_id: str) -> bool:
    return billing.release(conn, run_id, note="hold expired")


def _last_run(events: Sequence[Event]) -> str | None:
    for ev in reversed(events):
        if isinstance(ev, RunStarted):
            return ev.run
    return None


def _forget_task(tasks: dict[str, Any], run_id: str, _task: object) -> None:
    tasks.pop(run_id, None)
