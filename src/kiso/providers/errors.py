"""One mapping from a provider's failure to a :class:`ProviderError`, for every adapter.

===================================  ===================  =========
what happened                        code                 retryable
===================================  ===================  =========
400/413/422/500 saying "too long"    context_overflow     no
400                                  invalid_request      no
401, 403                             auth                 no
404                                  not_found            no
408                                  timeout              yes
409                                  conflict             yes
429                                  rate_limit           yes (``retry-after`` honoured)
500-599 (not 529)                    api_5xx              yes
529                                  overloaded           yes
connection failed                    network              yes
timed out                            timeout              yes
===================================  ===================  =========

"Context too long" is the error's ``type`` or ``code`` (``context_length_exceeded`` from OpenAI,
``exceed_context_size_error`` from llama.cpp's server) or its message, as each server words it:

=====================  ========================================================================
who                    message (HTTP status)
=====================  ========================================================================
OpenAI, DeepSeek       This model's maximum context length is N tokens. However, ... (400)
Anthropic              prompt is too long: N tokens > M maximum (400)
vLLM                   This model's maximum context length is N tokens. However, you requested
                       M tokens ... (400, ``{"object": "error", "type": "BadRequestError"}``);
                       The decoder prompt (length N) is longer than the maximum model length of
                       M (400, or 500 behind some gateways); Prompt length of N is longer than
                       the maximum model length of M
llama.cpp server       request (N tokens) exceeds the available context size (M tokens), try
                       increasing it (400, type ``exceed_context_size_error``, with
                       ``n_prompt_tokens`` and ``n_ctx``); the request exceeds the available
                       context size[, try increasing it | . try increasing the context size or
                       enable context shift] (400, or 500 in some builds); Context size has been
                       exceeded. (500); Input is too large to process. ... increase context
                       length (500, older builds); context length exceeded
llama-cpp-python       Requested tokens (N) exceed context window of M
=====================  ========================================================================

A 500 that says so is an overflow too: retrying the same request cannot fit it. When the body
carries llama.cpp's ``n_prompt_tokens`` and ``n_ctx``, the message says both.

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
    r"too many tokens|input is too long|exceeds the context|"
    r"exceeds? the available context size|exceed_context_size|context size has been exceeded|"
    r"input is too large to process.*context|longer than the maximum model length|exceeds? n_ctx",
    re.IGNORECASE | re.DOTALL,
)
_OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
"""``type`` or ``code`` values that say "context too long" whatever the message."""
_OVERFLOW_STATUSES = frozenset({400, 413, 422, 500})

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


def is_context_overflow(message: str, *codes: object) -> bool:
    """Whether ``message`` (or any of the error's ``type``/``code`` values) says "too long"."""
    if any(isinstance(c, str) and c.strip().lower() in _OVERFLOW_CODES for c in codes):
        return True
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
    status: int | None,
    message: str,
    *,
    retry_after: float | None = None,
    provider: str = "",
    codes: tuple[object, ...] = (),
) -> ProviderError:
    """The error for an HTTP status (None: the connection failed); ``codes``: its type/code."""
    prefix = f"{provider}: " if provider else ""
    if status is None:
        return ProviderError(f"{prefix}{message}", code="network", retryable=True)
    if status in _OVERFLOW_STATUSES and is_context_overflow(message, *codes):
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
            int(status),
            message,
            retry_after=retry_after_seconds(headers),
            provider=provider,
            codes=_codes(exc),
        )
    prefix = f"{provider}: " if provider else ""
    if "Timeout" in name:
        return ProviderError(f"{prefix}the request timed out", code="timeout", retryable=True)
    if any(part in name for part in _NETWORK_NAMES) or isinstance(exc, OSError):
        return ProviderError(f"{prefix}{message}", code="network", retryable=True)
    if is_context_overflow(message):
        return from_status(400, message, provider=provider)
    return ProviderError(f"{prefix}{name}: {message}", code="unknown", retryable=False)


def _error_body(exc: BaseException) -> dict[str, Any] | None:
    """The ``error`` object of the body (the SDKs unwrap it; vLLM's old shape has none)."""
    body = getattr(exc, "body", None)
    if not isinstance(body, dict):
        return None
    error = body.get("error", body)
    return error if isinstance(error, dict) else None


def _codes(exc: BaseException) -> tuple[object, ...]:
    error = _error_body(exc) or {}
    return (error.get("type"), error.get("code"), getattr(exc, "type", None))


def _message(exc: BaseException) -> str:
    error = _error_body(exc)
    text = None if error is None else error.get("message", error.get("detail"))  # detail: FastAPI
    if error is not None and isinstance(text, str):
        message = text
        prompt, window = error.get("n_prompt_tokens"), error.get("n_ctx")
        if isinstance(prompt, int) and isinstance(window, int) and str(window) not in message:
            message = f"{message} ({prompt} prompt tokens, a {window}-token context)"
        return message
    fallback = getattr(exc, "message", None)
    return str(fallback) if fallback else str(exc) or type(exc).__name__
