"""The tunnel's wire format (docs/tunnel.md), once, for the server, the executer and the SDK.

Standard library only (and :mod:`kyronix.errors`): the runtime SDK imports it without the
server's dependencies (ARCHITECTURE.md rule 6). Nothing here does I/O.

* **Ids and limits**: :data:`REQUEST_ID` (a request's ``executionId``, a resolve's
  ``requestId``), :data:`EXECUTER_ID`, the close codes, the longest timeout.
* **Result entries**: :class:`EntryDict` and :class:`ResultDict`, the document's
  ``{tool, args, result}``: what the executer produces, the server records and the SDK returns.
* **Reading a frame**: :func:`parse` turns one text frame into a typed value (:class:`Auth`,
  :class:`Ready`, :class:`KmlRequest`, :class:`KmlResult`, :class:`KmlProgress`,
  :class:`Resolve`, :class:`Resolved`, :class:`Ping`, :class:`Pong`, :class:`ErrorFrame`), or a
  :class:`BadFrame` saying what was wrong. It never raises: a hostile frame (not JSON, nested
  past :data:`MAX_DEPTH`, a field of the wrong type) is a :class:`BadFrame`, and the connection
  that sent it lives on.
* **Writing a frame**: one builder per frame type (:func:`kml_request`, :func:`kml_result`...)
  and :func:`encode`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Required, TypedDict

from kyronix.errors import KyronixUsageError

__all__ = [
    "CLOSE_CLAIMED",
    "CLOSE_RATE_LIMITED",
    "CLOSE_REPLACED",
    "CLOSE_SILENT",
    "CLOSE_UNAUTHORIZED",
    "DEFAULT_EXECUTER",
    "DEFAULT_TIMEOUT_S",
    "EXECUTER_ID",
    "HEARTBEAT_S",
    "MAX_DEPTH",
    "MAX_TIMEOUT_S",
    "PROGRESS_EVENTS",
    "REQUEST_ID",
    "RESOLVE_ERROR_CODES",
    "RESULT_ERROR_CODES",
    "ROLES",
    "RULINGS",
    "SENT_BY",
    "SILENT_S",
    "Auth",
    "BadFrame",
    "EntryDict",
    "ErrorFrame",
    "Frame",
    "KmlProgress",
    "KmlRequest",
    "KmlResult",
    "Ping",
    "Pong",
    "ProgressEvent",
    "Ready",
    "Resolve",
    "Resolved",
    "ResultDict",
    "ResultError",
    "Role",
    "as_dict",
    "auth",
    "decode",
    "encode",
    "error",
    "from_dict",
    "kml_progress",
    "kml_request",
    "kml_result",
    "parse",
    "ping",
    "pong",
    "ready",
    "resolve",
    "resolved",
    "valid_executer_id",
    "valid_id",
]

# --------------------------------------------------------------------------- ids and limits

REQUEST_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""A request id (a ``kml_request``'s ``executionId``, a ``resolve``'s ``requestId``), and the
tool execution id a ``resolve`` names: 1-128 of ``[A-Za-z0-9_.:-]``."""
EXECUTER_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""An executer id: 1-64 of ``[A-Za-z0-9_.-]``."""
DEFAULT_EXECUTER = "default"
"""The executer id of an executer that names none."""
Role = Literal["executer", "runtime"]
ROLES: tuple[Role, ...] = ("executer", "runtime")
RULINGS = ("rerun", "skipped", "applied")
"""What a person may rule on an uncertain execution."""
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 3600.0
"""The longest a ``kml_request`` may ask to wait."""
MAX_DEPTH = 64
"""How deeply a frame's JSON may nest (a result's ``data`` included)."""
HEARTBEAT_S = 15.0
"""How often each side pings."""
SILENT_S = 45.0
"""An executer heard nothing from for this long (three heartbeats) is gone."""
CLOSE_REPLACED = 4000
"""Another connection of the same executer (same key) took its place."""
CLOSE_UNAUTHORIZED = 4401
"""The key was refused (missing, unknown, revoked), or revoked while connected."""
CLOSE_CLAIMED = 4409
"""The executer id is held by a live connection of another key of the project."""
CLOSE_SILENT = 4408
"""Nothing heard from the executer for too long."""
CLOSE_RATE_LIMITED = 4429
"""Too many failed authentications from this address: try again after the reason's seconds."""
RESULT_ERROR_CODES = ("bad_kml", "bad_frame", "executer_error")
"""Why a ``kml_result`` carries ``error`` (and no results): nothing ran."""
RESOLVE_ERROR_CODES = ("not_uncertain", "unknown_execution", "running", "bad_ruling")
"""The codes of the ``error`` frame an executer answers a ``resolve`` it cannot apply with."""
ProgressEvent = Literal["tool_started", "tool_finished", "output"]
PROGRESS_EVENTS: tuple[ProgressEvent, ...] = ("tool_started", "tool_finished", "output")
SENT_BY: dict[Role, frozenset[str]] = {
    "runtime": frozenset({"kml_request", "resolve", "ping", "pong"}),
    "executer": frozenset({"kml_result", "kml_progress", "resolved", "error", "ping", "pong"}),
}
"""The frames each role may send the server (after authenticating)."""


