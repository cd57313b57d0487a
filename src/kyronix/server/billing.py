"""Credits: an append-only ledger, two-phase holds, and a sweep for holds nobody settled.

Every change to a project's credits is one ledger row, written in the same transaction as the
change to ``kx_projects.credits`` (the cached balance), so the balance always equals the sum of
the project's ledger:

=========  =========  ===========================================================
kind       amount     when
=========  =========  ===========================================================
grant      +N         project creation (100 credits), ``kyronix credits grant``
hold       -h         a run reserves h before its model is called
settle     -cost      the run's real price, ``max(minimum, provider cost x multiplier)``
release    +h         the hold goes back (just before its settle, or alone when the run
                      did not finish: failed, interrupted, swept)
refund     +x         credits given back for a settled run
=========  =========  ===========================================================

A run is three short transactions: **reserve** (a conditional update — credits >= h — plus the
hold row and its ledger row, or :class:`InsufficientCredits` before anything is called), the
model call with **no transaction open**, and **settle** (idempotent per hold: only a hold still
``held`` is settled or released). A hold no live run will settle (its server was killed) is
released by :func:`sweep`, at start and periodically. The balance is the credits available now:
holds of runs in flight are already taken out, so concurrent runs can never overdraw it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, func, select, update

from kyronix.errors import KyronixRefusedError
from kyronix.server.db import holds, ledger, now_ms, projects

__all__ = [
    "InsufficientCredits",
    "balance",
    "changes_since",
    "entries",
    "expired_holds",
    "grant",
    "held",
    "ledger_sum",
    "release",
    "reserve",
    "settle",
]


class InsufficientCredits(KyronixRefusedError):
    """A hold could not be taken: the project's credits (millicredits) are short."""

    def __init__(self, required: int, available: int, held: int) -> None:
        super().__init__("insufficient credits", status_code=402)
        self.required = required
        self.available = available
        self.held = held


# Built once: a statement reused with parameters skips SQLAlchemy's per-call construction and
# cache-key work (the ledger is on every run's path).
_LEDGER = ledger.insert()
_CREDIT = (
    update(projects)
    .where(projects.c.id == bindparam("b_project"))
    .values(credits=projects.c.credits + bindparam("b_amount"))
)
_TAKE = (
    update(projects)
    .where((projects.c.id == bindparam("b_project")) & (projects.c.credits >= bindparam("b_need")))
    .values(credits=projects.c.credits - bindparam("b_need"))
)
_HOLD = holds.insert()
_CLOSE = (  # one statement: only a hold still held is closed, and says what it was
    update(holds)
    .where((holds.c.run_id == bindparam("b_run")) & (holds.c.status == "held"))
    .values(status=bindparam("b_status"), closed_at=bindparam("b_at"))
    .returning(holds.c.id, holds.c.project_id, holds.c.amount)
)
_CREDIT_BALANCE = _CREDIT.returning(projects.c.credits)
_BALANCE = select(projects.c.credits).where(projects.c.id == bindparam("b_project"))


@dataclass(frozen=True)
class Hold:
    id: str
    project_id: str
    run_id: str
    amount: int


def _entry(
    conn: Connection,
    project_id: str,
    kind: str,
    amount: int,
    *,
    hold_id: str | None = None,
    run_id: str | None = None,
    note: str | None = None,
    at: int | None = None,
) -> None:
    conn.execute(
        _LEDGER,
        {
            "project_id": project_id,
            "kind": kind,
            "amount": amount,
            "hold_id": hold_id,
            "run_id": run_id,
            "note": note,
            "created_at": at if at is not None else now_ms(),
        },
    )
    conn.execute(_CREDIT, {"b_project": project_id, "b_amount": amount})


def grant(conn: Connection, project_id: str, amount: int, *, note: str | None = None) -> None:
    _entry(conn, project_id, "grant", amount, note=note)


def refund(conn: Connection, project_id: str, amount: int, run_id: str, note: str | None) -> None:
    _entry(conn, project_id, "refund", amount, run_id=run_id, note=note)


def balance(conn: Connection, project_id: str) -> int:
    value = conn.execute(_BALANCE, {"b_project": project_id}).scalar()
    return int(value or 0)


def ledger_sum(conn: Connection, project_id: str) -> int:
    value = conn.execute(
        select(func.coalesce(func.sum(ledger.c.amount), 0)).where(ledger.c.project_id == project_id)
    ).scalar_one()
    return int(value)


