"""The dashboard's pages: projects, Project Settings (API keys), My Agents (custom agents),
Usage (credits, the ledger, each run's tokens and charge, spend per day) and Sessions (each
session's timeline and its raw kiso log).

Every route is a :func:`~kyronix.server.dashboard.web.page`; every project route checks that the
signed-in user is a member of the project (another user's project is the 404 page of no
project, on every route); every POST goes through :func:`form_data` (its CSRF token checked
before anything is read or changed) and answers a redirect (303) when it succeeded, or the page
again with the problem shown (400) when it did not. A new API key is shown once, in the answer
to the POST that made it, and never stored, logged or shown again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from markupsafe import Markup
from pydantic import ValidationError
from sqlalchemy import Connection
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from kiso.kernel import SessionNotFoundError
from kiso.kernel.events import dumps_line
from kyronix.errors import KyronixUsageError
from kyronix.server import accounts, billing, custom_agents, sessions
from kyronix.server.accounts import Project
from kyronix.server.dashboard.chart import DAY_MS, daily_spend, spend_svg
from kyronix.server.dashboard.timeline import timeline
from kyronix.server.dashboard.web import (
    PageError,
    form_data,
    page,
    read,
    render,
    require_project,
    require_user,
    state_of,
    write,
)
from kyronix.server.db import now_ms
from kyronix.server.runs import records
from kyronix.server.schemas import CustomAgentCreate, CustomAgentPatch
from kyronix.server.users import User, create_project_for, projects_of

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

PROJECT = "/dashboard/projects/{project_id}"
SHOWN = 200
"""Rows shown in a long table (the newest first)."""
CHART_DAYS = 14
TOOL_ROWS = 3
"""Empty Custom Tools rows on a new agent's form."""
MAX_TOOL_ROWS = 64
KEY_NAME_MAX = 128
ONCE_PER_ACCOUNT = (
    "The free credits come once per account, with its first project; the operator of this "
    "server grants more (kyronix credits grant {project_id} N)."
)


# --------------------------------------------------------------------------- helpers


