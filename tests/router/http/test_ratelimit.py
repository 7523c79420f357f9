"""The token bucket itself: burst, refill at the configured rate, Retry-After from the deficit;
in this process, and shared through a real Redis (one Lua script per request)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from router.errors import TooManyRequests
from router.http.ratelimit import RedisTokenBuckets, TokenBuckets, make_rate_limit
from router.settings import Settings


def test_burst_then_refill(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("router.http.ratelimit.time.monotonic", lambda: now[0])
    buckets = TokenBuckets(rate_rps=2.0, burst=2)
    buckets.take("k")
    buckets.take("k")
    with pytest.raises(TooManyRequests) as info:
        buckets.take("k")
    assert info.value.retry_after_s == pytest.approx(0.5)
    buckets.take("other")  # another key has its own bucket
    now[0] += 0.5  # one token back at 2 per second
    buckets.take("k")
    with pytest.raises(TooManyRequests):
        buckets.take("k")


async def test_redis_buckets_are_shared_between_instances(redis_url: str) -> None:
    """Two RedisTokenBuckets (two replicas) on one Redis spend one bucket per key."""
    a = RedisTokenBuckets(redis_url, rate_rps=0.5, burst=3)
    b = RedisTokenBuckets(redis_url, rate_rps=0.5, burst=3)
    outcomes = []
    try:
        for buckets in (a, b, a, b, a):
            try:
                await buckets.acquire("key-1")
                outcomes.append(200)
            except TooManyRequests as exc:
                outcomes.append(429)
                assert 0 < exc.retry_after_s <= 2.0  # type: ignore[operator]
        await b.acquire("key-2")  # another key has its own bucket
        client = redis.Redis.from_url(redis_url)
        keys = client.keys("slotgate:v1:ratelimit:*")
        ttl_ms = client.pttl(keys[0])
        client.close()
    finally:
        await a.aclose()
        await b.aclose()
    assert outcomes == [200, 200, 200, 429, 429]
    assert len(keys) == 2 and all(b"key-" not in k for k in keys)
    assert 0 < ttl_ms <= 7_000  # kept only as long as a full refill takes (+1 s)


async def test_redis_bucket_refills_at_the_rate(redis_url: str) -> None:
    buckets = RedisTokenBuckets(redis_url, rate_rps=10.0, burst=2)
    try:
        await buckets.acquire("k")
        await buckets.acquire("k")
        with pytest.raises(TooManyRequests) as info:
            await buckets.acquire("k")
        assert 0 < info.value.retry_after_s <= 0.1  # type: ignore[operator]
        await asyncio.sleep(0.25)  # 2.5 tokens' worth, capped at the burst of 2
        await buckets.acquire("k")
        await buckets.acquire("k")
        with pytest.raises(TooManyRequests):
            await buckets.acquire("k")
    finally:
        await buckets.aclose()


async def test_redis_down_falls_back_to_a_local_bucket() -> None:
    buckets = RedisTokenBuckets("redis://127.0.0.1:1/0", rate_rps=0.5, burst=2)
    try:
        await buckets.acquire("k")
        await buckets.acquire("k")
        with pytest.raises(TooManyRequests):  # still limited: per process while Redis is away
            await buckets.acquire("k")
        assert buckets.redis_errors == 1  # then skipped for retry_interval_s: no latency
    finally:
        await buckets.aclose()


def test_make_rate_limit_picks_by_settings() -> None:
    assert make_rate_limit(Settings()) is None
    local = make_rate_limit(Settings(rate_limit_rps=2))
    assert type(local) is TokenBuckets
    shared = make_rate_limit(Settings(rate_limit_rps=2, cache={"redis_url": "redis://x:1/0"}))
    assert isinstance(shared, RedisTokenBuckets)
