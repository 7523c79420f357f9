"""The cache against a real private redis-server: round trips, TTL, one network round trip per
batch, and Redis stopped and restarted mid-run (misses, never an exception; use resumes)."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio.connection import Connection

from policies.types import DecisionRequest, Option
from router.errors import InvalidRequest
from router.settings import CacheSettings
from router.store.cache import MemoryCache, RedisCache, make_cache, read_key, read_pattern, slow_key
from tests.conftest import RedisServer


def request(state: str = "my card is lost", **kw: Any) -> DecisionRequest:
    options = (Option("lost_card"), Option("card_arrival", "when will it come"))
    fields: dict[str, Any] = {"question_id": "q1", "instructions": "intent?", **kw}
    return DecisionRequest(options=options, state=state, **fields)


class CountingConnection(Connection):
    """Counts the writes to the socket: one per network round trip of a command or pipeline."""

    sends = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        await super().send_packed_command(command, check_health)


async def test_redis_round_trip_ttl_and_one_round_trip_per_batch(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as sync:  # the session's Redis: other tests' stats
        sync.config_resetstat()
    cache = RedisCache(redis_url, ttl_s=120)
    cache.client.connection_pool.connection_class = CountingConnection
    try:
        assert await cache.ping()  # opens the connection (its handshake is not counted below)
        items = [(f"slotgate:v1:t:read:{i}", f"value-{i}".encode()) for i in range(50)]
        CountingConnection.sends = 0
        await cache.set_many(items)
        assert CountingConnection.sends == 1
        CountingConnection.sends = 0
        got = await cache.get_many([k for k, _ in items] + ["slotgate:v1:t:read:absent"])
        assert CountingConnection.sends == 1
        assert got == [v for _, v in items] + [None]
        assert await cache.get_many([]) == []
    finally:
        await cache.aclose()
    sync = redis.Redis.from_url(redis_url)
    ttl = sync.ttl("slotgate:v1:t:read:7")
    stats = sync.info("commandstats")
    sync.close()
    assert 110 < ttl <= 120
    assert stats["cmdstat_mget"]["calls"] == 1 and stats["cmdstat_set"]["calls"] == 50


async def test_redis_stopped_mid_run_serves_misses_and_resumes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(tmp_path)
    server.start()
    errors: list[str] = []
    cache = RedisCache(server.url, ttl_s=60, on_error=errors.append, retry_interval_s=0.05)
    try:
        await cache.set_many([("k1", b"v1")])
        assert await cache.get_many(["k1"]) == [b"v1"]
        server.stop()
        with caplog.at_level(logging.WARNING, logger="router.store.cache"):
            for _ in range(5):
                assert await cache.get_many(["k1", "k2"]) == [None, None]
                await cache.set_many([("k2", b"v2")])  # no-op, no exception
                await asyncio.sleep(0.06)
        assert cache.healthy is False
        assert not await cache.ping()
        assert len(errors) >= 5 and set(errors) <= {"get_many", "set_many", "ping"}
        unavailable = [r for r in caplog.records if "unavailable" in r.getMessage()]
        assert len(unavailable) == 1  # logged at most once a minute
        server.start()  # same port, empty (no persistence)
        await asyncio.sleep(0.06)
        await cache.set_many([("k3", b"v3")])
        assert cache.healthy is True
        assert await cache.get_many(["k3", "k1"]) == [b"v3", None]
    finally:
        await cache.aclose()
        server.stop()


async def test_redis_down_calls_are_fast_within_retry_interval(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)  # never started: connection refused
    errors: list[str] = []
    cache = RedisCache(server.url, ttl_s=60, on_error=errors.append, retry_interval_s=30)
    try:
        assert await cache.get_many(["a"]) == [None]
        loop = asyncio.get_running_loop()
        start = loop.time()
        for _ in range(100):
            assert await cache.get_many(["a"]) == [None]
        assert loop.time() - start < 0.05  # skipped while down, not retried per call
        assert errors == ["get_many"]
    finally:
        await cache.aclose()


async def test_memory_cache_lru_bound_and_ttl() -> None:
    now = [0.0]
    cache = MemoryCache(max_entries=3, ttl_s=10, clock=lambda: now[0])
    await cache.set_many([("a", b"1"), ("b", b"2"), ("c", b"3")])
    assert await cache.get_many(["a"]) == [b"1"]  # a is now most recent
    await cache.set_many([("d", b"4")])  # evicts b, the least recently used
    assert len(cache) == 3
    assert await cache.get_many(["a", "b", "c", "d"]) == [b"1", None, b"3", b"4"]
    now[0] = 9.9
    assert await cache.get_many(["a"]) == [b"1"]
    now[0] = 10.0
    assert await cache.get_many(["a", "c"]) == [None, None]
    assert len(cache) == 1 and cache.healthy and await cache.ping()


def test_make_cache_picks_by_settings(redis_url: str) -> None:
    assert isinstance(make_cache(CacheSettings()), MemoryCache)
    cache = make_cache(CacheSettings(redis_url=redis_url, ttl_s=5))
    assert isinstance(cache, RedisCache) and cache.ttl_s == 5
    asyncio.run(cache.aclose())


def test_keys_are_hashes_of_what_changes_the_answer() -> None:
    key = read_key("tenant-1", request(), "fp1")
    prefix, hexdigest = key.rsplit(":", 1)
    # The tier's hashed fingerprint leads the hash, so one tier's reads can be purged.
    assert prefix.startswith("slotgate:v1:tenant-1:read:") and len(hexdigest) == 64
    assert fnmatch.fnmatchcase(key, read_pattern("fp1"))
    assert not fnmatch.fnmatchcase(key, read_pattern("fp2"))
    assert int(hexdigest, 16) >= 0
    assert read_key("tenant-1", request(), "fp1") == key
    assert read_key("tenant-1", request(), "fp2") != key
    assert read_key("tenant-1", request("other state"), "fp1") != key
    assert read_key("tenant-1", request(samples=4), "fp1") != key
    assert read_key("tenant-2", request(), "fp1") != key
    assert slow_key("tenant-1", request(), "m") != slow_key("tenant-1", request(), "m2")
    assert slow_key("tenant-1", request(), "m").startswith("slotgate:v1:tenant-1:slow:")
    # user text never reaches the key, whatever it holds
    hostile = request("x:y\nDEL *", question_id="a:b\n")
    assert "\n" not in read_key("t", hostile, "fp") and "DEL" not in read_key("t", hostile, "fp")


@pytest.mark.parametrize("namespace", ["", "a:b", "a\nb", "ns*", "x" * 65, "a b"])
def test_namespace_charset_is_enforced(namespace: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        read_key(namespace, request(), "fp")
    assert info.value.field == "namespace"


async def test_memory_cache_keeps_compact_copies_of_orjson_output() -> None:
    """orjson's bytes keep a ~4 KiB working buffer; a cache holding them grew RSS by 8 KiB per
    decision under load (bench/load.py). Entries must cost about their length."""
    import tracemalloc

    import orjson

    cache = MemoryCache(max_entries=10_000, ttl_s=60)
    tracemalloc.start()
    try:
        values = [orjson.dumps({"options": ["a", "b"], "proba": [0.5, 0.5], "i": i})
                  for i in range(1000)]
        await cache.set_many([(f"k{i}", v) for i, v in enumerate(values)])
        del values
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1000 * 512, f"{held / 1000:.0f} bytes per 50-byte entry"


async def test_a_claim_is_one_replicas_until_it_releases_or_expires(redis_url: str) -> None:
    """Two replicas' caches on one Redis: the first claim wins, the second waits; only the owner's
    release frees it (a stranger's does not); a claim whose TTL passed is free again."""
    a, b = RedisCache(redis_url, ttl_s=60), RedisCache(redis_url, ttl_s=60)
    try:
        key = slow_key("claims", request("who asks the slow model?"), "m")
        assert await a.claim(key, ttl_s=5) is True
        assert await b.claim(key, ttl_s=5) is False
        await b.release(key)  # not b's claim: it stays
        assert await b.claim(key, ttl_s=5) is False
        await a.release(key)
        assert await b.claim(key, ttl_s=0.05) is True
        await asyncio.sleep(0.15)  # b's claim expires unreleased (a replica that died)
        assert await a.claim(key, ttl_s=5) is True
        await a.release(key)
    finally:
        await a.aclose()
        await b.aclose()


async def test_claims_fail_open_while_redis_is_down(tmp_path: Path) -> None:
    """No Redis, no coordination: every replica computes for itself, nothing raises."""
    errors: list[str] = []
    cache = RedisCache(RedisServer(tmp_path).url, ttl_s=60, on_error=errors.append)
    try:
        assert await cache.claim("k", ttl_s=1) is True
        assert await cache.claim("k", ttl_s=1) is True
        await cache.release("k")
        assert errors == ["claim"]  # then skipped within the retry interval
    finally:
        await cache.aclose()
    memory = MemoryCache(max_entries=10, ttl_s=60)
    assert await memory.claim("k", ttl_s=1) and await memory.claim("k", ttl_s=1)