def _see(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def _flash(request: Request, notice: str) -> None:
    """A notice for the next page (after the redirect of a successful POST)."""
    request.session["notice"] = notice


def _not_found(what: str) -> PageError:
    return PageError(404, "Not found", f"there is no such {what} in this project")


async def _show(
    request: Request,
    template: str,
    context: dict[str, Any],
    *,
    user: User,
    project: Project | None = None,
    status: int = 200,
) -> HTMLResponse:
    notice = request.session.pop("notice", None)
    if isinstance(notice, str) and "notice" not in context:
        context["notice"] = notice
    return await render(request, template, context, status=status, user=user, project=project)


async def _member(request: Request, project_id: str) -> tuple[User, Project]:
    """The signed-in user and their project (a 404 page if it is not theirs); it becomes the
    current project."""
    user = await require_user(request)
    project = await require_project(request, user, project_id)
    request.session["project_id"] = project.id
    return user, project


def _validation_problem(exc: ValidationError) -> str:
    """A validation error in the words of the form's fields."""
    names = {"name": "Agent Name", "description": "Description", "tools": "Custom Tools"}
    tool_fields = {"name": "Tool Name", "description": "Tool Description", "params": "Parameters"}
    said = []
    for error in exc.errors():
        loc = error.get("loc", ())
        where = names.get(str(loc[0]), str(loc[0])) if loc else "the form"
        if len(loc) >= 3 and loc[0] == "tools" and isinstance(loc[1], int):
            where = f"tool {loc[1] + 1}: {tool_fields.get(str(loc[2]), str(loc[2]))}"
        message = str(error.get("msg", "is invalid"))
        if "pattern" in message:
            message = (
                "use letters, digits, '_', '.' or '-', starting with a letter or '_' (no spaces)"
            )
        message = message.removeprefix("Value error, ")
        said.append(f"{where}: {message}")
    return "; ".join(said) or "the form is invalid"


# --------------------------------------------------------------------------- projects


@router.get("/dashboard")
@page
async def home(request: Request) -> Response:
    user = await require_user(request)
    mine = await read(request, lambda c: projects_of(c, user.id))
    if not mine:
        return _see("/dashboard/projects")
    current = request.session.get("project_id")
    chosen = next((p for p in mine if p.id == current), mine[0])
    return _see(f"/dashboard/projects/{chosen.id}/agents")


async def _projects_page(
    request: Request, user: User, *, status: int = 200, **context: Any
) -> HTMLResponse:
    mine = await read(request, lambda c: projects_of(c, user.id))
    current = request.session.get("project_id")
    project = next((p for p in mine if p.id == current), None)
    context.setdefault("name", "")
    return await _show(
        request,
        "projects.html",
        {"section": "projects", "mine": mine, **context},
        user=user,
        project=project,
        status=status,
    )


@router.get("/dashboard/projects")
@page
async def projects_page(request: Request) -> Response:
    user = await require_user(request)
    return await _projects_page(request, user)


@router.post("/dashboard/projects")
@page
async def create_project(request: Request) -> Response:
    user = await require_user(request)
    form = await form_data(request)
    name = form.get("name", "").strip()
    credits = state_of(request).config.initial_credits
    try:
        project = await write(request, lambda c: create_project_for(c, user, name, credits))
    except KyronixUsageError as exc:
        return await _projects_page(request, user, status=400, problem=str(exc), name=name)
    request.session["project_id"] = project.id
    said = f"Project {project.name} created with {project.credits / 1000:g} credits."
    if not project.credits:  # the account's free credits went to its first project
        said += " " + ONCE_PER_ACCOUNT.format(project_id=project.id)
    _flash(request, said)
    return _see(f"/dashboard/projects/{project.id}/agents")


@router.post("/dashboard/select")
@page
async def select_project(request: Request) -> Response:
    user = await require_user(request)
    form = await form_data(request)
    project = await require_project(request, user, form.get("project_id", ""))
    request.session["project_id"] = project.id
    return _see(f"/dashboard/projects/{project.id}/agents")


@router.get(PROJECT)
@page
async def project_home(request: Request, project_id: str) -> Response:
    _, project = await _member(request, project_id)
    return _see(f"/dashboard/projects/{project.id}/agents")


@router.post(PROJECT + "/rename")
@page
async def rename(request: Request, project_id: str) -> Response:
    user, project = await _member(request, project_id)
    form = await form_data(request)
    name = form.get("name", "").strip()
    try:
        await write(request, lambda c: accounts.rename_project(c, project.id, name))
    except KyronixUsageError as exc:
        return await _settings_page(request, user, project, status=400, problem=str(exc))
    _flash(request, f"The project is now named {name}.")
    return _see(f"/dashboard/projects/{project.id}/settings")


# --------------------------------------------------------------------------- settings and keys


async def _settings_page(
    request: Request, user: User, project: Project, *, status: int = 200, **context: Any
) -> HTMLResponse:
    keys = await read(request, lambda c: accounts.list_keys(c, project.id))
    return await _show(
        request,
        "settings.html",
        {"section": "settings", "keys": keys[::-1], **context},
        user=user,
        project=project,
        status=status,
    )


@router.get(PROJECT + "/settings")
@page
async def settings(request: Request, project_id: str) -> Response:
    user, project = await _member(request, project_id)
    return await _settings_page(request, user, project)


@router.post(PROJECT + "/keys")
@page
async def create_key(request: Request, project_id: str) -> Response:
    user, project = await _member(request, project_id)
    form = await form_data(request)
    name = form.get("name", "").strip() or None
    if name is not None and len(name) > KEY_NAME_MAX:
        return await _settings_page(
            request, user, project, status=400,
            problem=f"a key's name is at most {KEY_NAME_MAX} characters",
        )  # fmt: skip
    secret = state_of(request).secret
    raw, info = await write(request, lambda c: accounts.create_key(c, secret, project.id, name))
    return await _settings_page(
        request, user, project, status=201, new_key=raw, new_info=info,
        notice=f"API key {info.prefix}… created.",
    )  # fmt: skip


@router.post(PROJECT + "/keys/{key_id}/revoke")
@page
async def revoke_key(request: Request, project_id: str, key_id: str) -> Response:
    _, project = await _member(request, project_id)
    await form_data(request)

    def tx(conn: Connection) -> accounts.KeyInfo | None:
        if all(k.id != key_id for k in accounts.list_keys(conn, project.id)):
            return None  # only a key of this project
        return accounts.revoke_key(conn, key_id)

    info = await write(request, tx)
    if info is None:
        raise _not_found("API key")
    _flash(request, f"API key {info.prefix}… revoked: it is refused from now on.")
    return _see(f"/dashboard/projects/{project.id}/settings")


# --------------------------------------------------------------------------- custom agents


def _tool_rows(form: dict[str, str], count: int) -> list[dict[str, Any]]:
    rows = []
    for n in range(count):
        rows.append(
            {
                "name": form.get(f"tool-{n}-name", "").strip(),
                "description": form.get(f"tool-{n}-description", "").strip(),
                "params": form.get(f"tool-{n}-params", "").strip(),
                "disabled": form.get(f"tool-{n}-disabled") == "on",
            }
        )
    return rows


def _row_count(form: dict[str, str]) -> int:
    try:
        count = int(form.get("rows", str(TOOL_ROWS)))
    except ValueError:
        count = TOOL_ROWS
    return max(1, min(count, MAX_TOOL_ROWS))


def _spec(name: str, description: str, rows: list[dict[str, Any]]) -> CustomAgentCreate:
    """The form's agent, validated by the API's own schema (a ValidationError otherwise)."""
    tools = []
    for n, row in enumerate(rows):
        if not (row["name"] or row["description"] or row["params"]):
            continue  # an empty row
        if not row["name"]:
            raise KyronixUsageError(f"tool {n + 1}: Tool Name is required")
        params = [p.strip() for p in row["params"].split(",") if p.strip()]
        tools.append(
            {
                "name": row["name"],
                "description": row["description"],
                "params": params,
                "disabled": bool(row["disabled"]),
            }
        )
    return CustomAgentCreate.model_validate(
        {"name": name, "description": description, "tools": tools}
    )


def _rows_of(agent: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": t.name,
            "description": t.description,
            "params": ", ".join(t.params),
            "disabled": t.disabled,
        }
        for t in agent.tools
    ]


