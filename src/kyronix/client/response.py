"""What a run answers: :class:`RunResponse`, read from the server's JSON and checked on entry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kyronix.errors import APIError

__all__ = ["RunResponse", "Usage", "parse_run"]


@dataclass(frozen=True)
class Usage:
    """Tokens the model reported for the run."""

    input: int = 0
    output: int = 0


@dataclass(frozen=True)
class RunResponse:
    """The result of a run (``POST /api/agents/{agent}``, ``/api/customagents/run``).

    ``response`` is the KML envelope (with ``execute="tunnel"``: the agent's final answer);
    ``execution_ids`` are its tools' receipt keys, in order; ``cost`` is what this run was
    charged and ``credits_remaining`` the project's balance after it. ``results`` is the list of
    tool results when the server ran the tools through the tunnel (``execute="tunnel"``), None
    otherwise. ``raw`` is the whole JSON body as the server sent it.
    """

    response: str
    session_id: str
    credits_remaining: float
    usage: Usage
    execution_ids: list[str]
    cost: float
    run_id: str
    results: list[dict[str, Any]] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def _bad(what: str, body: Mapping[str, Any]) -> APIError:
    return APIError(
        f"the server's run result has {what}; is base_url a Kyronix server of this version?",
        code="invalid_response",
        details={"keys": sorted(body)},
    )


def _number(body: Mapping[str, Any], key: str) -> float:
    value = body.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"a {key!r} that is not a number", body)
    return float(value)


def _count(value: object) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def parse_run(body: object) -> RunResponse:
    """A :class:`RunResponse` from a run's JSON body (an APIError if it is not one)."""
    if not isinstance(body, Mapping):
        raise APIError(
            "the server's run result is not a JSON object; is base_url a Kyronix server?",
            code="invalid_response",
        )
    response, session_id, run_id = body.get("response"), body.get("sessionId"), body.get("runId")
    if not isinstance(response, str):
        raise _bad("no 'response' text", body)
    if not isinstance(session_id, str) or not session_id:
        raise _bad("no 'sessionId'", body)
    usage = body.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    ids = body.get("executionIds", [])
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise _bad("'executionIds' that are not a list of strings", body)
    results = body.get("results")
    if results is not None and not isinstance(results, list):
        raise _bad("'results' that is not a list", body)
    return RunResponse(
        response=response,
        session_id=session_id,
        credits_remaining=_number(body, "creditsRemaining"),
        usage=Usage(_count(usage.get("input")), _count(usage.get("output"))),
        execution_ids=list(ids),
        cost=_number(body, "cost"),
        run_id=run_id if isinstance(run_id, str) else "",
        results=list(results) if results is not None else None,
        raw=dict(body),
    )