def valid_id(value: object) -> bool:
    """Whether ``value`` is a request id (or a tool execution id) the protocol allows."""
    return isinstance(value, str) and REQUEST_ID.fullmatch(value) is not None


def valid_executer_id(value: object) -> bool:
    return isinstance(value, str) and EXECUTER_ID.fullmatch(value) is not None


# --------------------------------------------------------------------------- result entries


class ResultDict(TypedDict, total=False):
    """The ``result`` of an entry, as the document shapes it (camelCase keys)."""

    success: Required[bool]
    output: Required[str]
    executionId: Required[str]
    ms: Required[int]
    error: str
    """What went wrong and what to do (a refusal starts with ``SecurityError:``)."""
    errorType: str
    data: dict[str, Any]
    """Structured output: entries, status, an exit code..."""
    truncated: bool
    """The output was capped (by the tool, or when the receipt was stored)."""
    uncertain: bool
    """Started and never finished, and no process holds it any more: not run again."""
    running: bool
    """Started, and a live process still runs it (``pid``): not run again, not ruled on yet."""
    pid: int
    """With ``running``: the process that runs it."""
    skipped: bool
    """Not run: an earlier tool stopped the envelope."""
    resolved: Literal["skipped", "applied"]
    """A person's ruling, replayed."""
    stored: dict[str, dict[str, Any]]
    """Replayed from a receipt whose texts were cut to the store's cap: for each cut field
    (``output``, ``error``, ``data.body``...), its full ``length`` and its ``sha256``."""


class EntryDict(TypedDict):
    """One entry of ``execute()``'s list and of a ``kml_result``: ``{tool, args, result}``."""

    tool: str
    args: dict[str, Any]
    result: ResultDict


class ResultError(TypedDict):
    """``kml_result.error``: why there are no results (:data:`RESULT_ERROR_CODES`)."""

    code: str
    message: str


# --------------------------------------------------------------------------- frames, typed


@dataclass(frozen=True, slots=True)
class Auth:
    """``auth``: the first frame of a connection that sent no ``Authorization`` header."""

    api_key: str
    role: str
    """As sent; the server checks it against :data:`ROLES`."""
    executer_id: str | None = None


@dataclass(frozen=True, slots=True)
class Ready:
    """``ready``: the server accepted the key; the connection serves ``project_id``."""

    role: str
    project_id: str
    executer_id: str | None = None


