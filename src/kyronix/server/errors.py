"""The one error body of the API, and the exception that carries it.

Every error a client sees is ``{"error": {"code", "message", "details"}}`` with its status:

====  ==========================================================================================
400   ``invalid_request`` (malformed JSON, wrong types, a missing field: never a 500)
401   ``missing_api_key``, ``invalid_api_key``
402   ``insufficient_credits``
404   ``project_not_found``, ``agent_not_found``, ``session_not_found``, ``run_not_found``,
      ``not_found``
405   ``method_not_allowed``
409   ``session_busy``, ``idempotency_in_flight``
413   ``payload_too_large`` (over 1 MiB)
422   ``idempotency_key_reused`` (the same Idempotency-Key with another body)
429   ``rate_limited`` (with ``Retry-After``)
502   ``model_error`` (the model failed), ``invalid_kml`` (its answer stayed invalid)
503   ``draining`` (the server is shutting down), ``run_interrupted``, ``storage_unavailable``
      (the database cannot write: its disk is full or failing; nothing was charged)
500   ``internal_error`` (a bug: the body never carries a traceback)
====  ==========================================================================================
"""

from __future__ import annotations

import errno
from typing import Any

from kyronix.errors import KyronixError

__all__ = ["ApiError", "error_body", "is_storage_failure", "storage_unavailable"]

_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
_STORAGE_WORDS = ("disk is full", "no space left", "disk i/o error", "could not extend file",
                  "read-only file system", "disk full")  # fmt: skip


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


class ApiError(KyronixError):
    """An error the API answers with: its status, code, message, details and headers."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, status_code=status, details=details)
        self.status = status
        self.code = code
        self.headers = headers or {}

    @property
    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, self.details)


def not_found(what: str, ident: str | None = None) -> ApiError:
    code = f"{what}_not_found"
    shown = f" {ident!r}" if ident else ""
    return ApiError(404, code, f"no {what}{shown} in this project")


def is_storage_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the database could not write: a full or failing
    disk, the database unreachable (not a bug, not bad input: the server recovers when the
    storage does)."""
    from sqlalchemy.exc import OperationalError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OperationalError):
            return True
        if isinstance(current, OSError) and current.errno in _STORAGE_ERRNOS:
            return True
        text = str(current).lower()
        if any(word in text for word in _STORAGE_WORDS):
            return True
        current = current.__cause__ or current.__context__
    return False


def storage_unavailable() -> ApiError:
    return ApiError(
        503,
        "storage_unavailable",
        "the server cannot write to its database right now (its disk is full or failing); "
        "nothing was changed or charged: send the request again once it is fixed",
        headers={"Retry-After": "30"},
    )
