"""How a run ended, as one typed value, and the two things built from it in one place: the body
the client gets (:meth:`Outcome.body`) and what the session log records
(:meth:`Outcome.record`). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiso.kernel import Usage
from kiso.providers.registry import cost as provider_cost
from kyronix.server.config import MILLI, ServerConfig, to_credits
from kyronix.server.errors import error_body
from kyronix.wire import EntryDict

__all__ = ["Meter", "Outcome", "charge", "interrupted_body", "interrupted_record"]


class Meter:
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


def charge(config: ServerConfig, usd: float | None) -> int:
    """Millicredits for a run: ``max(minimum, provider cost x multiplier)``."""
    if not usd:
        return config.minimum_charge
    priced = round(usd * config.credits_per_usd * config.multiplier * MILLI)
    return max(config.minimum_charge, priced)


@dataclass
class Outcome:
    """A run's end: an answer (``http_status`` 200) or a failure (``error``)."""

    run_id: str
    session_id: str
    http_status: int
    response: str = ""
    execution_ids: tuple[str, ...] = ()
    results: list[EntryDict] | None = None
    """The executer's entries of a server-driven run (None for a plan)."""
    cost: int | None = None
    """Millicredits charged (None: the hold is released, nothing charged)."""
    usage: tuple[int, int] = (0, 0)
    texts: list[str] = field(default_factory=list)
    """The text of each model attempt (the stream's transcript)."""
    error: tuple[str, str, dict[str, Any]] | None = None
    """(code, message, details) of a failure."""
    recorded_in_log: bool = True
    """Whether :meth:`record` goes into the session log (a bug's 500 records nothing)."""
    issues_ids: bool = False
    """The plan's execution ids are remembered as issued by this session (a plan's answer)."""
    key_id: str | None = None
    """The API key the run was started with: only a runtime holding it records its results."""
    credits_remaining: int | None = None
    """Set when the run is settled."""
    # -- how it is being settled (the driver and the settlement fill these in)
    staged: bool = False
    """The record is staged in the kiso run (it becomes durable with ``run_ended``)."""
    settle_seq: int | None = None
    """The charge is settled in the transaction that makes this event of the log durable."""
    settled: bool = False
    """That transaction committed (the log is durable past ``settle_seq``)."""

    @property
    def ok(self) -> bool:
        return self.http_status == 200

    @classmethod
    def failure(
        cls,
        run_id: str,
        session_id: str,
        http_status: int,
        code: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Outcome:
        return cls(run_id, session_id, http_status, error=(code, message, details or {}), **fields)

    def body(self) -> dict[str, Any]:
        """What the client gets."""
        if self.error is not None:
            return error_body(*self.error)
        body: dict[str, Any] = {
            "response": self.response,
            "sessionId": self.session_id,
            "creditsRemaining": to_credits(self.credits_remaining or 0),
            "usage": {"input": self.usage[0], "output": self.usage[1]},
            "cost": to_credits(self.cost or 0),
            "executionIds": list(self.execution_ids),
            "runId": self.run_id,
        }
        if self.results is not None:
            body["results"] = self.results
        return body

    def record(self) -> dict[str, Any] | None:
        """What the session log records (``setting_changed`` ``kyronix.result``), or None."""
        if not self.recorded_in_log:
            return None
        out: dict[str, Any] = {
            "runId": self.run_id,
            "status": "completed" if self.ok else "failed",
            "response": self.response if self.ok else "",
        }
        if self.ok:
            out["executionIds"] = list(self.execution_ids)
            out["cost"] = to_credits(self.cost or 0)
        if self.results is not None:
            out["results"] = self.results
        return out


def interrupted_body(run_id: str, why: str) -> dict[str, Any]:
    return error_body(
        "run_interrupted",
        f"the run was interrupted ({why}) before it answered; nothing was charged. Send the "
        f"request again.",
        {"runId": run_id},
    )


def interrupted_record(run_id: str) -> dict[str, Any]:
    return {"runId": run_id, "status": "interrupted", "response": ""}
