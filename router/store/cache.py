"""The cache of raw fast reads and slow answers: Redis when configured, an in-process LRU otherwise.
A cache never fails a request: on any Redis failure it counts, logs at most once a minute and
behaves as a miss (get) or a no-op (set); it uses Redis again as soon as a later call succeeds.

Keys are built only from hashes (``read_key`` / ``slow_key``), so no id or user text can inject
into them: ``slotgate:v1:{namespace}:{read|slow}:{sha256 of canonical JSON}``.
"""

from __future__ import annotations

import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from policies.types import DecisionRequest, canonical_hash
from router.errors import InvalidRequest
from router.settings import NAMESPACE_PATTERN as _NAMESPACE
from router.store.redis_client import redis_client, redis_errors

if TYPE_CHECKING:
    from router.settings import CacheSettings

logger = logging.getLogger(__name__)

ErrorCallback = Callable[[str], None]  # called with the failed operation: "get_many", "set_many", "ping"


class Cache(ABC):
    """Bytes by key with a TTL. ``get_many`` / ``set_many`` never raise."""

    healthy: bool = True  # False while the store is unreachable (reported by /readyz, metrics)

    @abstractmethod
    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """One value (or None for a miss) per key, in order."""

    @abstractmethod
    async def set_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Store every (key, value) with the cache's TTL."""

    async def ping(self) -> bool:
        """True when the store answers now."""
        return True

    async def claim(self, key: str, *, ttl_s: float) -> bool:
        """True when this process should compute ``key``'s value itself; False when another
        replica has claimed it (and has not released it or let ``ttl_s`` pass), so waiting for
        the value to appear under ``key`` is cheaper. Default: always True (one process: its
        own single-flight already merges identical calls). Never raises."""
        return True

    async def renew(self, key: str, *, ttl_s: float) -> bool:
        """Extend this process's claim on ``key`` to ``ttl_s`` from now (the holder's heartbeat:
        a claim outlives its holder by at most ``ttl_s``). False when the claim is no longer
        this process's. Never raises."""
        return True

    async def release(self, key: str) -> None:
        """Give up this process's claim on ``key`` (its value is stored, or will not come)."""

    async def aclose(self) -> None:
        """Release connections. Idempotent."""


