"""The runtime side of the WebSocket tunnel's frames (docs/tunnel.md), without I/O.

A call is one frame sent (``kml_request`` or ``resolve``) and the frames that answer it. A
``kml_request`` is answered by ``kml_progress``, ``kml_result`` or ``error`` frames carrying
its ``executionId`` (``req_…``); a ``resolve`` (whose ``executionId`` is a tool's) carries a
``requestId`` of its own (``res_…``) that the server and the executer echo in the ``resolved``
or ``error`` frame. The waiter of a call is keyed by that id (request ids and resolve ids never
collide), so one table of waiters routes every frame.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from kyronix import kml as kmllib
from kyronix.client._errors import tunnel_error
from kyronix.errors import (
    AuthenticationError,
    KyronixError,
    KyronixTypeError,
    KyronixUsageError,
)

__all__ = [
    "AUTH_CLOSE",
    "GRACE",
    "MAX_TIMEOUT",
    "RULINGS",
    "Answer",
    "OnProgress",
    "auth_frame",
    "classify",
    "close_error",
    "decode",
    "kml_request",
    "new_request_id",
    "pong_for",
    "resolve_frame",
    "waiter_key",
]

OnProgress: TypeAlias = Callable[[dict[str, Any]], object]
"""Called with each ``kml_progress`` frame of a request (a coroutine function is awaited)."""

AUTH_CLOSE = 4401
"""The close code of a connection whose authentication failed."""
MAX_TIMEOUT = 3600.0
"""The longest ``timeout`` a ``kml_request`` may ask for."""
GRACE = 2.0
"""Seconds the client waits past a request's timeout for the server's own ``timeout`` error."""
RULINGS = ("rerun", "skipped", "applied")
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def new_request_id(prefix: str = "req") -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _name(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise KyronixTypeError(f"{what} must be a string, not {type(value).__name__}")
    if not _ID.fullmatch(value):
        raise KyronixUsageError(
            f"{what} must be 1-128 of letters, digits and _.:- (as docs/tunnel.md says), "
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
    if timeout > MAX_TIMEOUT:
        raise KyronixUsageError(
            f"a tunnel request may wait at most {MAX_TIMEOUT:g} s, not timeout={timeout:g}"
        )
    frame: dict[str, Any] = {
        "type": "kml_request",
        "executionId": new_request_id(),
        "kmlResponse": kml,
        "timeout": timeout,
    }
    if executer_id is not None:
        frame["executerId"] = _name("executer_id", executer_id)
    if session_id is not None:
        if not isinstance(session_id, str) or not session_id:
            raise KyronixUsageError("session_id must be a session's id (sess_…)")
        frame["sessionId"] = session_id
    return frame


def resolve_frame(
    execution_id: object, resolution: object, *, executer_id: object = None
) -> dict[str, Any]:
    if resolution not in RULINGS:
        raise KyronixUsageError(
            f"resolution must be one of {', '.join(RULINGS)} (rerun: run it again; skipped: "
            f"never run it; applied: it did happen), not {resolution!r}"
        )
    frame: dict[str, Any] = {
        "type": "resolve",
        "executionId": _name("execution_id", execution_id),
        "resolution": resolution,
        "requestId": new_request_id("res"),
    }
    if executer_id is not None:
        frame["executerId"] = _name("executer_id", executer_id)
    return frame


def auth_frame(api_key: str) -> dict[str, Any]:
    return {"type": "auth", "apiKey": api_key, "role": "runtime"}


def decode(message: str | bytes) -> dict[str, Any] | None:
    """A frame as a dict, or None when it is not a JSON object with a string ``type``."""
    try:
        frame = json.loads(message)
    except ValueError:
        return None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        return None
    return frame


def pong_for(frame: Mapping[str, Any]) -> dict[str, Any]:
    pong: dict[str, Any] = {"type": "pong"}
    if "ts" in frame:
        pong["ts"] = frame["ts"]
    return pong


@dataclass(frozen=True)
class Answer:
    """What a frame means to the call waiting for it."""

    kind: Literal["result", "progress", "error"]
    value: Any = None


def waiter_key(frame: Mapping[str, Any]) -> str:
    """The id a call's answers come back with (a resolve's ``requestId``)."""
    return str(frame["requestId"] if frame["type"] == "resolve" else frame["executionId"])


def classify(frame: Mapping[str, Any]) -> tuple[list[str], Answer] | None:
    """(the ids of the waiters it may be for, best first; what that waiter gets) for a frame
    that answers a call; None for the others (``ready``, ``pong``, unknown types)."""
    keys = [
        value
        for value in (frame.get("requestId"), frame.get("executionId"))
        if isinstance(value, str)
    ]
    kind = frame["type"]
    if kind == "kml_result":
        problem = frame.get("error")
        if isinstance(problem, Mapping):  # the executer could not run it: nothing ran
            return keys, Answer("error", tunnel_error({**frame, **problem, "type": "error"}))
        results = frame.get("results")
        return keys, Answer("result", list(results) if isinstance(results, list) else [])
    if kind == "resolved":
        return keys, Answer("result", dict(frame))
    if kind == "kml_progress":
        return keys, Answer("progress", dict(frame))
    if kind == "error":
        return keys, Answer("error", tunnel_error(frame))
    return None


def close_error(code: int | None, reason: str) -> KyronixError | None:
    """The error a close means (authentication refused), or None: connect again."""
    if code == AUTH_CLOSE:
        return AuthenticationError(
            f"the tunnel refused the API key: {reason or 'unauthorized'}; check "
            f"KYRONIX_API_KEY (a revoked or unknown key, or one of another server)",
            code="invalid_api_key",
            details={"closeCode": code, "reason": reason},
        )
    return None
