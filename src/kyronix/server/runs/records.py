"""The rows of runs: ``kx_runs`` (one a run) and ``kx_executions`` (which run issued each tool
execution id of a plan). This module is the only one that writes them.

A run's row is made ``running`` by its admission, owned by the replica that admitted it
(``owner``), and finished exactly once: :func:`finish` and :func:`interrupt` apply only while
the row is still ``running`` **and** still owned by the replica that writes (the fence: a replica
that lost the run to another, after a pause past the replica timeout, changes nothing).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update

from kyronix.server.db import custom_agents, executions, now_ms, runs

__all__ = [
    "by_idempotency_key",
    "claim_orphans",
    "finish",
    "get",
    "insert",
    "interrupt",
    "issued_in",
    "page",
    "record_issued",
    "running_elsewhere",
    "sessions_of_executions",
    "totals",
]

_IDEM = select(runs).where(
    (runs.c.project_id == bindparam("b_project")) & (runs.c.idem_key == bindparam("b_key"))
)
_INSERT = runs.insert()
_GET = select(runs).where(runs.c.id == bindparam("b_run"))
_FENCE = (
    (runs.c.id == bindparam("b_run"))
    & (runs.c.status == "running")
    & (runs.c.owner == bindparam("b_owner"))
)
_FINISH = (
    update(runs)
    .where(_FENCE)
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
_NEW_EXECUTION = executions.insert()


def by_idempotency_key(conn: Connection, project_id: str, key: str) -> Any | None:
    return conn.execute(_IDEM, {"b_project": project_id, "b_key": key}).first()


def insert(conn: Connection, **values: Any) -> None:
    """A new ``running`` row (``values``: the columns of ``kx_runs``)."""
    conn.execute(_INSERT, {"status": "running", "created_at": now_ms(), **values})


def get(conn: Connection, run_id: str, project_id: str | None = None) -> Any | None:
    """The run's row (only the project's own when ``project_id`` is given)."""
    row = conn.execute(_GET, {"b_run": run_id}).first()
    if row is None or (project_id is not None and row.project_id != project_id):
        return None
    return row


def finish(
    conn: Connection,
    run_id: str,
    owner: str,
    *,
    status: str,
    http_status: int,
    body: dict[str, Any],
    transcript: Sequence[str],
    cost: int,
    usage: tuple[int, int],
) -> bool:
    """Record the run's answer; False (nothing written) when it is no longer running here."""
    done = conn.execute(
        _FINISH,
        {
            "b_run": run_id,
            "b_owner": owner,
            "b_status": status,
            "b_at": now_ms(),
            "b_http": http_status,
            "b_result": json.dumps(body),
            "b_transcript": json.dumps(list(transcript)),
            "b_cost": cost,
            "b_in": usage[0],
            "b_out": usage[1],
        },
    )
    return bool(done.rowcount == 1)


def interrupt(conn: Connection, run_id: str, owner: str, body: dict[str, Any]) -> bool:
    """Record the run as interrupted (no answer, nothing charged, its idempotency key freed so
    a retry runs it); False when it is no longer running here."""
    done = conn.execute(
        update(runs)
        .where(_FENCE)
        .values(
            status="interrupted",
            finished_at=now_ms(),
            http_status=503,
            result=json.dumps(body),
            transcript=json.dumps([]),
            cost=0,
            idem_key=None,
        ),
        {"b_run": run_id, "b_owner": owner},
    )
    return bool(done.rowcount == 1)


def claim_orphans(conn: Connection, owner: str, live: Any) -> list[Any]:
    """Make ``owner`` the owner of every ``running`` run whose owner is not in ``live`` (a set
    of replica ids, or a query of them) in one statement: each goes to exactly one replica."""
    return list(
        conn.execute(
            update(runs)
            .where(
                (runs.c.status == "running") & (runs.c.owner != owner) & runs.c.owner.not_in(live)
            )
            .values(owner=owner)
            .returning(*runs.c)
        )
    )


def running_elsewhere(conn: Connection, run_ids: Iterable[str], owner: str) -> set[str]:
    """Those of ``run_ids`` that another replica is running."""
    ids = list(run_ids)
    if not ids:
        return set()
    return {
        r.id
        for r in conn.execute(
            select(runs.c.id).where(
                runs.c.id.in_(ids) & (runs.c.status == "running") & (runs.c.owner != owner)
            )
        )
    }


def record_issued(
    conn: Connection,
    execution_ids: Sequence[str],
    project_id: str,
    session_id: str,
    run_id: str,
    *,
    key_id: str | None = None,
) -> None:
    """Remember which session's run (of which API key) issued a plan's tool ids (where their
    results go, and from whom)."""
    if not execution_ids:
        return
    at = now_ms()
    conn.execute(
        _NEW_EXECUTION,
        [
            {"id": eid, "project_id": project_id, "session_id": session_id, "run_id": run_id,
             "created_at": at, "key_id": key_id}
            for eid in execution_ids
        ],
    )  # fmt: skip


def sessions_of_executions(
    conn: Connection, execution_ids: Sequence[str], project_id: str
) -> dict[str, tuple[str, str | None]]:
    """Tool execution id -> (the session whose plan issued it, the API key that ran the plan),
    of this project (others absent)."""
    if not execution_ids:
        return {}
    rows = conn.execute(
        select(executions.c.id, executions.c.session_id, executions.c.key_id).where(
            executions.c.id.in_(list(execution_ids)) & (executions.c.project_id == project_id)
        )
    )
    return {r.id: (r.session_id, r.key_id) for r in rows}


def issued_in(conn: Connection, project_id: str, session_id: str) -> dict[str, str]:
    """Tool execution id -> the run that issued it, for one session's plans."""
    return {
        r.id: r.run_id
        for r in conn.execute(
            select(executions.c.id, executions.c.run_id).where(
                (executions.c.session_id == session_id) & (executions.c.project_id == project_id)
            )
        )
    }


def page(
    conn: Connection, project_id: str, *, limit: int | None = None, session_id: str | None = None
) -> list[Any]:
    """The project's runs, with their custom agent's name (``agent_name``): the newest
    ``limit``, newest first; or all of one session's, oldest first."""
    query = (
        select(runs, custom_agents.c.name.label("agent_name"))
        .outerjoin(custom_agents, custom_agents.c.id == runs.c.custom_agent_id)
        .where(runs.c.project_id == project_id)
    )
    if session_id is not None:
        query = query.where(runs.c.session_id == session_id).order_by(runs.c.created_at, runs.c.id)
    else:
        query = query.order_by(runs.c.created_at.desc(), runs.c.id.desc())
    if limit is not None:
        query = query.limit(limit)
    return list(conn.execute(query))


def totals(conn: Connection, project_id: str) -> dict[str, int]:
    """How many runs the project had, their tokens in and out, and what they cost."""
    row = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(runs.c.usage_input), 0),
            func.coalesce(func.sum(runs.c.usage_output), 0),
            func.coalesce(func.sum(runs.c.cost), 0),
        ).where(runs.c.project_id == project_id)
    ).one()
    return {"runs": int(row[0]), "input": int(row[1]), "output": int(row[2]), "cost": int(row[3])}
