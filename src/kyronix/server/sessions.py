"""Kyronix sessions: the ``kx_sessions`` rows, and the chat a session's kiso log projects to.

A Kyronix session *is* a kiso session (the same id): its events live in the server's database
through the kernel's SQL store. ``kx_sessions`` adds what the platform needs around it: the
project it belongs to, its agent (built-in or custom), and ``active_run``, the one run it may
have at a time (set by a conditional update: a second concurrent run is ``session_busy``). This
module is the only one that writes those rows.

What a Kyronix run leaves in the kiso log, besides the model's own events:

* ``setting_changed`` :data:`RESULT_KEY` (``kyronix.result``): a run's outcome (its KML, the
  execution ids, the cost, or why it failed);
* ``setting_changed`` :data:`RESULTS_KEY` (``kyronix.results``): what an executer answered for
  the session's plan (``{requestId, results}``), put in front of the session's next input.

:func:`chat_of` is the document's ``chat``: a pure function of those events.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update

from kiso.kernel import Event, RunStarted, SettingChanged, TextBlock, User
from kyronix.server.agents import RESULTS_HEADER, asked_text
from kyronix.server.db import custom_agents, now_ms, runs, sessions

__all__ = [
    "RESULTS_KEY",
    "RESULT_KEY",
    "chat_of",
    "claim",
    "create",
    "find",
    "free",
    "new_session_id",
    "page",
    "results_text",
    "view",
    "with_results",
]

RESULT_KEY = "kyronix.result"
"""The ``setting_changed`` key that records a Kyronix run's outcome in its kiso session."""
RESULTS_KEY = "kyronix.results"
"""The ``setting_changed`` key that records what an executer answered for the session's plan
(``{"requestId", "results"}``): shown to the model with the session's next input."""
SHOWN_RESULT_CHARS = 2000
"""How much of one tool's output the model is shown with the next input."""

_FIND = select(sessions).where(
    (sessions.c.id == bindparam("b_session")) & (sessions.c.project_id == bindparam("b_project"))
)
_INSERT = sessions.insert()
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


# --------------------------------------------------------------------------- rows


def new_session_id() -> str:
    return f"sess_{secrets.token_hex(12)}"


def find(conn: Connection, project_id: str, session_id: str) -> Any | None:
    """The project's session row (None for a session of another project: it does not exist)."""
    return conn.execute(_FIND, {"b_session": session_id, "b_project": project_id}).first()


def create(
    conn: Connection,
    project_id: str,
    agent: str,
    custom_agent_id: str | None = None,
    *,
    session_id: str | None = None,
    active_run: str | None = None,
) -> str:
    """A new session of the project (already running ``active_run`` when a run makes it)."""
    sid = session_id or new_session_id()
    conn.execute(
        _INSERT,
        {
            "id": sid,
            "project_id": project_id,
            "agent": agent,
            "custom_agent_id": custom_agent_id,
            "created_at": now_ms(),
            "active_run": active_run,
        },
    )
    return sid


def claim(conn: Connection, session_id: str, run_id: str) -> bool:
    """Make ``run_id`` the session's active run; False when it already has one."""
    return bool(conn.execute(_CLAIM, {"b_session": session_id, "b_run": run_id}).rowcount == 1)


def free(conn: Connection, session_id: str, run_id: str) -> None:
    """The session's active run ended (only if it is still that run)."""
    conn.execute(_FREE, {"b_session": session_id, "b_run": run_id})


def page(conn: Connection, project_id: str, limit: int) -> list[Any]:
    """The project's newest sessions, with their agent's name, how many runs each had and the
    status of the last one (the dashboard's list)."""
    count = (
        select(func.count()).select_from(runs).where(runs.c.session_id == sessions.c.id)
    ).scalar_subquery()
    last = (
        select(runs.c.status)
        .where(runs.c.session_id == sessions.c.id)
        .order_by(runs.c.created_at.desc(), runs.c.id.desc())
        .limit(1)
    ).scalar_subquery()
    return list(
        conn.execute(
            select(
                sessions,
                custom_agents.c.name.label("agent_name"),
                count.label("runs"),
                last.label("last_status"),
            )
            .outerjoin(custom_agents, custom_agents.c.id == sessions.c.custom_agent_id)
            .where(sessions.c.project_id == project_id)
            .order_by(sessions.c.created_at.desc(), sessions.c.id.desc())
            .limit(limit)
        )
    )


def view(conn: Connection, project_id: str, session_id: str) -> Any | None:
    """The project's session row with its custom agent's name (``agent_name``)."""
    return conn.execute(
        select(sessions, custom_agents.c.name.label("agent_name"))
        .outerjoin(custom_agents, custom_agents.c.id == sessions.c.custom_agent_id)
        .where((sessions.c.id == session_id) & (sessions.c.project_id == project_id))
    ).first()


# --------------------------------------------------------------------------- the chat


def chat_of(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The document's ``chat``: the user inputs and the recorded answers, in order."""
    out: list[dict[str, Any]] = []
    for ev in events:
        if isinstance(ev, User) and ev.source == "user":
            out.append({"role": "user", "content": asked(ev)})
        elif (
            isinstance(ev, SettingChanged) and ev.key == RESULTS_KEY and isinstance(ev.value, dict)
        ):
            out.append(
                {
                    "role": "tool",
                    "content": results_text(ev.value.get("results") or []),
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


def asked(ev: User) -> str:
    """What the user asked: the input without the tool results put in front of it."""
    return ev.content if isinstance(ev.content, str) else asked_text(ev.content)


def results_text(results: Sequence[Any]) -> str:
    """Tool results as the model is shown them: one line each, its output cut to
    :data:`SHOWN_RESULT_CHARS`."""
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
        if len(text) > SHOWN_RESULT_CHARS:
            more = len(text) - SHOWN_RESULT_CHARS
            text = text[:SHOWN_RESULT_CHARS] + f"… ({more} more characters)"
        lines.append(
            f"- {entry.get('tool')} ({result.get('executionId')}): {state}"
            + (f"\n  {text}" if text else "")
        )
    return "\n".join(lines) or "- (no tools ran)"


def unseen_results(events: Sequence[Event]) -> list[dict[str, Any]]:
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


def with_results(text: str, events: Sequence[Event]) -> str | tuple[TextBlock, ...]:
    """The run's input, with the results the model has not seen yet put in front of it."""
    unseen = unseen_results(events)
    if not unseen:
        return text
    shown = "\n".join(results_text(v.get("results") or []) for v in unseen)
    return (
        TextBlock(f"{RESULTS_HEADER} (as the executer reported them):\n{shown}"),
        TextBlock(text),
    )
