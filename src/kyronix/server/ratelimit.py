"""Token buckets: requests per API key (:class:`RateLimiter`), failed authentications per client
address (:class:`FailureThrottle`)."""

from __future__ import annotations

import math
import time

__all__ = ["FailureThrottle", "RateLimiter", "retry_after"]


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

    def peek(self, key: str, now: float | None = None) -> float:
        """What :meth:`take` would answer, taking nothing."""
        at = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(key, (self.burst, at))
        tokens = min(self.burst, tokens + (at - last) * self.rate)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def _forget(self, at: float) -> None:
        """Drop buckets that are full again (they would say the same as a new one)."""
        full = [
            k for k, (t, last) in self._buckets.items() if t + (at - last) * self.rate >= self.burst
        ]
        for k in full:
            del self._buckets[k]


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


class FailureThrottle:
    """Failed authentications per client address: a token bucket each failure takes from
    (``burst`` at once, refilled at ``per_minute``). An address that used it up is refused
    before its next attempt is even checked, until a token is back. Successes take nothing, and
    one address's failures never touch another's: an attacker cannot lock a tenant out from
    elsewhere."""

    def __init__(self, per_minute: float, burst: int, *, max_addresses: int = 100_000) -> None:
        self._bucket = RateLimiter(per_minute, burst, max_keys=max_addresses)

    def wait(self, address: str | None, now: float | None = None) -> float:
        """0 if ``address`` may try, else the seconds until it may."""
        if not address:
            return 0.0
        return self._bucket.peek(address, now)

    def failed(self, address: str | None, now: float | None = None) -> None:
        if address:
            self._bucket.take(address, now)
