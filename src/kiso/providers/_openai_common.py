"""What the two OpenAI adapters share: the client's lifetime, error codes, arguments, images.

The client. Each ``stream()`` opens its own ``openai.AsyncOpenAI`` (``max_retries=0``: the runtime
retries) and closes it when the stream ends, however it ends, so a client never outlives the
event loop it ran on (``Session.run_sync`` runs a fresh loop per call); the async generators the
SDK abandons inside a stream are closed before the stream ends (:mod:`kiso.providers._closing`),
so no task is left pending when that loop closes. A caller that passes
``http_client`` owns it: it is reused across turns (keep-alive) and never closed here. The key is
sent exactly as configured (``api_key or "no-key"``): the ``Authorization`` header is pinned, so
neither ``OPENAI_API_KEY`` nor ``OPENAI_CUSTOM_HEADERS`` in the environment can replace it
(unless ``default_headers`` sets its own ``Authorization``).

Errors. HTTP failures go through :func:`kiso.providers.errors.from_sdk_error`. An error that
arrives inside a stream has no HTTP status, only the provider's ``code``/``type`` string; it is
given the status that code stands for and then mapped by :func:`kiso.providers.errors.from_status`:

=========================================================  ======  ====================
code or type in the stream                                 status  becomes
=========================================================  ======  ====================
context_length_exceeded, exceed_context_size_error (or a   400     context_overflow
message saying so: :mod:`kiso.providers.errors`)
invalid_request_error, invalid_*, bad_request, image_*     400     invalid_request
authentication_error, invalid_api_key, unauthorized        401     auth
permission_error, permission_denied                        403     auth
not_found_error, model_not_found, not_found                404     not_found
timeout, request_timeout                                   408     timeout (retryable)
rate_limit_exceeded, rate_limit_error, insufficient_quota  429     rate_limit (retryable)
server_error, api_error, internal_error                    500     api_5xx (retryable)
service_unavailable, unavailable                           503     api_5xx (retryable)
overloaded, overloaded_error, server_overloaded            529     overloaded (retryable)
a number (``"503"``)                                       itself  as that status
anything else                                              -       unknown (not retryable)
=========================================================  ======  ====================
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from kiso.kernel import ImageBlock, UsageError, ascii_int
from kiso.providers.base import ProviderError
from kiso.providers.errors import from_sdk_error, from_status, is_context_overflow

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "OpenAIBase",
    "dumps_arguments",
    "error_from_code",
    "image_url",
    "map_exception",
    "output_cap",
    "parse_arguments",
]

_CODE_STATUS = {
    "context_length_exceeded": 400,
    "exceed_context_size_error": 400,  # llama.cpp's server
    "invalid_request_error": 400,
    "bad_request": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "unauthorized": 401,
    "permission_error": 403,
    "permission_denied": 403,
    "not_found_error": 404,
    "model_not_found": 404,
    "not_found": 404,
    "timeout": 408,
    "request_timeout": 408,
    "rate_limit_exceeded": 429,
    "rate_limit_error": 429,
    "insufficient_quota": 429,
    "server_error": 500,
    "api_error": 500,
    "internal_error": 500,
    "service_unavailable": 503,
    "unavailable": 503,
    "overloaded": 529,
    "overloaded_error": 529,
    "server_overloaded": 529,
}


def _status_for(code: str) -> int | None:
    code = code.strip().lower()
    number = ascii_int(code)
    if number is not None:
        return number
    status = _CODE_STATUS.get(code)
    if status is None and (code.startswith(("invalid_", "image_")) or code.endswith("_image")):
        return 400
    return status


def error_from_code(codes: tuple[Any, ...], message: str, provider: str) -> ProviderError:
    """The error for a failure reported inside a stream by ``code``/``type`` strings."""
    message = message or "the provider reported an error in the stream"
    names = [str(c) for c in codes if c is not None and str(c)]
    for name in names:
        status = _status_for(name)
        if status is None:
            continue
        return from_status(status, message, provider=provider, codes=tuple(names))
    if is_context_overflow(message):
        return from_status(400, message, provider=provider)
    detail = f" ({', '.join(names)})" if names else ""
    return ProviderError(f"{provider}: {message}{detail}", code="unknown", retryable=False)


def map_exception(exc: BaseException, provider: str) -> ProviderError:
    """Any exception from the SDK (or the transport under it) as a ProviderError."""
    mapped = from_sdk_error(exc, provider)
    if (
        mapped.code == "unknown"
        and getattr(exc, "status_code", None) is None
        and (getattr(exc, "code", None) or getattr(exc, "type", None))
    ):
        # An error event inside a stream (openai.APIError): no status, the provider's code only.
        message = getattr(exc, "message", None) or str(exc)
        return error_from_code(
            (getattr(exc, "code", None), getattr(exc, "type", None)), str(message), provider
        )
    return mapped


def parse_arguments(raw: Any) -> dict[str, Any] | None:
    """A tool call's arguments as an object (``""`` is ``{}``), or None if they are not one."""
    if isinstance(raw, dict):
        return raw
    if raw is None:
        return {}
    if not isinstance(raw, str):
        return None
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def image_url(block: ImageBlock) -> str:
    """A URL for the image: its own, or a ``data:`` URL of its inline bytes."""
    if block.url is not None:
        return block.url
    return f"data:{block.media_type};base64,{block.data or ''}"


def dumps_arguments(value: Mapping[str, Any]) -> str:
    """Tool-call arguments as the providers expect them back: JSON text, keys as recorded."""
    return json.dumps(value, ensure_ascii=False)


class OpenAIBase:
    """What both adapters are built from: their settings, and a fresh ``AsyncOpenAI`` per stream."""

    DEFAULT_PROVIDER = "openai"
    """The ``provider`` recorded when none is given (each adapter names its API)."""

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None,
        base_url: str | None = None,
        provider: str | None = None,
        max_output_tokens: int | None = None,
        reasoning_effort: str | None = None,
        http_client: httpx2.AsyncClient | None = None,
        timeout: float = 600.0,
        default_headers: dict[str, str] | None = None,
    ) -> None:
        import openai  # lazily: importing kiso.providers never imports an SDK

        if not model:
            raise UsageError("an OpenAI adapter needs a model name")
        if max_output_tokens is not None and max_output_tokens <= 0:
            raise UsageError(f"max_output_tokens must be positive, not {max_output_tokens}")
        self._openai: Any = openai
        self.provider = provider or self.DEFAULT_PROVIDER
        self.model = model
        self.base_url = base_url
        self.max_output_tokens = max_output_tokens
        self.reasoning_effort = reasoning_effort
        self.timeout = timeout
        self._api_key = api_key or "no-key"
        self._http_client = http_client
        headers = dict(default_headers or {})
        if not any(name.lower() == "authorization" for name in headers):
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._headers = headers

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Any]:
        """An ``AsyncOpenAI`` for one stream; closed afterwards unless the caller owns the pool."""
        client = self._openai.AsyncOpenAI(
            api_key=self._api_key,
            base_url=self.base_url,
            max_retries=0,
            timeout=self.timeout,
            http_client=self._http_client,
            default_headers=self._headers,
        )
        try:
            yield client
        finally:
            if self._http_client is None:
                await client.close()

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}(provider={self.provider!r}, model={self.model!r})"


def output_cap(adapter_max: int | None, request_max: int | None) -> int | None:
    """The tighter of the adapter's output limit and the request's own (either may be unset)."""
    caps = [c for c in (adapter_max, request_max) if c is not None]
    return min(caps) if caps else None
