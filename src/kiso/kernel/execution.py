"""The execution vocabulary both products share: ids, rulings, receipt states, rerunnable tools.

kiso's session log and Kyronix's executer keep receipts for the same thing: one physical attempt
at a tool call, named by an :data:`ExecutionId`, recorded as started before it runs and finished
(its receipt) after. An attempt that started and never finished is *uncertain*; a person rules on
it with one of the three :class:`Ruling` s. Whether a tool may simply be run again after a crash
is a property of the tool (:class:`Rerunnable`), never a list of names kept somewhere else.
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from typing import NewType, Protocol

from kiso.kernel.errors import UsageError

__all__ = [
    "RULING_ALIASES",
    "ExecutionId",
    "ReceiptState",
    "Rerunnable",
    "Ruling",
    "call_execution_id",
    "is_rerunnable",
    "parse_ruling",
    "request_id_of",
]

ExecutionId = NewType("ExecutionId", str)
"""One physical attempt at a tool call, unique across sessions and executers (a rerun of the same
call is a new execution with a new id). kiso writes ``<session id>:<seq of its start>``; Kyronix
plans carry ``exec_<hex>``."""


class Ruling(StrEnum):
    """A person's ruling on an uncertain execution."""

    RERUN = "rerun"
    """Run it again now (under the verdict already on disk)."""
    SKIPPED = "skipped"
    """Do not run it again; treat its effect as not applied."""
    APPLIED = "applied"
    """A person checked: its effect was applied (its output is not available)."""


RULING_ALIASES = {"skip": Ruling.SKIPPED}
"""Spellings command lines accept besides the rulings themselves (``--resolve skip``)."""


def parse_ruling(text: str) -> Ruling:
    """``rerun``, ``skipped`` (or ``skip``) or ``applied`` as a :class:`Ruling`."""
    ruling = RULING_ALIASES.get(text)
    if ruling is not None:
        return ruling
    try:
        return Ruling(text)
    except ValueError:
        raise UsageError(f"a ruling is rerun, skipped (or skip) or applied, not {text!r}") from None


class ReceiptState(StrEnum):
    """Where one execution stands in a receipt store (a session log or the executer's)."""

    STARTED = "started"
    """It started and reported nothing: uncertain until a person rules (or it is rerunnable)."""
    FINISHED = "finished"
    """Its handler returned; the receipt holds its result. It never runs again."""
    RESOLVED = "resolved"
    """It was uncertain and a person ruled on it."""


class Rerunnable(Protocol):
    """What a tool declares about repeating it: both products' tools have these properties."""

    @property
    def read_only(self) -> bool:
        """It changes nothing: running it twice is harmless."""
        ...

    @property
    def idempotent(self) -> bool:
        """Running it twice has the effect of running it once."""
        ...


def is_rerunnable(tool: Rerunnable) -> bool:
    """Whether an uncertain execution of ``tool`` is re-run without asking anyone."""
    return tool.read_only or tool.idempotent


def call_execution_id(session_id: str, call_id: str, key: bytes = b"") -> ExecutionId:
    """``exec_`` + 32 hex digits: the receipt key of a model's call whose effect runs elsewhere
    (an executer over the tunnel), the same for every attempt of that call, so the request a
    resumed run sends again names the same receipt and nothing runs twice. Keyed with ``key``
    (HMAC-SHA256; the server's secret), so nobody without the key can compute it ahead of the
    request."""
    digest = hmac.new(key, f"{session_id}\x00{call_id}".encode(), hashlib.sha256).hexdigest()
    return ExecutionId("exec_" + digest[:32])


def request_id_of(execution_id: str, key: bytes = b"") -> str:
    """``req_`` + 32 hex digits: the id of the one-tool request that carries ``execution_id``
    (stable across attempts, like it; keyed with ``key`` apart from it, so knowing a tool's
    execution id does not tell the request's id)."""
    digest = hmac.new(key, f"request\x00{execution_id}".encode(), hashlib.sha256).hexdigest()
    return "req_" + digest[:32]