@dataclass(frozen=True, slots=True)
class KmlRequest:
    """``kml_request``: run ``kml`` (the document's ``kmlResponse``) and answer ``request_id``.
    From a runtime client also ``executer_id``, ``timeout`` (seconds) and ``session_id``."""

    request_id: str
    kml: str
    executer_id: str | None = None
    timeout: float | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class KmlResult:
    """``kml_result``: the answer to request ``request_id``: its entries, or ``error`` when
    nothing ran."""

    request_id: str
    results: tuple[EntryDict, ...]
    error: ResultError | None = None


@dataclass(frozen=True, slots=True)
class KmlProgress:
    """``kml_progress``: one step of a request while it runs."""

    request_id: str
    event: ProgressEvent
    tool: str
    tool_execution_id: str
    success: bool | None = None
    chunk: str | None = None


@dataclass(frozen=True, slots=True)
class Resolve:
    """``resolve``: a ruling on a *tool*'s uncertain execution."""

    execution_id: str
    resolution: str
    """As sent; checked against :data:`RULINGS` by whoever applies it (``bad_ruling``)."""
    request_id: str | None = None
    base_path: str | None = None
    executer_id: str | None = None


@dataclass(frozen=True, slots=True)
class Resolved:
    """``resolved``: a ruling was applied."""

    execution_id: str
    resolution: str
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Ping:
    ts: Any = None


