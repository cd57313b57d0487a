"""The server's errors as :mod:`kyronix.errors` exceptions: an HTTP reply, an SSE ``error``
event or a tunnel ``error`` frame, each keeping the server's ``code``, message and ``details``.

===========================  ===================================================================
401                          :class:`AuthenticationError`
402                          :class:`InsufficientCreditsError`
404 ``project_not_found``    :class:`ProjectNotFoundError`
404 (any other code)        :class:`NotFoundError`
409                          :class:`ConflictError`
429                          :class:`RateLimitError` (``retry_after`` from ``Retry-After``)
any other status             :class:`APIError` with that ``status_code``
tunnel ``no_executer``       :class:`NoExecuterError`
tunnel ``timeout``           :class:`APITimeoutError`
tunnel ``executer_disc…``    :class:`ExecuterDisconnectedError`
any other tunnel code        :class:`TunnelError`
===========================  ===================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kyronix.client._retry import parse_retry_after
from kyronix.errors import (
    APIError,
    APITimeoutError,
    AuthenticationError,
    ConflictError,
    ExecuterDisconnectedError,
    InsufficientCreditsError,
    KyronixError,
    NoExecuterError,
    NotFoundError,
    ProjectNotFoundError,
    RateLimitError,
    TunnelError,
)

__all__ = ["api_error", "error_fields", "tunnel_error"]

STATUS_OF_CODE = {
    "invalid_request": 400,
    "missing_api_key": 401,
    "invalid_api_key": 401,
    "insufficient_credits": 402,
    "project_not_found": 404,
    "agent_not_found": 404,
    "session_not_found": 404,
    "run_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "session_busy": 409,
    "idempotency_in_flight": 409,
    "payload_too_large": 413,
    "idempotency_key_reused": 422,
    "rate_limited": 429,
    "too_many_failures": 429,
    "internal_error": 500,
    "model_error": 502,
    "invalid_kml": 502,
    "draining": 503,
    "run_interrupted": 503,
    "storage_unavailable": 503,
}
"""The HTTP status of each documented code: an SSE ``error`` event carries the body only."""

_BY_STATUS: dict[int, type[APIError]] = {
    401: AuthenticationError,
    402: InsufficientCreditsError,
    404: NotFoundError,
    409: ConflictError,
    429: RateLimitError,
}


def error_fields(body: object) -> tuple[str, str, dict[str, Any]] | None:
    """``(code, message, details)`` of a Kyronix error body; None if ``body`` is not one."""
    if not isinstance(body, Mapping):
        return None
    error = body.get("error")
    if not isinstance(error, Mapping):
        return None
    code, message, details = error.get("code"), error.get("message"), error.get("details")
    if not isinstance(code, str) or not code:
        return None
    return (
        code,
        message if isinstance(message, str) and message else code.replace("_", " "),
        dict(details) if isinstance(details, Mapping) else {},
    )


def api_error(
    status: int | None,
    body: object,
    headers: Mapping[str, str] | None = None,
    *,
    text: str = "",
) -> APIError:
    """The exception for an error reply (``status`` None: an SSE event, known by its code).

    ``text`` is the raw body, shown when it is not a Kyronix error body (a proxy's HTML page).
    """
    fields = error_fields(body)
    if fields is None:
        shown = " ".join(text.split())[:200]
        code = f"http_{status}" if status is not None else "unknown_error"
        message = (
            f"the server answered {status if status is not None else 'an error'} without a "
            f"Kyronix error body"
            + (f": {shown}" if shown else "")
            + "; check that base_url points at a Kyronix server"
        )
        fields = (code, message, {})
    code, message, details = fields
    if status is None:
        status = STATUS_OF_CODE.get(code)
    cls = _BY_STATUS.get(status or 0, APIError)
    if cls is NotFoundError and code == "project_not_found":
        cls = ProjectNotFoundError
    kwargs: dict[str, Any] = {
        "code": code,
        "status_code": status,
        "details": details,
        "headers": headers,
    }
    if cls is RateLimitError:
        after = parse_retry_after((headers or {}).get("retry-after"))
        if after is None and isinstance(details.get("retryAfter"), int | float):
            after = float(details["retryAfter"])
        return RateLimitError(message, retry_after=after, **kwargs)
    return cls(message, **kwargs)


_TUNNEL: dict[str, type[TunnelError]] = {
    "no_executer": NoExecuterError,
    "executer_disconnected": ExecuterDisconnectedError,
}


def tunnel_error(frame: Mapping[str, Any]) -> KyronixError:
    """The exception for a tunnel ``error`` frame (its other fields go into ``details``)."""
    code = frame.get("code")
    code = code if isinstance(code, str) and code else "unknown_error"
    message = frame.get("message")
    message = message if isinstance(message, str) and message else code.replace("_", " ")
    details = {k: v for k, v in frame.items() if k not in ("type", "code", "message")}
    if code == "timeout":
        return APITimeoutError(message, code=code, details=details)
    return _TUNNEL.get(code, TunnelError)(message, code=code, details=details)
