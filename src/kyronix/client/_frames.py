"""The runtime side of the WebSocket tunnel's frames (docs/tunnel.md), without I/O.

A call is one frame sent (``kml_request`` or ``resolve``) and the frames that answer it. A
``kml_request`` is answered by ``kml_progress``, ``kml_result`` or ``error`` frames carrying
its ``executionId`` (``req_…``); a ``resolve`` (whose ``executionId`` is a tool's) carries a
``requestId`` of its own (``res_…``) that the server and the executer echo in the ``resolved``
or ``error`` frame. The waiter of a call is keyed by that id (request ids and resolve ids never
collide), so one table of waiters routes every frame.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from kyronix import kml as kmllib
from kyronix import wire
from kyronix.client._errors import tunnel_error
from kyronix.errors import (
    AuthenticationError,
    KyronixError,
    KyronixTypeError,
    KyronixUsageError,
)

__all__ = [
    "GRACE",
    "Answer",
    "OnProgress",
    "classify",
    "close_error",
    "kml_request",
    "new_request_id",
    "prepare_kml",
    "resolve_frame",
    "waiter_key",
]

OnProgress: TypeAlias = Callable[[dict[str, Any]], object]
"""Called with each ``kml_progress`` frame of a request (a coroutine function is awaited)."""

GRACE = 2.0
"""Seconds the client waits past a request's timeout for the server's own ``timeout`` error."""


def new_request_id(prefix: str = "req") -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _name(what: str, value: object) -> str:
    """A request id or a tool execution id (:data:`kyronix.wire.REQUEST_ID`)."""
    if not isinstance(value, str):
        raise KyronixTypeError(f"{what} must be a string, not {type(value).__name__}")
    if not wire.valid_id(value):
        raise KyronixUsageError(
            f"{what} must be 1-128 of letters, digits and _.:- (as docs/tunnel.md says), "
            f"not {value!r}"
        )
    return value


def _executer(value: object) -> str:
    """An executer id (:data:`kyronix.wire.EXECUTER_ID`)."""
    if not isinstance(value, str):
        raise KyronixTypeError(f"executer_id must be a string, not {type(value).__name__}")
    if not wire.valid_executer_id(value):
        raise KyronixUsageError(
            f"executer_id must be 1-64 of letters, digits and _.- (as docs/tunnel.md says), "
            f"not {value!r}"
        )
    return value


def prepare_kml(text: object) -> str:
    """The KML to send: checked by :func:`kyronix.kml.parse` (a :class:`KmlError` if it is
    malformed, before anything is sent), and, if some ``<tool>`` has no ``executionId``,
    rewritten with one assigned now, so that every re-send of the frame names the same
    receipts and nothing runs twice."""
    if not isinstance(text, str):
        raise KyronixTypeError(f"kml must be a string of KML, not {type(text).__name__}")
    plan = kmllib.parse(text)
    if any(t.assigned for t in plan.tools):
        return kmllib.serialize(plan)
    return text


def kml_request(
    kml: str,
    *,
    timeout: float,
    executer_id: object = None,
    session_id: object = None,
) -> dict[str, Any]:
    if timeout > wire.MAX_TIMEOUT_S:
        raise KyronixUsageError(
            f"a tunnel request may wait at most {wire.MAX_TIMEOUT_S:g} s, not timeout={timeout:g}"
        )
    executer = _executer(executer_id) if executer_id is not None else None
    session: str | None = None
    if session_id is not None:
        if not isinstance(session_id, str) or not wire.valid_id(session_id):
            raise KyronixUsageError("session_id must be a session's id (sess_…)")
        session = session_id
    return wire.kml_request(
        new_request_id(), kml, executer_id=executer, timeout=timeout, session_id=session
    )


def resolve_frame(
    execution_id: object, resolution: object, *, executer_id: object = None
) -> dict[str, Any]:
    if not isinstance(resolution, str) or resolution not in wire.RULINGS:
        raise KyronixUsageError(
            f"resolution must be one of {', '.join(wire.RULINGS)} (rerun: run it again; "
            f"skipped: never run it; applied: it did happen), not {resolution!r}"
        )
    return wire.resolve(
        _name("execution_id", execution_id),
        resolution,
        new_request_id("res"),
        executer_id=_executer(executer_id) if executer_id is not None else None,
    )


@dataclass(frozen=True)
class Answer:
    """What a frame means to the call waiting for it."""

    kind: Literal["result", "progress", "error"]
    value: Any = None


def waiter_key(frame: Mapping[str, Any]) -> str:
    """The id a call's answers come back with (a resolve's ``requestId``)."""
    return str(frame["requestId"] if frame["type"] == "resolve" else frame["executionId"])


def classify(frame: wire.Frame | wire.BadFrame) -> tuple[list[str], Answer] | None:
    """(the ids of the waiters it may be for, best first; what that waiter gets) for a frame
    that answers a call (parsed by :func:`kyronix.wire.parse`); None for the others
    (``ready``, ``pong``, a :class:`~kyronix.wire.BadFrame`...).

    A waiter gets the entries of a ``kml_result``, the ``kml_progress`` or ``resolved`` frame
    as the document shapes it (:func:`kyronix.wire.as_dict`), or the exception an ``error``
    frame (or a ``kml_result`` with ``error``) means."""
    if isinstance(frame, wire.KmlResult):
        if frame.error is not None:  # the executer could not run it: nothing ran
            problem = {**wire.as_dict(frame), **frame.error, "type": "error"}
            return [frame.request_id], Answer("error", tunnel_error(problem))
        return [frame.request_id], Answer("result", list(frame.results))
    if isinstance(frame, wire.KmlProgress):
        return [frame.request_id], Answer("progress", wire.as_dict(frame))
    if isinstance(frame, wire.Resolved):
        return _ids(frame), Answer("result", wire.as_dict(frame))
    if isinstance(frame, wire.ErrorFrame):
        return _ids(frame), Answer("error", tunnel_error(wire.as_dict(frame)))
    return None


def _ids(frame: wire.Resolved | wire.ErrorFrame) -> list[str]:
    """A resolve's own ``requestId`` first, then the ``executionId`` (a request's, a tool's)."""
    return [k for k in (frame.request_id, frame.execution_id) if k is not None]


def close_error(code: int | None, reason: str) -> KyronixError | None:
    """The error a close means (authentication refused), or None: connect again."""
    if code == wire.CLOSE_UNAUTHORIZED:
        return AuthenticationError(
            f"the tunnel refused the API key: {reason or 'unauthorized'}; check "
            f"KYRONIX_API_KEY (a revoked or unknown key, or one of another server)",
            code="invalid_api_key",
            details={"closeCode": code, "reason": reason},
        )
    return None