async def _agent_form(
    request: Request,
    user: User,
    project: Project,
    *,
    agent: Any = None,
    name: str = "",
    description: str = "",
    rows: list[dict[str, Any]] | None = None,
    status: int = 200,
    **context: Any,
) -> HTMLResponse:
    rows = list(rows or [])
    empty = {"name": "", "description": "", "params": "", "disabled": False}
    minimum = TOOL_ROWS if agent is None else 1
    while len(rows) < minimum:
        rows.append(dict(empty))
    return await _show(
        request,
        "agent_form.html" if agent is None else "agent.html",
        {
            "section": "agents", "agent": agent, "name": name, "description": description,
            "rows": rows, **context,
        },
        user=user, project=project, status=status,
    )  # fmt: skip


@router.get(PROJECT + "/agents")
@page
async def agents_page(request: Request, project_id: str) -> Response:
    user, project = await _member(request, project_id)
    agents = await read(request, lambda c: custom_agents.list_agents(c, project.id))
    return await _show(
        request, "agents.html", {"section": "agents", "agents": agents}, user=user, project=project
    )


@router.get(PROJECT + "/agents/new")
@page
async def new_agent(request: Request, project_id: str) -> Response:
    user, project = await _member(request, project_id)
    return await _agent_form(request, user, project)


async def _posted_agent(
    request: Request, project_id: str
) -> tuple[User, Project, dict[str, str], list[dict[str, Any]]]:
    user, project = await _member(request, project_id)
    form = await form_data(request)
    rows = _tool_rows(form, _row_count(form))
    return user, project, form, rows


