"""Custom agents, stored: the one implementation the API (``/api/customagents``) and the
dashboard (My Agents) both use.

A custom agent belongs to one project; its id is a 64-hex hash (the document's ``Agent ID``).
Its tools are a JSON list of ``{name, description, params, disabled}`` (validated by
:class:`kyronix.server.schemas.CustomTool` before anything is stored). Every function takes the
caller's connection and transaction; an agent of another project is None here, exactly as one
that does not exist.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

from sqlalchemy import Connection, delete, select, update

from kyronix.server.agents import Persona, builtin_persona, custom_persona
from kyronix.server.db import custom_agents, now_ms
from kyronix.server.errors import ApiError
from kyronix.server.schemas import CustomAgent, CustomAgentCreate, CustomAgentPatch, CustomTool

__all__ = [
    "agent_not_found",
    "agent_out",
    "create_agent",
    "delete_agent",
    "find_agent",
    "get_agent",
    "list_agents",
    "new_agent_id",
    "persona_of",
    "toggle_tool",
    "tools_json",
    "update_agent",
]


def agent_not_found(agent_id: str) -> ApiError:
    return ApiError(404, "agent_not_found", f"no custom agent {agent_id!r} in this project")


def persona_of(conn: Connection, project_id: str, agent: str, custom: str | None) -> Persona:
    """The persona of a built-in agent, or of the project's custom agent ``custom`` (404
    ``agent_not_found`` when the project has none of that id)."""
    if custom is None:
        return builtin_persona(agent)
    row = find_agent(conn, project_id, custom)
    if row is None:
        raise agent_not_found(custom)
    return custom_persona(row.id, row.name, row.description, json.loads(row.tools))


def agent_out(row: Any) -> CustomAgent:
    """A stored row as the API's shape."""
    return CustomAgent(
        id=row.id,
        name=row.name,
        description=row.description,
        tools=[CustomTool(**t) for t in json.loads(row.tools)],
    )


def tools_json(tools: list[CustomTool]) -> str:
    return json.dumps([t.model_dump() for t in tools])


def new_agent_id(project_id: str) -> str:
    return hashlib.sha256(f"{project_id}:{secrets.token_hex(16)}".encode()).hexdigest()


def find_agent(conn: Connection, project_id: str, agent_id: str) -> Any | None:
    """The stored row of the project's agent, or None (no such agent in this project)."""
    return conn.execute(
        select(custom_agents).where(
            (custom_agents.c.id == agent_id) & (custom_agents.c.project_id == project_id)
        )
    ).first()


def get_agent(conn: Connection, project_id: str, agent_id: str) -> CustomAgent | None:
    row = find_agent(conn, project_id, agent_id)
    return agent_out(row) if row is not None else None


def list_agents(conn: Connection, project_id: str) -> list[CustomAgent]:
    rows = conn.execute(
        select(custom_agents)
        .where(custom_agents.c.project_id == project_id)
        .order_by(custom_agents.c.created_at, custom_agents.c.id)
    )
    return [agent_out(r) for r in rows]


def _reload(conn: Connection, agent_id: str) -> CustomAgent:
    row = conn.execute(select(custom_agents).where(custom_agents.c.id == agent_id)).one()
    return agent_out(row)


def create_agent(conn: Connection, project_id: str, spec: CustomAgentCreate) -> CustomAgent:
    agent_id = new_agent_id(project_id)
    at = now_ms()
    conn.execute(
        custom_agents.insert().values(
            id=agent_id,
            project_id=project_id,
            name=spec.name,
            description=spec.description,
            tools=tools_json(spec.tools),
            created_at=at,
            updated_at=at,
        )
    )
    return _reload(conn, agent_id)


def update_agent(
    conn: Connection, project_id: str, agent_id: str, patch: CustomAgentPatch
) -> CustomAgent | None:
    """The agent changed as ``patch`` says (a field left None is kept); None: no such agent."""
    if find_agent(conn, project_id, agent_id) is None:
        return None
    changes: dict[str, Any] = {}
    if patch.name is not None:
        changes["name"] = patch.name
    if patch.description is not None:
        changes["description"] = patch.description
    if patch.tools is not None:
        changes["tools"] = tools_json(patch.tools)
    if changes:
        conn.execute(
            update(custom_agents)
            .where(custom_agents.c.id == agent_id)
            .values(**changes, updated_at=now_ms())
        )
    return _reload(conn, agent_id)


def toggle_tool(conn: Connection, project_id: str, agent_id: str, tool: str) -> CustomAgent | None:
    """Disable the agent's tool ``tool`` if it is enabled, enable it if not; None when the agent
    or the tool does not exist."""
    agent = get_agent(conn, project_id, agent_id)
    if agent is None or all(t.name != tool for t in agent.tools):
        return None
    tools = [
        t.model_copy(update={"disabled": not t.disabled}) if t.name == tool else t
        for t in agent.tools
    ]
    return update_agent(conn, project_id, agent_id, CustomAgentPatch(tools=tools))


def delete_agent(conn: Connection, project_id: str, agent_id: str) -> bool:
    """Delete the project's agent; False when there is no such agent in this project."""
    if find_agent(conn, project_id, agent_id) is None:
        return False
    conn.execute(delete(custom_agents).where(custom_agents.c.id == agent_id))
    return True
