"""One mapping from a provider's failure to a :class:`ProviderError`, for every adapter.

==============================  ===================  =========
what happened                   code                 retryable
==============================  ===================  =========
400 (context too long)          context_overflow     no
400                             invalid_request      no
401, 403                        auth                 no
404                             not_found            no
408                             timeout              yes
409                             conflict             yes
429                             rate_limit           yes (``retry-after`` honoured)
500-599 (not 529)               api_5xx              yes
529                             overloaded           yes
connection failed               network              yes
timed out                       timeout              yes
==============================  ===================  =========

The SDKs are imported lazily by the adapters; this module only looks at the exceptions' shape
(``status_code``, ``response.headers``, ``body``, class name), so it needs neither SDK.
"""

from __future__ import annotations

import re
from email.utils import parsedate_to_datetime
from typing import Any

from kiso.providers.base import ProviderError, retryable_status

__all__ = ["from_sdk_error", "from_status", "is_context_overflow", "retry_after_seconds"]

_CONTEXT_PATTERNS = re.compile(
    r"context[_ ]length[_ ]exceeded|prompt is too long|maximum context length|context window|"
    r"too many tokens|input is too long|exceeds the context",
    re.IGNORECASE,
)

_NETWORK_NAMES = ("Connection", "Connect", "Network", "Protocol", "ReadError", "WriteError")
"""Transport failures (the SDKs' and httpx2's) by class name: the connection broke."""

_CODES = {
    400: "invalid_request",
    401: "auth",
    403: "auth",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "invalid_request",
    422: "invalid_request",
    429: "rate_limit",
    529: "overloaded",
}


def is_context_overflow(message: str) -> bool:
    return bool(_CONTEXT_PATTERNS.search(message))


def retry_after_seconds(headers: Any) -> float | None:
    """``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), if present and sane."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(float(ms) / 1000, 0.0)
        value = headers.get("retry-after")
    except Exception:  # headers of an unexpected type: no hint
        return None
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        import time

        return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        return None


def from_status(
    status: int | None, message: str, *, retry_after: float | None = None, provider: str = ""
) -> ProviderError:
    """The error for an HTTP status (None: the connection failed)."""
    prefix = f"{provider}: " if provider else ""
    if status is None:
        return ProviderError(f"{prefix}{message}", code="network", retryable=True)
    if status == 400 and is_context_overflow(message):
        return ProviderError(
            f"{prefix}the conversation is longer than the model's context window: {message}",
            status=status,
            code="context_overflow",
            retryable=False,
        )
    code = _CODES.get(status, "api_5xx" if status >= 500 else "unknown")
    return ProviderError(
        f"{prefix}{message}",
        status=status,
        code=code,
        retryable=retryable_status(status),
        retry_after=retry_after,
    )


def from_sdk_error(exc: BaseException, provider: str = "") -> ProviderError:
    """Map an ``openai`` or ``anthropic`` SDK exception (or any other) to a ProviderError."""
    if isinstance(exc, ProviderError):
        return exc
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    message = _message(exc)
    if status is not None:
        return from_status(
            int(status), message, retry_after=retry_after_seconds(headers), provider=provider
        )
    prefix = f"{provider}: " if provider else ""
    if "Timeout" in name:
        return ProviderError(f"{prefix}the request timed out", code="timeout", retryable=True)
    if any(part in name for part in _NETWORK_NAMES) or isinstance(exc, OSError):
        return ProviderError(f"{prefix}{message}", code="network", retryable=True)
    if is_context_overflow(message):
        return from_status(400, message, provider=provider)
    return ProviderError(f"{prefix}{name}: {message}", code="unknown", retryable=False)


def _message(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    message = getattr(exc, "message", None)
    return str(message) if message else str(exc) or type(exc).__name__
