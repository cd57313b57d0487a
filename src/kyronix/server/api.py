"""The ``/api`` routes: the Kyronix document's paths and shapes, exactly.

=========================================  =====================================================
``POST /api/agents/{agent}``               run a built-in agent → ``{response, sessionId,
                                           creditsRemaining, usage, cost, executionIds, runId}``
``POST /api/agents/{agent}/stream``        the same as server-sent events
``GET  /api/agents``                       the built-in agents and their tools
``GET|POST /api/customagents``             list / create custom agents
``GET|PATCH|DELETE /api/customagents/{id}``
``POST /api/customagents/run[/stream]``    run a custom agent ``{agentId, input, …}``
``POST /api/sessions``                     ``{agent?, customAgentId?, projectId?}`` → ``{id,
                                           agentId}``
``GET|POST /api/sessions/{id}``            ``{id, agentId, chat: [{role, content}]}``
``GET  /api/runs/{id}``, ``…/stream``      a run's result; join (or re-join) its stream
``GET  /api/credits``                      the project's credits and holds
=========================================  =====================================================

Every route needs ``Authorization: Bearer kyr_…``; a key sees only its own project: anything of
another project is 404, exactly as if it did not exist. Run routes take ``Idempotency-Key``.
Streams carry an ``id`` on every event (``<attempt>:<offset>``, then ``end``); a client that
reconnects with ``Last-Event-ID`` (to ``/api/runs/{id}/stream``, or to the same POST with the
same Idempotency-Key) gets the rest.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Path, Request
from fastapi.responses import JSONResponse
from sqlalchemy import Connection
from sse_starlette import EventSourceResponse, ServerSentEvent

from kiso.kernel import SessionNotFoundError
from kyronix.server import billing, custom_agents, sessions
from kyronix.server.agents import AGENTS, builtin_persona
from kyronix.server.config import to_credits
from kyronix.server.errors import (
    ApiError,
    not_found,
)
from kyronix.server.runs.handle import RunHandle, RunRequest
from kyronix.server.schemas import (
    AGENT_SLUG,
    CUSTOM_AGENT_ID,
    RUN_ID,
    SESSION_ID,
    AgentInfo,
    AgentList,
    ChatMessage,
    CreditsInfo,
    CustomAgent,
    CustomAgentCreate,
    CustomAgentDeleted,
    CustomAgentPatch,
    CustomRunBody,
    ErrorResponse,
    RunBody,
    RunResult,
    SessionBody,
    SessionCreated,
    SessionView,
    ToolInfo,
)
from kyronix.server.state import Auth, GuardedRoute, Principal, app_state

__all__ = ["install_health", "request_hash", "router"]

log = logging.getLogger("kyronix.server")


_E = {"model": ErrorResponse}
_COMMON: dict[int | str, dict[str, Any]] = {
    400: _E, 401: _E, 404: _E, 413: _E, 429: _E, 503: _E,
}  # fmt: skip
_RUN: dict[int | str, dict[str, Any]] = {
    **_COMMON, 402: _E, 409: _E, 422: _E, 500: _E, 502: _E,
}  # fmt: skip
_SSE: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "event": {"enum": ["chunk", "attempt", "complete", "error"]},
                        "id": {"type": "string", "pattern": r"^(\d{1,3}:\d{1,9}|end)$"},
                        "data": {"type": "string", "description": "a JSON object"},
                    },
                    "required": ["event", "id", "data"],
                }
            }
        },
        "description": "events: chunk {text}, attempt {attempt}, then complete (the run "
        "result) or error ({error}); each with an id",
    },
    **_RUN,
}


def request_hash(route: str, body: dict[str, Any]) -> str:
    """What an Idempotency-Key is bound to: the route and its body."""
    canonical = json.dumps([route, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _project(who: Principal, project_id: str | None) -> str:
    if project_id is not None and project_id != who.project_id:
        raise ApiError(
            404,
            "project_not_found",
            f"no project {project_id!r} for this API key (a key belongs to one project)",
        )
    return who.project_id


IdemHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="retry-safe key: the same key returns the first result, charged once",
        pattern=r"^[\x21-\x7e]{1,255}$",
    ),
]
LastEventHeader = Annotated[
    str | None,
    Header(alias="Last-Event-ID", description="resume a stream after this event id"),
]

router = APIRouter(prefix="/api", route_class=GuardedRoute)


# --------------------------------------------------------------------------- runs


async def _start(
    request: Request,
    who: Principal,
    *,
    agent: str,
    custom_agent_id: str | None,
    body: dict[str, Any],
    route: str,
    idem: str | None,
) -> tuple[RunHandle, bool]:
    state = app_state(request)
    project_id = _project(who, body.get("projectId"))
    req = RunRequest(
        project_id=project_id,
        agent=agent,
        input=body["input"],
        session_id=body.get("sessionId"),
        custom_agent_id=custom_agent_id,
        idem_key=idem,
        request_hash=request_hash(route, body) if idem is not None else None,
        execute=body.get("execute"),
        key_id=who.key_id,
    )
    return await state.runs.start(req)


async def _answer(handle: RunHandle, new: bool) -> JSONResponse:
    await handle.wait_done()
    assert handle.status is not None and handle.body is not None
    headers = {} if new else {"Idempotent-Replayed": "true"}
    return JSONResponse(handle.body, status_code=handle.status, headers=headers)


def _check_agent(agent: str) -> None:
    if agent not in AGENTS:
        raise ApiError(
            404,
            "agent_not_found",
            f"no agent {agent!r}; the built-in agents are {', '.join(AGENTS)}",
            {"agents": list(AGENTS)},
        )


AgentPath = Annotated[
    str, Path(pattern=AGENT_SLUG, description="coding | research | database | sales")
]


@router.post(
    "/agents/{agent}",
    response_model=RunResult,
    responses=_RUN,
    summary="Execute a built-in agent",
)
async def run_agent(
    request: Request, agent: AgentPath, body: RunBody, who: Auth, idem: IdemHeader = None
) -> JSONResponse:
    _check_agent(agent)
    data = body.model_dump(exclude_none=True)
    handle, new = await _start(
        request, who, agent=agent, custom_agent_id=body.customAgentId, body=data,
        route=f"agents/{agent}", idem=idem,
    )  # fmt: skip
    return await _answer(handle, new)


@router.post(
    "/agents/{agent}/stream",
    response_class=EventSourceResponse,
    responses=_SSE,
    summary="Execute a built-in agent, streaming its KML",
)
async def stream_agent(
    request: Request,
    agent: AgentPath,
    *,
    body: RunBody,
    who: Auth,
    idem: IdemHeader = None,
    last_event_id: LastEventHeader = None,
) -> EventSourceResponse:
    _check_agent(agent)
    data = body.model_dump(exclude_none=True)
    handle, _ = await _start(
        request, who, agent=agent, custom_agent_id=body.customAgentId, body=data,
        route=f"agents/{agent}", idem=idem,
    )  # fmt: skip
    return _sse(handle, last_event_id)


@router.get("/agents", response_model=AgentList, responses=_COMMON, summary="The built-in agents")
async def list_agents(who: Auth) -> AgentList:
    out = []
    for slug in AGENTS:
        persona = builtin_persona(slug)
        out.append(
            AgentInfo(
                id=slug,
                description=persona.description,
                tools=[
                    ToolInfo(
                        name=t.name, description=t.description, params=[p.name for p in t.params]
                    )
                    for t in persona.tools
                ],
            )
        )
    return AgentList(agents=out)


@router.post(
    "/customagents/run",
    response_model=RunResult,
    responses=_RUN,
    summary="Execute a custom agent",
)
async def run_custom(
    request: Request, body: CustomRunBody, who: Auth, idem: IdemHeader = None
) -> JSONResponse:
    data = body.model_dump(exclude_none=True)
    handle, new = await _start(
        request, who, agent="custom", custom_agent_id=body.agentId, body=data,
        route="customagents/run", idem=idem,
    )  # fmt: skip
    return await _answer(handle, new)


@router.post(
    "/customagents/run/stream",
    response_class=EventSourceResponse,
    responses=_SSE,
    summary="Execute a custom agent, streaming its KML",
)
async def stream_custom(
    request: Request,
    body: CustomRunBody,
    who: Auth,
    idem: IdemHeader = None,
    last_event_id: LastEventHeader = None,
) -> EventSourceResponse:
    data = body.model_dump(exclude_none=True)
    handle, _ = await _start(
        request, who, agent="custom", custom_agent_id=body.agentId, body=data,
        route="customagents/run", idem=idem,
    )  # fmt: skip
    return _sse(handle, last_event_id)


RunPath = Annotated[str, Path(pattern=RUN_ID)]


@router.get("/runs/{run_id}", response_model=RunResult, responses=_RUN, summary="A run's result")
async def get_run(request: Request, run_id: RunPath, who: Auth) -> JSONResponse:
    handle = await app_state(request).runs.handle_of(who.project_id, run_id)
    return await _answer(handle, True)


@router.get(
    "/runs/{run_id}/stream",
    response_class=EventSourceResponse,
    responses=_SSE,
    summary="Join (or re-join) a run's stream",
)
async def join_run(
    request: Request, run_id: RunPath, who: Auth, last_event_id: LastEventHeader = None
) -> EventSourceResponse:
    handle = await app_state(request).runs.handle_of(who.project_id, run_id)
    return _sse(handle, last_event_id)


def _position(last_event_id: str | None) -> tuple[int, int] | None:
    """(attempt, offset) after the given event id; None when the stream had ended."""
    if not last_event_id:
        return (0, 0)
    value = last_event_id.strip()
    if value == "end":
        return None
    m = re.fullmatch(r"(\d{1,3}):(\d{1,9})", value)
    if not m:
        raise ApiError(
            400, "invalid_request", "Last-Event-ID must be an id this stream sent (n:offset)"
        )
    return int(m.group(1)), int(m.group(2))


def _sse(handle: RunHandle, last_event_id: str | None) -> EventSourceResponse:
    position = _position(last_event_id)

    async def events() -> AsyncIterator[ServerSentEvent]:
        # The run lives in its own task: this generator only watches it, and being cancelled
        # (the client went away) cancels nothing but the watching.
        if position is None:
            return
        attempt, offset = position
        while True:
            changed = handle.changed()  # taken before emitting: a change meanwhile is not missed
            while attempt < len(handle.texts):
                text = handle.texts[attempt]
                if offset < len(text):
                    yield ServerSentEvent(
                        json.dumps({"text": text[offset:]}),
                        event="chunk",
                        id=f"{attempt}:{len(text)}",
                    )
                    offset = len(text)
                if attempt + 1 < len(handle.texts):
                    attempt, offset = attempt + 1, 0
                    yield ServerSentEvent(
                        json.dumps({"attempt": attempt, "reason": handle.reason(attempt)}),
                        event="attempt",
                        id=f"{attempt}:0",
                    )
                else:
                    break
            if handle.done:
                assert handle.body is not None
                kind = "complete" if handle.status == 200 else "error"
                yield ServerSentEvent(json.dumps(handle.body), event=kind, id="end")
                return
            await changed.wait()

    return EventSourceResponse(events(), ping=15, headers={"X-Run-Id": handle.id})


# --------------------------------------------------------------------------- custom agents


@router.get(
    "/customagents",
    response_model=list[CustomAgent],
    responses=_COMMON,
    summary="List custom agents",
)
async def list_custom(request: Request, who: Auth) -> list[CustomAgent]:
    state = app_state(request)
    return await asyncio.to_thread(
        state.db.read, lambda c: custom_agents.list_agents(c, who.project_id)
    )


@router.post(
    "/customagents",
    response_model=CustomAgent,
    status_code=201,
    responses=_COMMON,
    summary="Create a custom agent",
)
async def create_custom(request: Request, body: CustomAgentCreate, who: Auth) -> CustomAgent:
    state = app_state(request)
    return await asyncio.to_thread(
        state.db.write, lambda c: custom_agents.create_agent(c, who.project_id, body)
    )


AgentIdPath = Annotated[str, Path(pattern=CUSTOM_AGENT_ID)]


def _owned(conn: Connection, project_id: str, agent_id: str) -> Any:
    row = custom_agents.find_agent(conn, project_id, agent_id)
    if row is None:
        raise custom_agents.agent_not_found(agent_id)
    return row


@router.get(
    "/customagents/{agent_id}",
    response_model=CustomAgent,
    responses=_COMMON,
    summary="A custom agent",
)
async def get_custom(request: Request, agent_id: AgentIdPath, who: Auth) -> CustomAgent:
    state = app_state(request)
    row = await asyncio.to_thread(state.db.read, lambda c: _owned(c, who.project_id, agent_id))
    return custom_agents.agent_out(row)


@router.patch(
    "/customagents/{agent_id}",
    response_model=CustomAgent,
    responses=_COMMON,
    summary="Change a custom agent",
)
async def patch_custom(
    request: Request, agent_id: AgentIdPath, body: CustomAgentPatch, who: Auth
) -> CustomAgent:
    state = app_state(request)
    agent = await asyncio.to_thread(
        state.db.write, lambda c: custom_agents.update_agent(c, who.project_id, agent_id, body)
    )
    if agent is None:
        raise custom_agents.agent_not_found(agent_id)
    return agent


@router.delete(
    "/customagents/{agent_id}",
    response_model=CustomAgentDeleted,
    responses=_COMMON,
    summary="Delete a custom agent",
)
async def delete_custom(request: Request, agent_id: AgentIdPath, who: Auth) -> CustomAgentDeleted:
    state = app_state(request)
    deleted = await asyncio.to_thread(
        state.db.write, lambda c: custom_agents.delete_agent(c, who.project_id, agent_id)
    )
    if not deleted:
        raise custom_agents.agent_not_found(agent_id)
    return CustomAgentDeleted(id=agent_id, deleted=True)


# --------------------------------------------------------------------------- sessions


@router.post(
    "/sessions",
    response_model=SessionCreated,
    status_code=201,
    responses=_COMMON,
    summary="Create a session",
)
async def create_session(
    request: Request, who: Auth, body: SessionBody | None = None
) -> SessionCreated:
    state = app_state(request)
    body = body or SessionBody()
    project_id = _project(who, body.projectId)
    agent = body.agent or "coding"
    _check_agent(agent)

    def tx(conn: Connection) -> str:
        if body.customAgentId is not None:
            _owned(conn, project_id, body.customAgentId)
        return sessions.create(conn, project_id, agent, body.customAgentId)

    session_id = await asyncio.to_thread(state.db.write, tx)
    return SessionCreated(id=session_id, agentId=body.customAgentId or agent)


SessionPath = Annotated[str, Path(pattern=SESSION_ID)]


async def _session_view(request: Request, who: Principal, session_id: str) -> SessionView:
    state = app_state(request)

    row = await asyncio.to_thread(
        state.db.read, lambda c: sessions.find(c, who.project_id, session_id)
    )
    if row is None:
        raise not_found("session", session_id)

    def history() -> list[dict[str, Any]]:
        try:
            return sessions.chat_of(state.store.load(session_id).events)
        except SessionNotFoundError:
            return []

    chat = await asyncio.to_thread(history)
    return SessionView(
        id=row.id,
        agentId=row.custom_agent_id or row.agent,
        chat=[ChatMessage(**m) for m in chat],
    )


@router.get(
    "/sessions/{session_id}",
    response_model=SessionView,
    response_model_exclude_none=True,
    responses=_COMMON,
    summary="Fetch session history",
)
async def get_session(request: Request, session_id: SessionPath, who: Auth) -> SessionView:
    return await _session_view(request, who, session_id)


@router.post(
    "/sessions/{session_id}",
    response_model=SessionView,
    response_model_exclude_none=True,
    responses=_COMMON,
    summary="Fetch session history (the document's verb)",
)
async def post_session(request: Request, session_id: SessionPath, who: Auth) -> SessionView:
    return await _session_view(request, who, session_id)


# --------------------------------------------------------------------------- credits


@router.get(
    "/credits", response_model=CreditsInfo, responses=_COMMON, summary="The project's credits"
)
async def credits(request: Request, who: Auth) -> CreditsInfo:
    state = app_state(request)

    def load(conn: Connection) -> tuple[int, int]:
        return billing.balance(conn, who.project_id), billing.held(conn, who.project_id)

    balance, held = await asyncio.to_thread(state.db.read, load)
    return CreditsInfo(projectId=who.project_id, credits=to_credits(balance), held=to_credits(held))


def install_health(app: FastAPI) -> None:
    """``GET /healthz``: 200 while serving, 503 once draining (for a load balancer)."""

    @app.get("/healthz", include_in_schema=False)
    async def healthz(request: Request) -> JSONResponse:
        state = app_state(request)
        return JSONResponse(
            {"ok": not state.draining, "draining": state.draining, "running": state.runs.running},
            status_code=503 if state.draining else 200,
        )
