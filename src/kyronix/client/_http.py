"""httpx2's side of both clients: its failures and replies as Kyronix errors and values.

``httpx2.Response`` and its exceptions are the same for ``Client`` and ``AsyncClient``, so this
is shared; only reading a body (``read()`` / ``aread()``) differs, and the callers do that.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2

from kyronix.client._base import Call, ClientConfig
from kyronix.client._errors import api_error, error_fields
from kyronix.client._retry import Retrier
from kyronix.errors import APIConnectionError, APIError, APITimeoutError, KyronixError

__all__ = ["connection_failure", "error_of", "json_of", "new_timeout", "request_args"]

_NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)


def new_timeout(seconds: float) -> httpx2.Timeout:
    return httpx2.Timeout(seconds, connect=min(seconds, 10.0))


def request_args(config: ClientConfig, call: Call) -> dict[str, Any]:
    """Keyword arguments of ``client.build_request`` for this call."""
    args: dict[str, Any] = {"headers": call.headers(config.headers())}
    if call.body is not None:
        args["json"] = call.body
    if call.timeout is not None:
        args["timeout"] = new_timeout(call.timeout)
    return args


def connection_failure(
    exc: httpx2.TransportError, config: ClientConfig, call: Call, retrier: Retrier
) -> tuple[KyronixError, float | None]:
    """(the error to raise, or the wait before retrying) for a failed connection."""
    reached = not isinstance(exc, _NOT_SENT)
    delay = retrier.after_connection_error(reached=reached, idempotent=call.idempotent)
    where = f"{call.method} {config.base_url}{call.path}"
    tried = f" (tried {retrier.retries + 1} times)" if retrier.retries else ""
    error: KyronixError
    if isinstance(exc, httpx2.TimeoutException):
        seconds = call.timeout or config.timeout
        error = APITimeoutError(
            f"no answer to {where} within {seconds:g} s{tried}; raise timeout= or check the server"
        )
    else:
        error = APIConnectionError(
            f"cannot reach the Kyronix server for {where}{tried}: {exc or type(exc).__name__}; "
            f"is `kyronix serve` running there (base_url, KYRONIX_BASE_URL)?"
        )
    error.__cause__ = exc
    return error, delay


def error_of(
    response: httpx2.Response, call: Call, retrier: Retrier
) -> tuple[APIError, float | None]:
    """(the error an error reply means, the wait before retrying it or None). The body must
    have been read."""
    body = _decoded(response)
    fields = error_fields(body)
    code = fields[0] if fields else None
    delay = retrier.after_status(
        response.status_code, response.headers, code, idempotent=call.idempotent
    )
    return api_error(response.status_code, body, response.headers, text=response.text), delay


def _decoded(response: httpx2.Response) -> object:
    try:
        return json.loads(response.content)
    except ValueError:
        return None


def json_of(response: httpx2.Response) -> Any:
    body = _decoded(response)
    if body is None:
        raise APIError(
            f"the server answered {response.status_code} with a body that is not JSON; is "
            f"base_url a Kyronix server?",
            code="invalid_response",
            status_code=response.status_code,
        )
    return body
