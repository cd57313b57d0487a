"""Runs: admitted in one transaction, executed outside any request, settled in another.

A run is a Kyronix agent turn: the request's input goes into a **kiso session** (the Kyronix
session's id is the kiso session's id) and the session's run produces the model's KML. The
HTTP request, or the SSE stream, only watches a :class:`RunHandle`: a client that disconnects
neither cancels the run nor loses its charge record.

1. **Admit** (one write transaction): the idempotency key, the session (created when the
   request names none; ``session_busy`` if it has an active run: enforced by a conditional
   update of ``kx_sessions.active_run``), the persona, the credit hold (``insufficient_credits``
   before anything is called), the ``kx_runs`` row.
2. **Execute** (no transaction open): the kiso session runs on the persona's model; its text
   streams to the handle; the answer is parsed and checked against the persona's tools, and a
   bad answer is sent back to the model once (a second kiso run whose input is the problems,
   ``source: system``). The outcome is recorded in the session log as a ``setting_changed``
   ``kyronix.result`` (the final envelope with its execution ids): ``chat`` is a projection
   of the log.
3. **Settle** (one write transaction): the charge and the release of the hold, the run row,
   the session freed. A failed run releases its hold and is charged nothing.

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
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select, update

from kiso.kernel import (
    ModelRef,
    Outcome,
    RunEnded,
    RunStarted,
    SessionNotFoundError,
    SessionStore,
    SettingChanged,
    Usage,
    User,
    new_id,
    replay,
)
from kiso.providers.registry import cost as provider_cost
from kiso.runtime import Agent, ModelTurn, Session, Terminal, TextDelta
from kiso.runtime.rules import RulesFile
from kyronix import kml
from kyronix.errors import KmlError
from kyronix.server import billing
from kyronix.server.agents import Persona, builtin_persona, check_plan, custom_persona, finalize
from kyronix.server.config import MILLI, ServerConfig, to_credits
from kyronix.server.db import Database, custom_agents, now_ms, runs, sessions
from kyronix.server.errors import ApiError, error_body, not_found

if TYPE_CHECKING:
    from kyronix.server.models import ModelChoice

__all__ = ["RESULT_KEY", "RunHandle", "RunManager", "RunRequest", "chat_of"]

log = logging.getLogger("kyronix.server")

RESULT_KEY = "kyronix.result"
"""The ``setting_changed`` key that records a Kyronix run's outcome in its kiso session."""
RECENT_S = 600.0
"""How long a finished run's handle stays in memory for SSE reconnects (then the DB serves)."""


@dataclass(frozen=True)
class RunRequest:
    project_id: str
    agent: str
    input: str
    session_id: str | None = None
    custom_agent_id: str | None = None
    idem_key: str | None = None
    request_hash: str | None = None


