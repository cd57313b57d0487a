"""The executer's side of the tunnel (docs/tunnel.md), with no I/O at all.

The wire format itself (ids, codes, the typed frames, the parser and the builders) is
:mod:`kyronix.wire`, shared with the server and the SDK; this module is what the daemon
(:mod:`kyronix.executer.daemon`) adds to it, pure and testable on its own:

- :func:`parse_frame` is :func:`kyronix.wire.parse` as the executer reads it: a frame that flows
  the other way (``auth``, ``kml_result``, ``kml_progress``, ``resolved``) becomes an
  :class:`OtherFrame`; the others are wire's typed values (:class:`Ready`, :class:`KmlRequest`,
  :class:`Resolve`, :class:`Ping`, :class:`Pong`, :class:`ServerError`) or a :class:`BadFrame`
  that says what was wrong;
- the builders the executer sends with (:func:`kml_result`, :func:`kml_progress`,
  :func:`resolved`, :func:`error`, :func:`ping`, :func:`pong`, :func:`encode`) are wire's;
- :func:`executer_url` adds ``role=executer`` and ``executerId`` to the server's ``/ws`` URL;
- :class:`Backoff` is the reconnect schedule: exponential from 0.5 s, capped at 30 s, with
  jitter, reset after a stable connection.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from kyronix import wire
from kyronix.errors import KyronixUsageError
from kyronix.wire import (
    BadFrame,
    KmlRequest,
    Ping,
    Pong,
    ProgressEvent,
    Ready,
    Resolve,
    ResultError,
    encode,
    error,
    kml_progress,
    kml_result,
    ping,
    pong,
    resolved,
    valid_id,
)

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

ID_PATTERN = wire.REQUEST_ID
EXECUTER_ID_PATTERN = wire.EXECUTER_ID
RESULT_ERROR_CODES = wire.RESULT_ERROR_CODES
RESOLVE_ERROR_CODES = wire.RESOLVE_ERROR_CODES
RULINGS = wire.RULINGS
ServerError = wire.ErrorFrame
"""An ``error`` frame from the server (``bad_frame``, ``forbidden``, ...)."""


# -- frames from the server ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OtherFrame:
    """A well-formed frame of a known type that is not for an executer (``auth``,
    ``kml_result``...): nothing to do but say so in the log."""

    type: str


Frame = Ready | KmlRequest | Resolve | Ping | Pong | ServerError | OtherFrame | BadFrame

_OTHER_WAY: dict[type, str] = {  # frames that flow the other way
    wire.Auth: "auth",
    wire.KmlResult: "kml_result",
    wire.KmlProgress: "kml_progress",
    wire.Resolved: "resolved",
}


def parse_frame(text: str | bytes) -> Frame:
    """One frame from the server, typed; never raises (what is wrong is a :class:`BadFrame`;
    a ``kml_request`` with a valid id keeps it in ``request_id``, so it can still be answered:
    ``kml_result`` with ``error.code`` ``bad_frame``)."""
    frame = wire.parse(text)
    if isinstance(frame, wire.Auth | wire.KmlResult | wire.KmlProgress | wire.Resolved):
        return OtherFrame(_OTHER_WAY[type(frame)])
    return frame


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
    if not wire.valid_executer_id(executer_id):
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
