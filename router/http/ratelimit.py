"""Per-client request rate limits: a token bucket per cache namespace (one per API key), so one
client's burst is refused with 429 + Retry-After instead of crowding out the others. With Redis
configured the bucket lives in Redis, so N replicas share one limit instead of granting N times
it; while Redis is unreachable each process falls back to its own bucket (never to no limit)."""

from __future__ import annotations

import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any

from router.errors import TooManyRequests

if TYPE_CHECKING:
    from router.settings import Settings

logger = logging.getLogger(__name__)

# One atomic round trip: refill by the time elapsed (Redis's own clock, so replicas' clocks
# need not agree), spend a token if there is one, keep the state for as long as a refill takes.
# Returns {1 or 0, tokens left as a string} (Lua numbers come back to Redis as integers).
TOKEN_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, tostring(tokens)}
"""


class TokenBuckets:
    """``rate_rps`` tokens a second up to ``burst``, per key, in this process. Keys are
    namespaces, bounded by the configured API keys, so the table cannot grow with traffic."""

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
            raise self.refused(tokens)
        self._buckets[key] = (tokens - 1.0, now)

    async def acquire(self, key: str) -> None:
        """``take``, as the admission guard calls every rate limit."""
        self.take(key)

    async def aclose(self) -> None:
        """Nothing to release."""

    def refused(self, tokens: float) -> TooManyRequests:
        return TooManyRequests(
            f"rate limit: at most {self.rate_rps:g} requests a second per API key "
            f"(bursts of {self.burst:g})", retry_after_s=(1.0 - tokens) / self.rate_rps)


class RedisTokenBuckets(TokenBuckets):
    """The same buckets kept in Redis (one EVALSHA per request), shared by every replica. A
    Redis failure falls back to this process's own bucket for ``retry_interval_s``."""

    def __init__(self, url: str, *, rate_rps: float, burst: int, timeout_s: float = 0.25,
                 retry_interval_s: float = 1.0) -> None:
        from router.store.redis_client import redis_client

        super().__init__(rate_rps=rate_rps, burst=burst)
        self.retry_interval_s = retry_interval_s
        self.redis_errors = 0
        self.client: Any = redis_client(url, timeout_s=timeout_s)
        self._script = self.client.register_script(TOKEN_BUCKET_LUA)
        self._down_since: float | None = None

    @staticmethod
    def redis_key(namespace: str) -> str:
        # Hashed: a namespace never shapes a key beyond its digest.
        return f"slotgate:v1:ratelimit:{hashlib.sha256(namespace.encode()).hexdigest()}"

    async def acquire(self, key: str) -> None:
        if self._down_since is not None and (
                time.monotonic() - self._down_since < self.retry_interval_s):
            self.take(key)
            return
        from redis.exceptions import RedisError

        try:
            allowed, tokens = await self._script(keys=[self.redis_key(key)],
                                                 args=[self.rate_rps, self.burst])
        except (RedisError, OSError) as exc:  # OSError covers TimeoutError
            self._failed(exc)
            self.take(key)
            return
        if self._down_since is not None:
            logger.warning("rate limit: redis reachable again; the limit is shared again")
            self._down_since = None
        if not int(allowed):
            raise self.refused(float(tokens))

    async def aclose(self) -> None:
        await self.client.aclose()

    def _failed(self, exc: BaseException) -> None:
        if self._down_since is None:
            logger.warning("rate limit: redis unavailable (%s: %s); each process limits on its "
                           "own until it is back", type(exc).__name__, exc)
        self.redis_errors += 1
        self._down_since = time.monotonic()


def make_rate_limit(settings: Settings) -> TokenBuckets | None:
    """None when ``rate_limit_rps`` is unset; shared through Redis when a Redis URL is set."""
    if not settings.rate_limit_rps:
        return None
    if settings.cache.redis_url:
        return RedisTokenBuckets(settings.cache.redis_url, rate_rps=settings.rate_limit_rps,
                                 burst=settings.rate_limit_burst)
    return TokenBuckets(rate_rps=settings.rate_limit_rps, burst=settings.rate_limit_burst)