@dataclass(frozen=True, slots=True)
class Pong:
    ts: Any = None


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    """``error``: ``code`` and ``message``, for a request or a resolve when it names one."""

    code: str
    message: str
    execution_id: str | None = None
    request_id: str | None = None
    retry_after: float | None = None
    """Seconds to wait before sending again (``rate_limited``)."""


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A frame that is not what docs/tunnel.md says. ``request_id`` is set when it was a
    ``kml_request`` with a valid id (so it can still be answered)."""

    reason: str
    request_id: str | None = None


Frame = (
    Auth
    | Ready
    | KmlRequest
    | KmlResult
    | KmlProgress
    | Resolve
    | Resolved
    | Ping
    | Pong
    | ErrorFrame
)


class _Bad(KyronixUsageError):
    def __init__(self, reason: str, request_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.request_id = request_id


class _NonFinite:
    """What ``NaN``, ``Infinity`` and a number too large for a float decode to while a frame is
    read: the frame is refused (relayed, stored or shown, it would be JSON nobody else can
    read: PostgreSQL's ``jsonb``, a browser's ``JSON.parse``)."""

    def __repr__(self) -> str:
        return "NaN"


_NONFINITE = _NonFinite()
NONFINITE_REASON = "a number JSON has no place for (NaN, Infinity, or too large for a float)"


def _too_deep(value: object, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` (iterative: no recursion to exhaust)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def decode(text: str | bytes | bytearray | None) -> dict[str, Any] | BadFrame:
    """One frame as a JSON object with a string ``type``, its nesting within
    :data:`MAX_DEPTH` and every number finite, or a :class:`BadFrame` (its fields are checked
    by :func:`from_dict`). The checks cost little beside the parse: nesting is walked only when
    the text has more brackets than the limit, and numbers are looked at as they are read."""
    if text is None:
        return BadFrame("send JSON text frames")
    if not isinstance(text, str):
        return BadFrame("a binary frame; every tunnel frame is JSON text")
    nonfinite: list[str] = []

    def constant(name: str) -> Any:
        nonfinite.append(name)
        return _NONFINITE

    def number(literal: str) -> Any:
        value = float(literal)
        if math.isinf(value):
            nonfinite.append(literal[:20])
            return _NONFINITE
        return value

    try:
        data = json.loads(text, parse_constant=constant, parse_float=number)
    except RecursionError:  # the parser's own bound on nesting (200,000 '[' in a frame)
        return BadFrame(f"the frame's JSON nests deeper than {MAX_DEPTH} levels")
    except ValueError as exc:
        return BadFrame(f"not JSON ({str(exc)[:120]})")
    if not isinstance(data, dict):
        kind = "number" if data is _NONFINITE else type(data).__name__
        return BadFrame(f"a JSON {kind}, not an object with a 'type'")
    if not isinstance(data.get("type"), str):
        return BadFrame('a frame is a JSON object with a string "type"')
    if text.count("[") + text.count("{") > MAX_DEPTH and _too_deep(data, MAX_DEPTH):
        return BadFrame(f"the frame's JSON nests deeper than {MAX_DEPTH} levels")
    if nonfinite:  # what a field says is wrong with it, else where it went wrong
        try:
            typed = _typed(data)
        except _Bad as exc:
            return BadFrame(exc.reason, exc.request_id)
        request_id = getattr(typed, "request_id", None)
        return BadFrame(NONFINITE_REASON, request_id if isinstance(request_id, str) else None)
    return data


def parse(text: str | bytes | bytearray | None) -> Frame | BadFrame:
    """One frame, typed; never raises (what is wrong is a :class:`BadFrame`)."""
    data = decode(text)
    if isinstance(data, BadFrame):
        return data
    return from_dict(data, decoded=True)


def from_dict(data: Mapping[str, Any], *, decoded: bool = False) -> Frame | BadFrame:
    """A frame already decoded from JSON (a mailbox row's; ``decoded``: by :func:`decode`, its
    nesting checked already), typed; never raises."""
    if not isinstance(data, Mapping) or not isinstance(data.get("type"), str):
        return BadFrame('a frame is a JSON object with a string "type"')
    frame = data if isinstance(data, dict) else dict(data)
    if not decoded and _too_deep(frame, MAX_DEPTH):
        return BadFrame(f"the frame's JSON nests deeper than {MAX_DEPTH} levels")
    try:
        return _typed(frame)
    except _Bad as exc:
        return BadFrame(exc.reason, exc.request_id)


def as_dict(frame: Frame) -> dict[str, Any]:
    """The frame as the dict that goes on the wire (the inverse of :func:`from_dict`)."""
    if isinstance(frame, KmlResult):
        return kml_result(frame.request_id, frame.results, frame.error)
    if isinstance(frame, KmlProgress):
        return kml_progress(
            frame.request_id, frame.event, frame.tool, frame.tool_execution_id,
            success=frame.success, chunk=frame.chunk,
        )  # fmt: skip
    if isinstance(frame, ErrorFrame):
        extra = {} if frame.retry_after is None else {"retryAfter": frame.retry_after}
        return error(
            frame.code, frame.message, execution_id=frame.execution_id,
            request_id=frame.request_id, **extra,
        )  # fmt: skip
    if isinstance(frame, KmlRequest):
        return kml_request(
            frame.request_id, frame.kml, executer_id=frame.executer_id, timeout=frame.timeout,
            session_id=frame.session_id,
        )  # fmt: skip
    if isinstance(frame, Resolve):
        out = resolve(
            frame.execution_id, frame.resolution, frame.request_id or "",
            executer_id=frame.executer_id, base_path=frame.base_path,
        )  # fmt: skip
        if frame.request_id is None:
            del out["requestId"]
        return out
    if isinstance(frame, Resolved):
        return resolved(frame.execution_id, frame.resolution, frame.request_id)
    if isinstance(frame, Ready):
        return ready(frame.role, frame.project_id, frame.executer_id)
    if isinstance(frame, Auth):
        out = {"type": "auth", "apiKey": frame.api_key, "role": frame.role}
        if frame.executer_id is not None:
            out["executerId"] = frame.executer_id
        return out
    if isinstance(frame, Ping):
        return ping(frame.ts)
    return pong(frame.ts)


def _str(data: Mapping[str, Any], name: str, pattern: re.Pattern[str] | None = None) -> str:
    value = data.get(name)
    if not isinstance(value, str) or (pattern is not None and not pattern.fullmatch(value)):
        want = f"a string matching {pattern.pattern}" if pattern is not None else "a string"
        raise _Bad(f"{data['type']}: {name!r} must be {want}")
    return value


def _opt(data: Mapping[str, Any], name: str, pattern: re.Pattern[str] | None = None) -> str | None:
    if data.get(name) is None:
        return None
    return _str(data, name, pattern)


def _typed(data: dict[str, Any]) -> Frame:
    kind = data["type"]
    parse_one = _PARSERS.get(kind)
    if parse_one is None:
        raise _Bad(f"unknown frame type {kind!r:.40}")
    return parse_one(data)


def _auth(data: dict[str, Any]) -> Frame:
    role = data.get("role", "runtime")
    if not isinstance(role, str):
        raise _Bad("auth: 'role' must be executer or runtime")
    return Auth(_str(data, "apiKey"), role, _opt(data, "executerId", EXECUTER_ID))


def _ready(data: dict[str, Any]) -> Frame:
    return Ready(_str(data, "role"), _str(data, "projectId"), _opt(data, "executerId", EXECUTER_ID))


def _kml_request(data: dict[str, Any]) -> Frame:
    rid = data.get("executionId")
    if not valid_id(rid):
        raise _Bad(f"kml_request: 'executionId' must be 1-128 of [A-Za-z0-9_.:-], not {rid!r:.80}")
    assert isinstance(rid, str)
    kml = data.get("kmlResponse")
    if not isinstance(kml, str):
        raise _Bad("kml_request: 'kmlResponse' must be a string of KML", request_id=rid)
    timeout = data.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_TIMEOUT_S
    ):
        raise _Bad(
            f"kml_request: 'timeout' must be seconds, more than 0 and at most {MAX_TIMEOUT_S:g}",
            request_id=rid,
        )
    session = data.get("sessionId")
    if session is not None and (not isinstance(session, str) or not valid_id(session)):
        raise _Bad("kml_request: 'sessionId' must be a session's id (sess_…)", request_id=rid)
    try:
        executer = _opt(data, "executerId", EXECUTER_ID)
    except _Bad as exc:
        raise _Bad(exc.reason, request_id=rid) from None
    return KmlRequest(rid, kml, executer, float(timeout) if timeout is not None else None, session)


def _kml_result(data: dict[str, Any]) -> Frame:
    rid = _str(data, "executionId", REQUEST_ID)
    results = data.get("results")
    if not isinstance(results, list):
        raise _Bad("kml_result: 'results' must be a list")
    for entry in results:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("tool"), str)
            or not isinstance(entry.get("result"), dict)
            or not isinstance(entry.get("args", {}), dict)
        ):
            raise _Bad("kml_result: each entry of 'results' is {tool, args, result}")
    problem = data.get("error")
    error_: ResultError | None = None
    if problem is not None:
        if not isinstance(problem, dict) or not isinstance(problem.get("code"), str):
            raise _Bad("kml_result: 'error' must be {code, message}")
        message = problem.get("message")
        error_ = {"code": problem["code"], "message": message if isinstance(message, str) else ""}
    entries: tuple[EntryDict, ...] = tuple(results)
    return KmlResult(rid, entries, error_)


def _kml_progress(data: dict[str, Any]) -> Frame:
    rid = _str(data, "executionId", REQUEST_ID)
    event = data.get("event")
    if event not in PROGRESS_EVENTS:
        raise _Bad(f"kml_progress: 'event' must be one of {', '.join(PROGRESS_EVENTS)}")
    success = data.get("success") if event == "tool_finished" else None
    chunk = data.get("chunk") if event == "output" else None
    return KmlProgress(
        rid,
        event,
        _str(data, "tool"),
        _str(data, "toolExecutionId"),
        success if isinstance(success, bool) else None,
        chunk if isinstance(chunk, str) else None,
    )


def _resolve(data: dict[str, Any]) -> Frame:
    eid = _str(data, "executionId", REQUEST_ID)
    how = data.get("resolution")
    if not isinstance(how, str):
        raise _Bad("resolve: 'resolution' must be rerun, skipped or applied")
    return Resolve(
        eid,
        how,
        _opt(data, "requestId", REQUEST_ID),
        _opt(data, "basePath"),
        _opt(data, "executerId", EXECUTER_ID),
    )


def _resolved(data: dict[str, Any]) -> Frame:
    return Resolved(
        _str(data, "executionId", REQUEST_ID),
        _str(data, "resolution"),
        _opt(data, "requestId", REQUEST_ID),
    )


def _ping(data: dict[str, Any]) -> Frame:
    return Ping(data.get("ts"))


def _pong(data: dict[str, Any]) -> Frame:
    return Pong(data.get("ts"))


def _error(data: dict[str, Any]) -> Frame:
    code, message = data.get("code"), data.get("message")
    eid, rid = data.get("executionId"), data.get("requestId")
    after = data.get("retryAfter")
    return ErrorFrame(
        code if isinstance(code, str) and code else "unknown_error",
        message if isinstance(message, str) else "",
        eid if valid_id(eid) else None,
        rid if valid_id(rid) else None,
        float(after)
        if isinstance(after, int | float) and not isinstance(after, bool) and after >= 0
        else None,
    )


_PARSERS = {
    "auth": _auth,
    "ready": _ready,
    "kml_request": _kml_request,
    "kml_result": _kml_result,
    "kml_progress": _kml_progress,
    "resolve": _resolve,
    "resolved": _resolved,
    "ping": _ping,
    "pong": _pong,
    "error": _error,
}


# --------------------------------------------------------------------------- frames, built


def encode(frame: Mapping[str, Any]) -> str:
    """One frame as the JSON text that goes on the wire (ASCII: a lone surrogate a tool's output
    carries is escaped, never a frame that cannot be sent)."""
    return json.dumps(frame, separators=(",", ":"))


def auth(api_key: str, role: Role = "runtime", executer_id: str | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "auth", "apiKey": api_key, "role": role}
    if executer_id is not None:
        frame["executerId"] = executer_id
    return frame


def ready(role: str, project_id: str, executer_id: str | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "ready", "role": role, "projectId": project_id}
    if executer_id is not None:
        frame["executerId"] = executer_id
    return frame


def kml_request(
    request_id: str,
    kml: str,
    *,
    executer_id: str | None = None,
    timeout: float | None = None,
    session_id: str | None = None,
) -> dict[str, Any]:
    """``{"type": "kml_request", "executionId", "kmlResponse"}``, the document's frame, with
    the runtime's optional ``executerId``, ``timeout`` and ``sessionId``."""
    frame: dict[str, Any] = {"type": "kml_request", "executionId": request_id, "kmlResponse": kml}
    if timeout is not None:
        frame["timeout"] = timeout
    if executer_id is not None:
        frame["executerId"] = executer_id
    if session_id is not None:
        frame["sessionId"] = session_id
    return frame


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


def resolve(
    execution_id: str,
    resolution: str,
    request_id: str,
    *,
    executer_id: str | None = None,
    base_path: str | None = None,
) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "type": "resolve",
        "executionId": execution_id,
        "resolution": resolution,
        "requestId": request_id,
    }
    if executer_id is not None:
        frame["executerId"] = executer_id
    if base_path is not None:
        frame["basePath"] = base_path
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
    **extra: Any,
) -> dict[str, Any]:
    """``{"type": "error", "code", "message", "executionId"?, "requestId"?}`` (+ ``extra``:
    ``retryAfter`` for ``rate_limited``)."""
    frame: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if execution_id is not None:
        frame["executionId"] = execution_id
    if request_id is not None:
        frame["requestId"] = request_id
    frame.update(extra)
    return frame


def ping(ts: Any = None) -> dict[str, Any]:
    return {"type": "ping"} if ts is None else {"type": "ping", "ts": ts}


def pong(ts: Any = None) -> dict[str, Any]:
    return {"type": "pong"} if ts is None else {"type": "pong", "ts": ts}