@router.post(PROJECT + "/agents")
@page
async def create_agent(request: Request, project_id: str) -> Response:
    user, project, form, rows = await _posted_agent(request, project_id)
    name, description = form.get("name", "").strip(), form.get("description", "").strip()
    if form.get("action") == "add_tool":
        rows.append({"name": "", "description": "", "params": "", "disabled": False})
        return await _agent_form(
            request, user, project, name=name, description=description, rows=rows,
            focus=len(rows) - 1,
        )  # fmt: skip
    try:
        spec = _spec(name, description, rows)
    except (ValidationError, KyronixUsageError) as exc:
        problem = _validation_problem(exc) if isinstance(exc, ValidationError) else str(exc)
        return await _agent_form(
            request, user, project, name=name, description=description, rows=rows,
            status=400, problem=problem,
        )  # fmt: skip
    agent = await write(request, lambda c: custom_agents.create_agent(c, project.id, spec))
    _flash(request, f"Agent {agent.name} saved. Copy its Agent ID to run it with your API key.")
    return _see(f"/dashboard/projects/{project.id}/agents/{agent.id}")


async def _agent(request: Request, project: Project, agent_id: str) -> Any:
    agent = await read(request, lambda c: custom_agents.get_agent(c, project.id, agent_id))
    if agent is None:
        raise _not_found("agent")
    return agent


@router.get(PROJECT + "/agents/{agent_id}")
@page
async def agent_page(request: Request, project_id: str, agent_id: str) -> Response:
    user, project = await _member(request, project_id)
    agent = await _agent(request, project, agent_id)
    return await _agent_form(
        request, user, project, agent=agent, name=agent.name, description=agent.description,
        rows=[*_rows_of(agent), {"name": "", "description": "", "params": "", "disabled": False}],
    )  # fmt: skip


@router.post(PROJECT + "/agents/{agent_id}")
@page
async def update_agent(request: Request, project_id: str, agent_id: str) -> Response:
    user, project, form, rows = await _posted_agent(request, project_id)
    agent = await _agent(request, project, agent_id)
    name, description = form.get("name", "").strip(), form.get("description", "").strip()
    if form.get("action") == "add_tool":
        rows.append({"name": "", "description": "", "params": "", "disabled": False})
        return await _agent_form(
            request, user, project, agent=agent, name=name, description=description, rows=rows,
            focus=len(rows) - 1,
        )  # fmt: skip
    try:
        spec = _spec(name, description, rows)
    except (ValidationError, KyronixUsageError) as exc:
        problem = _validation_problem(exc) if isinstance(exc, ValidationError) else str(exc)
        return await _agent_form(
            request, user, project, agent=agent, name=name, description=description, rows=rows,
            status=400, problem=problem,
        )  # fmt: skip
    patch = CustomAgentPatch(name=spec.name, description=spec.description, tools=spec.tools)
    changed = await write(
        request, lambda c: custom_agents.update_agent(c, project.id, agent_id, patch)
    )
    if changed is None:
        raise _not_found("agent")
    _flash(request, f"Agent {changed.name} saved.")
    return _see(f"/dashboard/projects/{project.id}/agents/{agent_id}")


@router.post(PROJECT + "/agents/{agent_id}/tools/{tool}/toggle")
@page
async def toggle_tool(request: Request, project_id: str, agent_id: str, tool: str) -> Response:
    _, project = await _member(request, project_id)
    await form_data(request)
    agent = await write(request, lambda c: custom_agents.toggle_tool(c, project.id, agent_id, tool))
    if agent is None:
        raise _not_found("agent or tool")
    state = next(("disabled" if t.disabled else "enabled") for t in agent.tools if t.name == tool)
    _flash(request, f"Tool {tool} {state}.")
    return _see(f"/dashboard/projects/{project.id}/agents/{agent_id}")


@router.get(PROJECT + "/agents/{agent_id}/delete")
@page
async def confirm_delete(request: Request, project_id: str, agent_id: str) -> Response:
    user, project = await _member(request, project_id)
    agent = await _agent(request, project, agent_id)
    return await _show(
        request, "agent_delete.html", {"section": "agents", "agent": agent},
        user=user, project=project,
    )  # fmt: skip