class MemoryCache(Cache):
    """A bounded in-process LRU whose entries expire ``ttl_s`` after they were set."""

    def __init__(self, *, max_entries: int = 100_000, ttl_s: float = 7 * 24 * 3600,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # key -> (expires, value)

    def __len__(self) -> int:
        return len(self._entries)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        now = self._clock()
        values: list[bytes | None] = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry[0] <= now:
                self._entries.pop(key, None)
                values.append(None)
            else:
                self._entries.move_to_end(key)
                values.append(entry[1])
        return values

    async def set_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        expires = self._clock() + self.ttl_s
        for key, value in items:
            # A compact copy: orjson's output keeps its ~4 KiB working buffer, which a long-lived
            # entry would otherwise hold on to (measured: 8 KiB of RSS per cached read).
            self._entries[key] = (expires, bytes(memoryview(value)))
            self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def aclose(self) -> None:
        self._entries.clear()


_RELEASE_IF_OURS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RENEW_IF_OURS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class RedisCache(Cache):
    """Redis through ``redis.asyncio``: one MGET per ``get_many``, one pipeline of ``SET EX`` per
    ``set_many`` (one round trip each). While Redis is down, calls within ``retry_interval_s`` of
    the last failure skip it, so a dead Redis costs no latency; the next attempt after that which
    succeeds makes the cache healthy again."""

    def __init__(self, url: str, *, ttl_s: int, on_error: ErrorCallback | None = None,
                 timeout_s: float = 0.25, retry_interval_s: float = 1.0,
                 log_interval_s: float = 60.0) -> None:
        self.ttl_s = int(ttl_s)
        self.retry_interval_s = retry_interval_s
        self.log_interval_s = log_interval_s
        self._on_error = on_error
        self.client: Any = redis_client(url, timeout_s=timeout_s)
        self._token = uuid.uuid4().hex.encode()  # whose claim a claim key holds
        self._release_script = self.client.register_script(_RELEASE_IF_OURS)
        self._renew_script = self.client.register_script(_RENEW_IF_OURS)
        self.healthy = True
        self._down_since: float | None = None  # monotonic time of the last failure while down
        self._last_log = -float("inf")
        self._suppressed = 0

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys or self._skipping():
            return [None] * len(keys)
        try:
            values = await self.client.mget(list(keys))
        except redis_errors() as exc:
            self._failed("get_many", exc)
            return [None] * len(keys)
        self._succeeded()
        return [None if v is None else bytes(v) for v in values]

    async def set_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        if not items or self._skipping():
            return
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for key, value in items:
                    pipe.set(key, value, ex=self.ttl_s)
                await pipe.execute()
        except redis_errors() as exc:
            self._failed("set_many", exc)
            return
        self._succeeded()

    async def purge(self, pattern: str, *, batch: int = 500) -> int:
        """Remove every key matching ``pattern`` (SCAN, then UNLINK in batches: never a KEYS
        that blocks the server); how many were removed. Raises the Redis error it meets."""
        removed, keys = 0, []
        async for key in self.client.scan_iter(match=pattern, count=batch):
            keys.append(key)
            if len(keys) >= batch:
                removed += await self.client.unlink(*keys)
                keys = []
        if keys:
            removed += await self.client.unlink(*keys)
        return int(removed)

    async def ping(self) -> bool:
        try:
            await self.client.ping()
        except redis_errors() as exc:
            self._failed("ping", exc)
            return False
        self._succeeded()
        return True

    async def claim(self, key: str, *, ttl_s: float) -> bool:
        """``SET {key}:claim <this process> NX PX``: one replica per key wins until it releases
        or the TTL passes. While Redis fails, every replica computes (fails open)."""
        if self._skipping():
            return True
        try:
            won = await self.client.set(f"{key}:claim", self._token, nx=True,
                                        px=max(1, int(ttl_s * 1000)))
        except redis_errors() as exc:
            self._failed("claim", exc)
            return True
        self._succeeded()
        return bool(won)

    async def renew(self, key: str, *, ttl_s: float) -> bool:
        """``PEXPIRE`` the claim only while it is still this process's (compare and extend in one
        script). While Redis fails: True (the claim, if any, lapses by itself)."""
        if self._skipping():
            return True
        try:
            renewed = await self._renew_script(keys=[f"{key}:claim"],
                                               args=[self._token, max(1, int(ttl_s * 1000))])
        except redis_errors() as exc:
            self._failed("renew", exc)
            return True
        self._succeeded()
        return bool(renewed)

    async def release(self, key: str) -> None:
        """Deletes the claim only while it is still this process's (a claim whose TTL passed may
        be another replica's by now): compare and delete in one script."""
        if self._skipping():
            return
        try:
            await self._release_script(keys=[f"{key}:claim"], args=[self._token])
        except redis_errors() as exc:
            self._failed("release", exc)
            return
        self._succeeded()

    async def aclose(self) -> None:
        await self.client.aclose()

    def _skipping(self) -> bool:
        return self._down_since is not None and (
            time.monotonic() - self._down_since < self.retry_interval_s)

    def _failed(self, operation: str, exc: BaseException) -> None:
        self.healthy = False
        self._down_since = time.monotonic()
        if self._on_error is not None:
            self._on_error(operation)
        now = time.monotonic()
        if now - self._last_log >= self.log_interval_s:
            logger.warning("redis cache unavailable, serving without it (%s: %s: %s; %d more "
                           "failures since the last message)", operation, type(exc).__name__,
                           exc, self._suppressed)
            self._last_log, self._suppressed = now, 0
        else:
            self._suppressed += 1

    def _succeeded(self) -> None:
        if not self.healthy:
            logger.warning("redis cache reachable again; cache use resumed")
        self.healthy = True
        self._down_since = None


def make_cache(settings: CacheSettings, *, on_error: ErrorCallback | None = None) -> Cache:
    """Redis when ``settings.redis_url`` is set, else the in-process LRU."""
    if settings.redis_url:
        return RedisCache(settings.redis_url, ttl_s=settings.ttl_s, on_error=on_error)
    return MemoryCache(max_entries=settings.max_entries, ttl_s=settings.ttl_s)


def _key(namespace: str, kind: str, payload: dict[str, Any]) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise InvalidRequest(
            f"namespace must be 1-64 characters of A-Z a-z 0-9 _ . -, got {namespace!r}",
            field="namespace")
    return f"slotgate:v1:{namespace}:{kind}:{canonical_hash(payload)}"


def read_key(namespace: str, request: DecisionRequest, fingerprint: str,
             inputs: Mapping[str, Any] | None = None) -> str:
    """Key of a raw fast read: what the backend's read depends on (``inputs``, from its
    ``read_inputs``; by default the question's signature, the state and the sampling) and the
    backend's fingerprint."""
    if inputs is None:
        inputs = {"signature": request.signature(), "state": request.state,
                  "samples": request.samples, "seed": request.seed,
                  **({"images": request.image_digests()} if request.images else {})}
    # The tier's fingerprint, hashed, leads the key, so `slotgate cache purge` finds a tier's
    # reads by pattern (``read_pattern``).
    return _key(namespace, f"read:{_tier_part(fingerprint)}", {**inputs, "fingerprint": fingerprint})


def read_pattern(fingerprint: str) -> str:
    """A Redis SCAN pattern for every read of the tier with ``fingerprint``, in any namespace."""
    return f"slotgate:v1:*:read:{_tier_part(fingerprint)}:*"


def _tier_part(fingerprint: str) -> str:
    return canonical_hash(fingerprint)[:16]


def slow_key(namespace: str, request: DecisionRequest, model: str) -> str:
    """Key of a slow answer: the question's signature, the state and the slow model."""
    return _key(namespace, "slow", {
        "signature": request.signature(), "state": request.state, "model": model,
        **({"images": request.image_digests()} if request.images else {}),
    })
