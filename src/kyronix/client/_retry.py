"""When to try again, and how long to wait first: one policy for HTTP, streams and the tunnel.

Retried, at most ``max_retries`` times after the first attempt:

- a connection that failed or dropped, or timed out (for a call that is not idempotent, only
  a connection that could not be opened: the request never reached the server);
- ``408``, ``429`` and every ``5xx``, except a reply the server marks final: one with
  ``Idempotent-Replayed: true`` (the first answer to this Idempotency-Key, which every retry
  would get again) or a failed run's recorded error (``model_error``, ``invalid_kml``). A call
  that is not idempotent (``POST /api/sessions``) is retried only on the replies that are
  refused before anything is done: ``429 rate_limited`` and ``503 draining``.

Waits grow ``0.5 s * 2**n`` (capped at 8 s) with jitter: a random point in the upper half of the
step, so clients that failed together do not come back together. A ``429`` waits what its
``Retry-After`` says (seconds or an HTTP date), up to 60 s; longer than that, it is not retried.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from time import time as _now

__all__ = [
    "BASE_DELAY",
    "MAX_DELAY",
    "MAX_RETRY_AFTER",
    "Retrier",
    "backoff",
    "parse_retry_after",
    "retryable_status",
]

BASE_DELAY = 0.5
MAX_DELAY = 8.0
MAX_RETRY_AFTER = 60.0
FINAL_CODES = frozenset({"model_error", "invalid_kml"})
"""Errors recorded as a run's result: retried with the same Idempotency-Key they replay."""


def backoff(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """The wait before retry number ``attempt + 1``: in ``(step / 2, step]``, step
    ``min(MAX_DELAY, BASE_DELAY * 2**attempt)``."""
    step = min(MAX_DELAY, BASE_DELAY * 2.0 ** max(0, attempt))
    return step / 2 + step / 2 * (1.0 - rand())


def parse_retry_after(value: str | None, now: Callable[[], float] = _now) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent or
    unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - now()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


REFUSED_BEFORE = frozenset({(429, "rate_limited"), (503, "draining")})
"""Replies the server sends before it does anything: safe to retry even when not idempotent."""


def retryable_status(
    status: int, headers: Mapping[str, str], code: str | None, *, idempotent: bool = True
) -> bool:
    if headers.get("idempotent-replayed", "").lower() == "true" or code in FINAL_CODES:
        return False
    if not idempotent:
        return (status, code) in REFUSED_BEFORE
    return status in (408, 429) or 500 <= status <= 599


class Retrier:
    """Counts the retries of one call and says how long to wait before the next (None: stop)."""

    def __init__(self, max_retries: int, rand: Callable[[], float] = random.random) -> None:
        self.max_retries = max_retries
        self.retries = 0
        self._rand = rand

    def _next(self, wait: float | None = None) -> float | None:
        if self.retries >= self.max_retries:
            return None
        delay = backoff(self.retries, self._rand) if wait is None else wait
        self.retries += 1
        return delay

    def after_status(
        self, status: int, headers: Mapping[str, str], code: str | None, *, idempotent: bool = True
    ) -> float | None:
        """The wait before retrying a reply with this status, or None when it is final."""
        if not retryable_status(status, headers, code, idempotent=idempotent):
            return None
        if status == 429:
            after = parse_retry_after(headers.get("retry-after"))
            if after is not None:
                return None if after > MAX_RETRY_AFTER else self._next(after)
        return self._next()

    def after_connection_error(self, *, reached: bool, idempotent: bool) -> float | None:
        """The wait before retrying a failed connection; ``reached``: the request may have
        reached the server (so only an idempotent call may be sent again)."""
        if reached and not idempotent:
            return None
        return self._next()

    def progressed(self) -> None:
        """Something arrived (a stream's event): the next failure starts the count again."""
        self.retries = 0
