"""The executer's side of the tunnel's wire format (docs/tunnel.md), with no I/O at all.

Everything the daemon (:mod:`kyronix.executer.daemon`) decides about a frame is here, pure and
testable on its own:

- :func:`parse_frame` turns one text frame from the server into a typed value (:class:`Ready`,
  :class:`KmlRequest`, :class:`Resolve`, :class:`Ping`, :class:`Pong`, :class:`ServerError`,
  :class:`OtherFrame`) or a :class:`BadFrame` that says what was wrong with it;
- the builders (:func:`kml_result`, :func:`kml_progress`, :func:`resolved`, :func:`error`,
  :func:`ping`, :func:`pong`) make the frames the executer sends, exactly as the table in
  docs/tunnel.md shapes them;
- :func:`executer_url` adds ``role=executer`` and ``executerId`` to the server's ``/ws`` URL;
- :class:`Backoff` is the reconnect schedule: exponential from 0.5 s, capped at 30 s, with
  jitter, reset after a stable connection.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from kyronix.errors import KyronixUsageError
from kyronix.executer.results import EntryDict

__all__ = [
    "EXECUTER_ID_PATTERN",
    "ID_PATTERN",
    "RESOLVE_ERROR_CODES",
    "RESULT_ERROR_CODES",
    "RULINGS",
    "Backoff",
    "BadFrame",
    "Frame",
    "KmlRequest",
    "OtherFrame",
    "Ping",
    "Pong",
    "ProgressEvent",
    "Ready",
    "Resolve",
    "ResultError",
    "ServerError",
    "encode",
    "error",
    "executer_url",
    "kml_progress",
    "kml_result",
    "parse_frame",
    "ping",
    "pong",
    "resolved",
    "shown_url",
    "valid_id",
]

ID_PATTERN = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
"""A request id (docs/tunnel.md: 1-128 of ``[A-Za-z0-9_.:-]``)."""

EXECUTER_ID_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
"""An executer id, as the server accepts it: 1-64 of ``[A-Za-z0-9_.-]``."""

RESULT_ERROR_CODES = ("bad_kml", "bad_frame")
"""Why a ``kml_result`` carries ``error`` (and no results): the KML could not be parsed, or the
request frame had an id but no usable ``kmlResponse``. Nothing ran either way."""

RESOLVE_ERROR_CODES = ("not_uncertain", "unknown_execution", "running", "bad_ruling")
"""The codes of the ``error`` frame an executer answers a ``resolve`` it cannot apply with."""

RULINGS = ("rerun", "skipped", "applied")

ProgressEvent = Literal["tool_started", "tool_finished", "output"]


def valid_id(value: object) -> bool:
    """Whether ``value`` is an id the protocol allows (a request id, an executer id)."""
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


# -- frames from the server ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """``ready``: the server accepted the key; the executer serves ``project_id``."""

    role: str
    project_id: str
    executer_id: str | None


@dataclass(frozen=True, slots=True)
class KmlRequest:
    """``kml_request``: run ``kml`` (the document's ``kmlResponse``) and answer ``request_id``."""

    request_id: str
    kml: str


@dataclass(frozen=True, slots=True)
class Resolve:
    """``resolve``: a ruling on a *tool*'s uncertain execution."""

    execution_id: str
    resolution: str
    """As sent; the daemon checks it (``bad_ruling``), so the answer can echo what came."""
    request_id: str | None = None
    base_path: str | None = None


@dataclass(frozen=True, slots=True)
class Ping:
    ts: Any = None


@dataclass(frozen=True, slots=True)
class Pong:
    ts: Any = None


@dataclass(frozen=True, slots=True)
class ServerError:
    """An ``error`` frame from the server (``bad_frame``, ``forbidden``, ...)."""

    code: str
    message: str
    execution_id: str | None = None
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class OtherFrame:
    """A well-formed frame of a known type that is not for an executer (``auth``,
    ``kml_result``...): nothing to do but say so in the log."""

    type: str


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A frame the executer cannot use. ``request_id`` is set when it was a ``kml_request``
    with a valid id (so it can still be answered: ``kml_result`` with ``error.code``
    ``bad_frame``)."""

    reason: str
    request_id: str | None = None


Frame = Ready | KmlRequest | Resolve | Ping | Pong | ServerError | OtherFrame | BadFrame

_KNOWN = frozenset(
    {"auth", "kml_result", "kml_progress", "resolved"}  # frames that flow the other way
)


def parse_frame(text: str | bytes) -> Frame:
    """One frame from the server, typed; never raises (what is wrong is a :class:`BadFrame`)."""
    if isinstance(text, bytes):
        return BadFrame("a binary frame; every tunnel frame is JSON text")
    try:
        data = json.loads(text)
    except ValueError as exc:
        return BadFrame(f"not JSON ({exc})")
    if not isinstance(data, dict):
        return BadFrame(f"a JSON {type(data).__name__}, not an object")
    kind = data.get("type")
    if not isinstance(kind, str):
        return BadFrame("no string 'type'")
    if kind == "ready":
        role, project = data.get("role"), data.get("projectId")
        executer = data.get("executerId")
        if not isinstance(role, str) or not isinstance(project, str):
            return BadFrame("a ready frame without string 'role' and 'projectId'")
        return Ready(role, project, executer if isinstance(executer, str) else None)
    if kind == "kml_request":
        rid = data.get("executionId")
        if not valid_id(rid):
            return BadFrame(
                f"a kml_request whose executionId is not 1-128 of [A-Za-z0-9_.:-]: {rid!r:.80}"
            )
        assert isinstance(rid, str)
        body = data.get("kmlResponse")
        if not isinstance(body, str):
            return BadFrame("a kml_request without a string 'kmlResponse'", request_id=rid)
        return KmlRequest(rid, body)
    if kind == "resolve":
        eid, how = data.get("executionId"), data.get("resolution")
        rid, base = data.get("requestId"), data.get("basePath")
        if not isinstance(eid, str) or not eid:
            return BadFrame("a resolve frame without a string 'executionId'")
        if not isinstance(how, str):
            return BadFrame("a resolve frame without a string 'resolution'")
        if rid is not None and not isinstance(rid, str):
            return BadFrame("a resolve frame whose 'requestId' is not a string")
        if base is not None and not isinstance(base, str):
            return BadFrame("a resolve frame whose 'basePath' is not a string")
        return Resolve(eid, how, rid, base)
    if kind == "ping":
        return Ping(data.get("ts"))
    if kind == "pong":
        return Pong(data.get("ts"))
    if kind == "error":
        code, message = data.get("code"), data.get("message")
        eid, rid = data.get("executionId"), data.get("requestId")
        return ServerError(
            code if isinstance(code, str) else "?",
            message if isinstance(message, str) else "",
            eid if isinstance(eid, str) else None,
            rid if isinstance(rid, str) else None,
        )
    if kind in _KNOWN:
        return OtherFrame(kind)
    return BadFrame(f"an unknown frame type {kind!r:.40}")


# -- frames the executer sends ---------------------------------------------------------------------


class ResultError(TypedDict):
    """``kml_result.error``: why there are no results (``bad_kml``, ``bad_frame``)."""

    code: str
    message: str


def kml_result(
    request_id: str, results: Sequence[EntryDict], error: ResultError | None = None
) -> dict[str, Any]:
    """``{"type": "kml_result", "executionId", "results", "error"?}``, the document's frame."""
    frame: dict[str, Any] = {
        "type": "kml_result",
        "executionId": request_id,
        "results": list(results),
    }
    if error is not None:
        frame["error"] = {"code": error["code"], "message": error["message"]}
    return frame


def kml_progress(
    request_id: str,
    event: ProgressEvent,
    tool: str,
    tool_execution_id: str,
    *,
    success: bool | None = None,
    chunk: str | None = None,
) -> dict[str, Any]:
    """``kml_progress``: ``success`` only for ``tool_finished``, ``chunk`` only for ``output``."""
    frame: dict[str, Any] = {
        "type": "kml_progress",
        "executionId": request_id,
        "event": event,
        "tool": tool,
        "toolExecutionId": tool_execution_id,
    }
    if event == "tool_finished" and success is not None:
        frame["success"] = success
    if event == "output" and chunk is not None:
        frame["chunk"] = chunk
    return frame


def resolved(execution_id: str, resolution: str, request_id: str | None) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "type": "resolved",
        "executionId": execution_id,
        "resolution": resolution,
    }
    if request_id is not None:
        frame["requestId"] = request_id
    return frame


