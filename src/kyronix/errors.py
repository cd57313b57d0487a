"""The exception tree of Kyronix: one root, four families, every message actionable.

::

    KyronixError                       root of everything Kyronix raises on purpose;
     |                                 .status_code (None unless HTTP) and .details ({})
     +-- KyronixUsageError             misuse: a bad argument, value, plan or call order
     |    |                            (also a ValueError)
     |    +-- KyronixTypeError         a value of the wrong kind (also a TypeError)
     |    +-- UnsupportedError         something not built yet (the message says what to use
     |    |                            instead; also a NotImplementedError)
     |    +-- RunningLoopError         execute_sync() inside a running event loop
     |    |                            (also a RuntimeError, as from asyncio.run)
     |    +-- KmlError                 malformed or truncated KML: nothing ran     (kyronix.kml)
     |    +-- ReceiptError             what was asked does not fit the execution's receipt
     |         +-- ReceiptConflict *   the executionId already names a different call
     |         +-- UnknownExecutionError  no receipt for that executionId (also a KeyError)
     |         +-- NotUncertainError   resolve() on an execution that is not uncertain
     |         +-- ExecutionRunningError  resolve() on an execution a live process still runs
     +-- KyronixRunError               an operation could not go on
     |    +-- ReceiptStoreError        the receipt store cannot be opened or written
     |    |                            (also a RuntimeError)
     |    +-- APIError                 the server answered with an error: .code, .status_code,
     |    |    |                       .details (the body {"error": {code, message, details}})
     |    |    +-- AuthenticationError       401: missing, malformed, unknown or revoked key
     |    |    +-- InsufficientCreditsError  402: details required, available, held
     |    |    +-- NotFoundError             404: no such agent, session, run, custom agent
     |    |    |    +-- ProjectNotFoundError 404 project_not_found: not this key's project
     |    |    +-- ConflictError             409: session_busy, idempotency_in_flight
     |    |    +-- RateLimitError            429: .retry_after (seconds, from Retry-After)
     |    |    +-- TunnelError               an `error` frame of the WebSocket tunnel
     |    |         +-- NoExecuterError            no_executer: no executer connected
     |    |         +-- ExecuterDisconnectedError  executer_disconnected, not back in time
     |    +-- APIConnectionError       the server could not be reached, or the connection
     |         |                       dropped, after every retry (.code connection_error)
     |         +-- APITimeoutError     no answer in time (an HTTP timeout, or the tunnel's
     |                                 `timeout`; .code timeout)
     +-- KyronixRefusedError           refused by policy: a permission, the path sandbox,
     |    |                            the network guard
     |    +-- SecurityError *          one tool call refused; errorType "SecurityError"
     +-- KyronixSignal                 control flow, not an escape: caught where it is expected
          +-- ToolFailure              ends one tool call with a failure result
                                       ({success: false, error, errorType}); never leaves
                                       execute()

    * also a ToolFailure: raised inside the executer's pipeline, it becomes that call's result
      entry (errorType "SecurityError" / "ReceiptConflict") instead of escaping.

A caller that only wants to report Kyronix's errors catches :class:`KyronixError`; one that
wants to tell misuse from a failure catches the family. The runtime SDK (:mod:`kyronix.client`)
raises the :class:`APIError` and :class:`APIConnectionError` families (exported from
:mod:`kyronix`), each keeping the server's ``code``, message and ``details``. The subclasses
that are also a builtin (``ValueError``, ``TypeError``, ``KeyError``, ``RuntimeError``,
``NotImplementedError``) are so because callers caught that builtin before the tree existed;
nothing else bare is raised on purpose. Errors of kiso raised underneath (its path sandbox, its
ruling parser) are turned into these at the boundary, so a Kyronix caller needs only this tree.

This module imports nothing but the standard library: the KML parser and the runtime SDK use
it without pulling in the executer or kiso.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AuthenticationError",
    "ConflictError",
    "ExecuterDisconnectedError",
    "ExecutionRunningError",
    "InsufficientCreditsError",
    "KmlError",
    "KyronixError",
    "KyronixRefusedError",
    "KyronixRunError",
    "KyronixSignal",
    "KyronixTypeError",
    "KyronixUsageError",
    "NoExecuterError",
    "NotFoundError",
    "NotUncertainError",
    "ProjectNotFoundError",
    "RateLimitError",
    "ReceiptConflict",
    "ReceiptError",
    "ReceiptStoreError",
    "RunningLoopError",
    "SecurityError",
    "ToolFailure",
    "TunnelError",
    "UnknownExecutionError",
    "UnsupportedError",
]


class KyronixError(Exception):
    """Root of every error Kyronix raises on purpose.

    ``status_code`` is the HTTP status an error of the server's API came with (None for errors
    that never crossed HTTP); ``details`` is structured context (``{}`` when there is none).
    """

    status_code: int | None = None

    def __init__(
        self,
        message: str = "",
        *,
        status_code: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code
        self.details: dict[str, Any] = dict(details) if details else {}


# -- the families ------------------------------------------------------------------------------


class KyronixUsageError(KyronixError, ValueError):
    """Misuse: an argument, a value, a plan or the order of calls is wrong."""


class KyronixRunError(KyronixError):
    """An operation could not go on (the message says why and what to do next)."""


class KyronixRefusedError(KyronixError):
    """A policy refused: a permission, the path sandbox, the network guard."""


class KyronixSignal(KyronixError):
    """Control flow rather than an escape: raised to end something, caught where expected."""


# -- misuse ------------------------------------------------------------------------------------


class KyronixTypeError(KyronixUsageError, TypeError):
    """A value of the wrong kind: a handler that is not callable, a policy that is not one."""


class UnsupportedError(KyronixUsageError, NotImplementedError):
    """Something that is not built yet was asked for (the message says what to use instead)."""


class RunningLoopError(KyronixUsageError, RuntimeError):
    """A synchronous entry point was called inside a running event loop; await the async one."""


class KmlError(KyronixUsageError):
    """A KML text that cannot be executed: malformed, or truncated (nothing may run)."""

    def __init__(self, offset: int, expected: str, detail: str = "") -> None:
        self.offset = offset
        self.expected = expected
        self.detail = detail
        msg = f"at offset {offset}: expected {expected}"
        super().__init__(
            f"{msg} ({detail})" if detail else msg,
            details={"offset": offset, "expected": expected, "detail": detail},
        )


class ReceiptError(KyronixUsageError):
    """What was asked of an execution does not fit what its receipt records."""


class UnknownExecutionError(ReceiptError, KeyError):
    """No receipt is recorded for that ``executionId`` under that base path."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class NotUncertainError(ReceiptError):
    """Only an uncertain execution (started, never finished) can be resolved."""