@router.post(PROJECT + "/agents/{agent_id}/delete")
@page
async def delete_agent(request: Request, project_id: str, agent_id: str) -> Response:
    _, project = await _member(request, project_id)
    await form_data(request)
    agent = await _agent(request, project, agent_id)
    deleted = await write(request, lambda c: custom_agents.delete_agent(c, project.id, agent_id))
    if not deleted:
        raise _not_found("agent")
    _flash(request, f"Agent {agent.name} deleted; its Agent ID no longer runs.")
    return _see(f"/dashboard/projects/{project.id}/agents")


# --------------------------------------------------------------------------- usage


def _usage(conn: Connection, project_id: str, since: int) -> dict[str, Any]:
    return {
        "balance": billing.balance(conn, project_id),
        "held": billing.held(conn, project_id),
        "entries": billing.entries(conn, project_id, newest=SHOWN),
        "recent": billing.changes_since(conn, project_id, since),
        "runs": records.page(conn, project_id, limit=SHOWN),
        "totals": records.totals(conn, project_id),
    }


@router.get(PROJECT + "/usage")
@page
async def usage(request: Request, project_id: str) -> Response:
    user, project = await _member(request, project_id)
    today = now_ms()
    since = today - (CHART_DAYS + 1) * DAY_MS
    data = await read(request, lambda c: _usage(c, project.id, since))
    series = daily_spend(data.pop("recent"), today_ms=today, days=CHART_DAYS)
    # Markup: the SVG is built by chart.py, which escapes every text in it
    chart = Markup(spend_svg(series, title=f"Spend per day, last {CHART_DAYS} days"))
    return await _show(
        request, "usage.html", {"section": "usage", "series": series, "chart": chart, **data},
        user=user, project=project,
    )  # fmt: skip


# --------------------------------------------------------------------------- sessions


@router.get(PROJECT + "/sessions")
@page
async def sessions_page(request: Request, project_id: str) -> Response:
    user, project = await _member(request, project_id)
    rows = await read(request, lambda c: sessions.page(c, project.id, SHOWN))
    return await _show(
        request, "sessions.html", {"section": "sessions", "sessions": rows},
        user=user, project=project,
    )  # fmt: skip


async def _session(request: Request, project: Project, session_id: str) -> Any:
    """The project's session row (a 404 page for a session of another project)."""

    row = await read(request, lambda c: sessions.view(c, project.id, session_id))
    if row is None:
        raise _not_found("session")
    return row


async def _log(request: Request, session_id: str) -> Any:
    store = state_of(request).store
    try:
        return await asyncio.to_thread(store.load, session_id)
    except SessionNotFoundError:
        return None  # made, never run: nothing logged yet


@router.get(PROJECT + "/sessions/{session_id}")
@page
async def session_page(request: Request, project_id: str, session_id: str) -> Response:
    user, project = await _member(request, project_id)
    row = await _session(request, project, session_id)

    def load(conn: Connection) -> tuple[dict[str, str], list[Any]]:
        issued = records.issued_in(conn, project.id, session_id)
        return issued, records.page(conn, project.id, session_id=session_id)

    issued, run_rows = await read(request, load)
    log = await _log(request, session_id)
    entries = timeline(log.events, issued) if log is not None else []
    return await _show(
        request, "session.html",
        {"section": "sessions", "session": row, "entries": entries, "runs": run_rows},
        user=user, project=project,
    )  # fmt: skip


@router.get(PROJECT + "/sessions/{session_id}/log.jsonl")
@page
async def session_log(request: Request, project_id: str, session_id: str) -> Response:
    _, project = await _member(request, project_id)
    row = await _session(request, project, session_id)
    log = await _log(request, session_id)
    if log is None:
        raise PageError(404, "No log yet", "this session has not run yet: it has no log")
    body = dumps_line(log.header.to_json()) + b"".join(dumps_line(e.to_json()) for e in log.events)
    return Response(
        body,
        media_type="application/jsonl",
        headers={
            "content-disposition": f'attachment; filename="{row.id}.jsonl"',
            "cache-control": "no-store",
            "x-content-type-options": "nosniff",
        },
    )