def error(
    code: str,
    message: str,
    *,
    execution_id: str | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if execution_id is not None:
        frame["executionId"] = execution_id
    if request_id is not None:
        frame["requestId"] = request_id
    return frame


def ping() -> dict[str, Any]:
    return {"type": "ping"}


def pong(ts: Any = None) -> dict[str, Any]:
    return {"type": "pong"} if ts is None else {"type": "pong", "ts": ts}


def encode(frame: dict[str, Any]) -> str:
    """One frame as the JSON text that goes on the wire."""
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


# -- the URL ----------------------------------------------------------------------------------


def executer_url(ws_url: str, executer_id: str) -> str:
    """``ws_url`` with ``role=executer`` and ``executerId`` in its query (other parameters
    kept). Raises :class:`~kyronix.errors.KyronixUsageError` for a URL that is not
    ``ws://`` or ``wss://`` with a host, or an executer id the protocol does not allow."""
    if not isinstance(ws_url, str):
        raise KyronixUsageError(f"ws_url is a ws:// or wss:// URL, got {type(ws_url).__name__}")
    parts = urlsplit(ws_url.strip())
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise KyronixUsageError(
            f"ws_url must be a ws:// or wss:// URL with a host, such as "
            f"ws://localhost:8080/ws; got {ws_url!r}"
        )
    if not isinstance(executer_id, str) or not EXECUTER_ID_PATTERN.fullmatch(executer_id):
        raise KyronixUsageError(
            f"an executer id is 1 to 64 letters, digits, '_', '.' or '-'; got {executer_id!r}"
        )
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("role", "executerId")]
    query += [("role", "executer"), ("executerId", executer_id)]
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(query), ""))