class ExecutionRunningError(ReceiptError):
    """The execution is still running: a live process (the executer that started it, or a
    command it started) holds its liveness guard, so nobody can tell yet whether it applied. It
    cannot be ruled on until it ends. ``details`` has ``executionId`` and ``pid``."""


# -- run failures ------------------------------------------------------------------------------


class ReceiptStoreError(KyronixRunError, RuntimeError):
    """The receipt store cannot be opened, read or written (a damaged file, a full disk)."""


class APIError(KyronixRunError):
    """The Kyronix server answered with an error (over HTTP, or a frame of the tunnel).

    ``code`` is the server's error code (``invalid_request``, ``session_busy``, ...), the
    message is the server's, ``details`` its structured context and ``status_code`` the HTTP
    status (None for the tunnel's frames). ``headers`` holds the response's headers, when there
    was a response.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status_code: int | None = None,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, status_code=status_code, details=details)
        self.code = code
        self.headers: dict[str, str] = dict(headers) if headers else {}

    def __str__(self) -> str:
        where = f"{self.status_code} " if self.status_code is not None else ""
        return f"{self.message} ({where}{self.code})"


class AuthenticationError(APIError):
    """401: the API key is missing, malformed, unknown or revoked (check ``KYRONIX_API_KEY``)."""


class InsufficientCreditsError(APIError):
    """402: the project cannot cover the run's hold; ``details`` has ``required``,
    ``available`` and ``held``."""


class NotFoundError(APIError):
    """404: no such agent, session, run or custom agent in this key's project."""


class ProjectNotFoundError(NotFoundError):
    """404 ``project_not_found``: the ``project_id`` is not the API key's project."""


class ConflictError(APIError):
    """409: ``session_busy`` (the session is running a request) or ``idempotency_in_flight``."""


class RateLimitError(APIError):
    """429: too many requests for this API key; ``retry_after`` is the seconds the server
    asked to wait (None if it did not say)."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status_code: int | None = None,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(
            message, code=code, status_code=status_code, details=details, headers=headers
        )
        self.retry_after = retry_after


class TunnelError(APIError):
    """The WebSocket tunnel answered a request with an ``error`` frame; ``code`` is the
    frame's (``bad_frame``, ``forbidden``, or what the executer answered to a ``resolve``:
    ``not_uncertain``, ``unknown_execution``, ``running``, ``bad_ruling``)."""


class NoExecuterError(TunnelError):
    """``no_executer``: no executer of the project is connected (or not the one named)."""


class ExecuterDisconnectedError(TunnelError):
    """``executer_disconnected``: the executer went away and did not come back in time."""


class APIConnectionError(KyronixRunError):
    """The server could not be reached, or the connection dropped, and every retry failed
    too. ``code`` is ``connection_error``."""

    default_code = "connection_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, details=details)
        self.code = code or self.default_code


class APITimeoutError(APIConnectionError):
    """No answer in time: an HTTP request's timeout passed, or the tunnel answered ``timeout``
    (no result within the request's timeout). ``code`` is ``timeout``."""

    default_code = "timeout"


# -- control flow, and the refusals and conflicts carried by it --------------------------------


class ToolFailure(KyronixSignal):
    """A tool call could not do what was asked. Raised by a handler (or by the pipeline before
    it), caught by the executer, and turned into that call's result:
    ``{success: false, error, errorType}``. It never escapes ``execute()``."""

    error_type: str = "ToolError"

    def __init__(
        self,
        message: str,
        *,
        error_type: str | None = None,
        data: Mapping[str, Any] | None = None,
        output: str = "",
        truncated: bool = False,
    ) -> None:
        super().__init__(message)
        self.output = output
        """What the tool printed before it failed (a failing command's output)."""
        self.truncated = truncated
        if error_type is not None:
            self.error_type = error_type
        self.data = dict(data) if data is not None else None


class SecurityError(ToolFailure, KyronixRefusedError):
    """A permission policy, the path sandbox or the network guard refused the call. Its result
    has ``errorType: "SecurityError"`` and stops the rest of the envelope unless the caller
    asked to continue."""

    error_type = "SecurityError"


class ReceiptConflict(ToolFailure, ReceiptError):
    """The ``executionId`` was already used for a different call (another tool or other
    arguments): an id names one execution. Its result has ``errorType: "ReceiptConflict"``."""

    error_type = "ReceiptConflict"