def entries(conn: Connection, project_id: str, *, newest: int | None = None) -> list[Any]:
    """The project's ledger rows: all of them in order, or the ``newest`` ones, newest first."""
    query = select(ledger).where(ledger.c.project_id == project_id)
    if newest is None:
        return list(conn.execute(query.order_by(ledger.c.id)))
    return list(conn.execute(query.order_by(ledger.c.id.desc()).limit(newest)))


def changes_since(conn: Connection, project_id: str, since: int) -> list[tuple[int, str, int]]:
    """(created_at, kind, amount) of every ledger row of the project from ``since`` (unix ms)."""
    rows = conn.execute(
        select(ledger.c.created_at, ledger.c.kind, ledger.c.amount).where(
            (ledger.c.project_id == project_id) & (ledger.c.created_at >= since)
        )
    )
    return [(r.created_at, r.kind, r.amount) for r in rows]


def held(conn: Connection, project_id: str) -> int:
    value = conn.execute(
        select(func.coalesce(func.sum(holds.c.amount), 0)).where(
            (holds.c.project_id == project_id) & (holds.c.status == "held")
        )
    ).scalar_one()
    return int(value)


def reserve(conn: Connection, project_id: str, run_id: str, amount: int, ttl_ms: int) -> Hold:
    """Take ``amount`` out of the project's credits for ``run_id``, or raise
    :class:`InsufficientCredits` (nothing written)."""
    at = now_ms()
    taken = conn.execute(_TAKE, {"b_project": project_id, "b_need": amount}).rowcount
    if taken != 1:
        raise InsufficientCredits(amount, balance(conn, project_id), held(conn, project_id))
    hold = Hold(f"hold_{secrets.token_hex(8)}", project_id, run_id, amount)
    conn.execute(
        _HOLD,
        {
            "id": hold.id,
            "project_id": project_id,
            "run_id": run_id,
            "amount": amount,
            "status": "held",
            "created_at": at,
            "expires_at": at + ttl_ms,
        },
    )
    conn.execute(
        _LEDGER,
        {
            "project_id": project_id,
            "kind": "hold",
            "amount": -amount,
            "hold_id": hold.id,
            "run_id": run_id,
            "note": None,
            "created_at": at,
        },
    )
    return hold


def _close(conn: Connection, run_id: str, status: str) -> tuple[str, str, int] | None:
    """Mark the run's hold closed if it is still held: (hold id, project, amount), else None."""
    rows = conn.execute(_CLOSE, {"b_run": run_id, "b_status": status, "b_at": now_ms()}).all()
    if not rows:
        return None
    (row,) = rows  # a run has one hold
    return (row.id, row.project_id, row.amount)


def settle(conn: Connection, run_id: str, cost: int) -> int | None:
    """Charge ``cost`` for the run and give its hold back: the project's balance after it, or
    None if the hold was already settled or released (idempotent)."""
    closed = _close(conn, run_id, "settled")
    if closed is None:
        return None
    hold_id, project_id, amount = closed
    at = now_ms()
    row = {"project_id": project_id, "hold_id": hold_id, "run_id": run_id, "note": None}
    # The release first: then every prefix of the ledger is a balance the project had.
    conn.execute(
        _LEDGER,
        [
            {**row, "kind": "release", "amount": amount, "created_at": at},
            {**row, "kind": "settle", "amount": -cost, "created_at": at},
        ],
    )
    left = conn.execute(
        _CREDIT_BALANCE, {"b_project": project_id, "b_amount": amount - cost}
    ).scalar_one()
    return int(left)


def release(conn: Connection, run_id: str, note: str | None = None) -> bool:
    """Give the run's whole hold back (nothing charged); False if already closed."""
    closed = _close(conn, run_id, "released")
    if closed is None:
        return False
    hold_id, project_id, amount = closed
    _entry(conn, project_id, "release", amount, hold_id=hold_id, run_id=run_id, note=note)
    return True


def expired_holds(conn: Connection, at: int) -> list[str]:
    """Run ids whose holds are still held past their expiry."""
    return [
        r.run_id
        for r in conn.execute(
            select(holds.c.run_id).where((holds.c.status == "held") & (holds.c.expires_at <= at))
        )
    ]