def shown_url(ws_url: str) -> str:
    """The URL as the daemon prints it: no query string, no credentials in the netloc."""
    parts = urlsplit(ws_url.strip())
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# -- reconnecting -------------------------------------------------------------------------------


class Backoff:
    """When to try again: the n-th delay in a row is drawn from ``[d/2, d]`` with
    ``d = min(cap_s, base_s * 2**n)`` (exponential, with jitter so many executers dropped at
    once do not all come back at once). :meth:`reset` starts over: the daemon calls it once a
    connection has been up for ``stable_s`` seconds."""

    def __init__(
        self,
        base_s: float = 0.5,
        cap_s: float = 30.0,
        *,
        stable_s: float = 10.0,
        rng: random.Random | None = None,
    ) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise KyronixUsageError(
                f"backoff needs 0 < base_s <= cap_s, got base_s={base_s}, cap_s={cap_s}"
            )
        self.base_s = base_s
        self.cap_s = cap_s
        self.stable_s = stable_s
        self.attempt = 0
        self._rng = rng if rng is not None else random.Random()

    def ceiling(self, attempt: int) -> float:
        """The largest delay of the ``attempt``-th retry in a row (0-based)."""
        if attempt >= 64:
            return self.cap_s
        return min(self.cap_s, self.base_s * float(2**attempt))

    def next_delay(self) -> float:
        top = self.ceiling(self.attempt)
        self.attempt += 1
        return top / 2 + self._rng.uniform(0, top / 2)

    def reset(self) -> None:
        self.attempt = 0

    def connection_ended(self, lasted_s: float) -> None:
        """A connection that lasted ``stable_s`` or more resets the schedule."""
        if lasted_s >= self.stable_s:
            self.reset()