class RunHandle:
    """What a run has produced so far: the text of each model attempt, then its result."""

    def __init__(self, run_id: str, session_id: str, project_id: str) -> None:
        self.id = run_id
        self.session_id = session_id
        self.project_id = project_id
        self.texts: list[str] = [""]
        self.status: int | None = None
        self.body: dict[str, Any] | None = None
        self.finished_at: float | None = None
        self._changed = asyncio.Event()
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

    def new_attempt(self) -> None:
        self.texts.append("")
        self._wake()

    def finish(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.body = status, body
        self.finished_at = time.monotonic()
        self._done.set()
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_change(self) -> None:
        if not self.done:
            await self._changed.wait()

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
            out.append({"role": "user", "content": ev.text})
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


class RunManager:
    def __init__(
        self,
        config: ServerConfig,
        db: Database,
        store: SessionStore,
        models: ModelChoice,
        *,
        owner: str | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.store = store
        self.models = models
        self.owner = owner or f"srv_{secrets.token_hex(6)}"
        self.live: dict[str, RunHandle] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._agents: dict[str, Agent] = {}
        self._workspace = config.sessions_dir
        self._rules = RulesFile(config.home / "rules.json")  # never written: agents run no tools
        self._scoped = "project" in inspect.signature(store.create).parameters

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
            row = conn.execute(
                select(runs).where(
                    (runs.c.project_id == req.project_id) & (runs.c.idem_key == req.idem_key)
                )
            ).first()
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
                select(sessions).where(
                    (sessions.c.id == req.session_id) & (sessions.c.project_id == req.project_id)
                )
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
                sessions.insert().values(
                    id=session_id,
                    project_id=req.project_id,
                    agent=req.agent,
                    custom_agent_id=custom,
                    created_at=at,
                    active_run=run_id,
                )
            )
        else:
            claimed = conn.execute(
                update(sessions)
                .where((sessions.c.id == session_id) & sessions.c.active_run.is_(None))
                .values(active_run=run_id)
            ).rowcount
            if claimed != 1:
                raise ApiError(409, "session_busy", f"session {session_id} is busy")
        conn.execute(
            runs.insert().values(
                id=run_id,
                project_id=req.project_id,
                session_id=session_id,
                agent=req.agent,
                custom_agent_id=custom,
                status="running",
                idem_key=req.idem_key,
                request_hash=req.request_hash,
                owner=self.owner,
                input=req.input,
                created_at=at,
            )
        )
        return RunHandle(run_id, session_id, req.project_id), persona, True

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
        return RunHandle.finished(row, texts, row.http_status or 500, body)

    async def start(self, req: RunRequest) -> tuple[RunHandle, bool]:
        """Admit the run and start it in the background; (handle, True if new)."""
        handle, persona, new = await asyncio.to_thread(self.db.write, lambda c: self._admit(c, req))
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
        if row is None or row.status == "running":
            raise not_found("run", run_id)
        return self._from_row(row)

    # ------------------------------------------------------------------ execution

    def _agent(self, persona: Persona) -> Agent:
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

    async def _execute(self, handle: RunHandle, persona: Persona, req: RunRequest) -> None:
        outcome: _Outcome | None = None
        try:
            async with asyncio.timeout(self.config.run_timeout):
                outcome = await self._converse(handle, persona, req)
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

    async def _converse(self, handle: RunHandle, persona: Persona, req: RunRequest) -> _Outcome:
        agent = self._agent(persona)
        session = await asyncio.to_thread(self._open_session, agent, handle, persona)
        try:
            outcome = await self._attempts(handle, session, persona, req)
            if outcome.result is not None and not outcome.recorded:
                session.stage(SettingChanged(key=RESULT_KEY, value=outcome.result))
                await session.committed()
            return outcome
        except BaseException:
            # cut short (shutdown, timeout): end the open kiso run so the log says so
            with contextlib.suppress(Exception):
                _end_open_run(session.writer, handle.id, "the run was cut short")
            raise
        finally:
            await asyncio.to_thread(session.close)

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
        prompt, source = req.input, "user"
        usage_in = usage_out = 0
        usd: float | None = 0.0
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
                    u: Usage = ev.event.usage
                    usage_in += u.input or 0
                    usage_out += u.output or 0
                    c = provider_cost(ev.event.model, u)
                    usd = None if usd is None or c is None else usd + c
                    try:
                        plan = kml.parse(text)
                        problems = check_plan(plan, persona)
                    except KmlError as exc:
                        problems = [f"the answer is not valid KML: {exc}"]
                    if text and not problems:
                        accepted = self._success(
                            handle, plan=plan, run_key=ev.event.run, texts=[*texts, text],
                            usd=usd, usage=(usage_in, usage_out),
                        )  # fmt: skip
                        # recorded with the turn's run_ended: one commit, not two
                        session.stage(
                            SettingChanged(key=RESULT_KEY, value=accepted.result, run=ev.event.run)
                        )
                        accepted.recorded = True
                elif isinstance(ev, Terminal):
                    ended = ev.outcome
            texts.append(text)
            if ended is None or ended.kind not in ("completed", "max_turns") or not text:
                why = ended.message if ended is not None and ended.message else "no answer"
                return _Outcome(
                    502,
                    error_body("model_error", f"the model failed: {why}", {"runId": handle.id}),
                    texts=texts,
                    usage=(usage_in, usage_out),
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
            usage=(usage_in, usage_out),
            result={"runId": handle.id, "status": "failed", "response": ""},
        )

    def _success(
        self,
        handle: RunHandle,
        *,
        plan: kml.Plan,
        run_key: str,
        texts: list[str],
        usd: float | None,
        usage: tuple[int, int],
    ) -> _Outcome:
        response, ids = finalize(plan, run_key)
        charge = self.config.minimum_charge
        if usd:
            priced = round(usd * self.config.credits_per_usd * self.config.multiplier * MILLI)
            charge = max(charge, priced)
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
        return _Outcome(200, body, charge, texts, usage, result)

    async def _settle(self, handle: RunHandle, outcome: _Outcome) -> None:
        def tx(conn: Connection) -> None:
            if outcome.cost is not None:
                billing.settle(conn, handle.id, outcome.cost)
            else:
                billing.release(conn, handle.id, note=outcome.body.get("error", {}).get("code"))
            if outcome.status == 200:
                outcome.body["creditsRemaining"] = to_credits(
                    billing.balance(conn, handle.project_id)
                )
            conn.execute(
                update(runs)
                .where(runs.c.id == handle.id)
                .values(
                    status="completed" if outcome.status == 200 else "failed",
                    finished_at=now_ms(),
                    http_status=outcome.status,
                    result=json.dumps(outcome.body),
                    transcript=json.dumps(outcome.texts),
                    cost=outcome.cost or 0,
                    usage_input=outcome.usage[0],
                    usage_output=outcome.usage[1],
                )
            )
            conn.execute(
                update(sessions)
                .where((sessions.c.id == handle.session_id) & (sessions.c.active_run == handle.id))
                .values(active_run=None)
            )

        await asyncio.to_thread(self.db.write, tx)
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
        await asyncio.to_thread(self.interrupt_sync, run_id, why)
        if handle is not None:
            handle.finish(503, self._interrupted_body(run_id, why))

    def interrupt_sync(self, run_id: str, why: str) -> None:
        """Record a run as interrupted: its session log, its hold, its row (idempotent)."""

        def load(conn: Connection) -> Any:
            return conn.execute(select(runs).where(runs.c.id == run_id)).first()

        row = self.db.read(load)
        if row is None or row.status != "running":
            return
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

    def _record_interrupted_in_log(
        self, session_id: str, run_id: str, why: str, asked: str
    ) -> None:
        """End the run's open kiso run (``error: interrupted``) and record the outcome. A run
        whose input never became durable (it is written with the model's turn) gets it back
        from its row, so the log shows what was asked and that it was interrupted."""
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

    def sweep_at_start(self) -> int:
        """Every run still ``running`` belongs to a dead server (one server per database)."""

        def load(conn: Connection) -> list[str]:
            return [r.id for r in conn.execute(select(runs.c.id).where(runs.c.status == "running"))]

        stale = self.db.read(load)
        for run_id in stale:
            self.interrupt_sync(run_id, "server restart")
        self._sweep_holds(live=set())
        return len(stale)

    def _sweep_holds(self, live: set[str]) -> int:
        expired = self.db.read(lambda c: billing.expired_holds(c, now_ms()))
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


def _release_expired(conn: Connection, *, run_id: str) -> bool:
    return billing.release(conn, run_id, note="hold expired")
