"""A token bucket per API key: ``burst`` requests at once, refilled at ``per_minute``."""

from __future__ import annotations

import math
import time

__all__ = ["RateLimiter"]


class RateLimiter:
    def __init__(self, per_minute: float, burst: int, *, max_keys: int = 100_000) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, key: str, now: float | None = None) -> float:
        """0 if the request may go, else the seconds until it may (``Retry-After``)."""
        at = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(key, (self.burst, at))
        tokens = min(self.burst, tokens + (at - last) * self.rate)
        if tokens >= 1:
            self._buckets[key] = (tokens - 1, at)
            if len(self._buckets) > self.max_keys:
                self._forget(at)
            return 0.0
        self._buckets[key] = (tokens, at)
        return (1 - tokens) / self.rate

    def _forget(self, at: float) -> None:
        """Drop buckets that are full again (they would say the same as a new one)."""
        full = [
            k for k, (t, last) in self._buckets.items() if t + (at - last) * self.rate >= self.burst
        ]
        for k in full:
            del self._buckets[k]


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
