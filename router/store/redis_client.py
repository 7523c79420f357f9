"""The one way slotgate opens Redis (cache and decision log alike): ``redis.asyncio``, imported
only when Redis is configured, with short socket timeouts and no client-side retries."""

from __future__ import annotations

from typing import Any


def redis_client(url: str, *, timeout_s: float) -> Any:
    """A client for ``url`` that fails fast: a miss or a write-behind retry later is cheaper than
    a request waiting on a Redis that is not there, so redis-py's own retries are off."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0), retry_on_timeout=False)


def redis_errors() -> tuple[type[BaseException], ...]:
    """What a failing Redis raises: redis-py's errors, refused/reset sockets it does not wrap
    (OSError) and asyncio timeouts."""
    import asyncio

    from redis.exceptions import RedisError

    return (RedisError, OSError, asyncio.TimeoutError)
