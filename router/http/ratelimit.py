"""Per-client request rate limits: a token bucket per cache namespace (one per API key), so one
client's burst is refused with 429 + Retry-After instead of crowding out the others."""

from __future__ import annotations

import time

from router.errors import TooManyRequests


class TokenBuckets:
    """``rate_rps`` tokens a second up to ``burst``, per key. Keys are namespaces, bounded by the
    configured API keys, so the table cannot grow with traffic."""

    def __init__(self, *, rate_rps: float, burst: int) -> None:
        self.rate_rps = rate_rps
        self.burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, monotonic time)

    def take(self, key: str) -> None:
        """Spend one token of ``key``'s bucket, or raise TooManyRequests saying when to retry."""
        now = time.monotonic()
        tokens, then = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate_rps)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            raise TooManyRequests(
                f"rate limit: at most {self.rate_rps:g} requests a second per API key "
                f"(bursts of {self.burst:g})", retry_after_s=(1.0 - tokens) / self.rate_rps)
        self._buckets[key] = (tokens - 1.0, now)
