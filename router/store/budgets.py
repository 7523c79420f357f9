"""Per-key escalation budgets: the units of slow calls each API key (its cache namespace) spent
in the current fixed window of ``budget.window_s`` seconds (windows aligned to the epoch). Kept
in Redis when one is configured, so every replica counts against one budget; in this process
otherwise, and while Redis is unreachable (each process then counts on its own, never
unlimited)."""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.settings import Settings

logger = logging.getLogger(__name__)

# One atomic round trip on one key per namespace: {window, used}. The window index comes from
# Redis's own clock, so replicas' clocks need not agree; a new window starts at 0. ARGV: limit,
# amount (0: only look), window_s. Returns {used, seconds to the window's end} as strings.
BUDGET_LUA = """
local window_s = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local index = math.floor(now / window_s)
local state = redis.call('HMGET', KEYS[1], 'window', 'used')
local used = 0
if tonumber(state[1]) == index then
  used = tonumber(state[2]) or 0
end
local amount = tonumber(ARGV[2])
if amount > 0 then
  used = used + amount
  redis.call('HSET', KEYS[1], 'window', index, 'used', tostring(used))
  redis.call('PEXPIRE', KEYS[1], math.ceil(window_s * 1000) + 1000)
end
return {tostring(used), tostring((index + 1) * window_s - now)}
"""


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One key's budget in the current window: ``used`` of ``limit`` units, the window ends in
    ``reset_s`` seconds."""

    limit: float
    used: float
    reset_s: float

    @property
    def remaining(self) -> float:
        return max(0.0, self.limit - self.used)

    @property
    def spent(self) -> bool:
        return self.used >= self.limit


class KeyBudgets:
    """Budgets counted in this process. ``limit``: units per window for every key;
    ``per_key``: a key's own limit, by the sha256 hex of the key (as ``api_key_hashes``)."""

    def __init__(self, *, limit: float, window_s: float, per_key: Mapping[str, float] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        # The admission guard names a key's namespace after its hash's first 16 hex digits.
        self._limits = {f"key-{h[:16]}": v for h, v in (per_key or {}).items()}
        self._used: dict[str, tuple[int, float]] = {}  # namespace -> (window index, used)

    def limit_of(self, namespace: str) -> float:
        return self._limits.get(namespace, self.limit)

    async def state(self, namespace: str) -> BudgetState:
        """``namespace``'s budget now."""
        return self._local(namespace, 0.0)

    async def charge(self, namespace: str, amount: float) -> BudgetState:
        """Spend ``amount`` units of ``namespace``'s budget (a slow call made); its state after."""
        return self._local(namespace, amount)

    async def aclose(self) -> None:
        """Nothing to release."""

    def _local(self, namespace: str, amount: float) -> BudgetState:
        now = self.clock()
        index = math.floor(now / self.window_s)
        window, used = self._used.get(namespace, (index, 0.0))
        used = used if window == index else 0.0
        if amount > 0:
            used += amount
            self._used[namespace] = (index, used)
        return BudgetState(self.limit_of(namespace), used, (index + 1) * self.window_s - now)


class RedisKeyBudgets(KeyBudgets):
    """The same budgets kept in Redis (one script call a look or a charge), shared by every
    replica. A Redis failure counts in this process for ``retry_interval_s``."""

    def __init__(self, url: str, *, limit: float, window_s: float,
                 per_key: Mapping[str, float] | None = None, timeout_s: float = 0.25,
                 retry_interval_s: float = 1.0) -> None:
        from router.store.redis_client import redis_client

        super().__init__(limit=limit, window_s=window_s, per_key=per_key)
        self.retry_interval_s = retry_interval_s
        self.client: Any = redis_client(url, timeout_s=timeout_s)
        self._script = self.client.register_script(BUDGET_LUA)
        self._down_since: float | None = None

    @staticmethod
    def redis_key(namespace: str) -> str:
        # Hashed: a namespace never shapes a key beyond its digest.
        return f"slotgate:v1:budget:{hashlib.sha256(namespace.encode()).hexdigest()}"

    async def state(self, namespace: str) -> BudgetState:
        return await self._shared(namespace, 0.0)

    async def charge(self, namespace: str, amount: float) -> BudgetState:
        return await self._shared(namespace, amount)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _shared(self, namespace: str, amount: float) -> BudgetState:
        if self._down_since is not None and (
                time.monotonic() - self._down_since < self.retry_interval_s):
            return self._local(namespace, amount)
        from router.store.redis_client import redis_errors

        try:
            used, reset_s = await self._script(
                keys=[self.redis_key(namespace)], args=[self.limit_of(namespace), amount,
                                                        self.window_s])
        except redis_errors() as exc:
            if self._down_since is None:
                logger.warning("budgets: redis unavailable (%s: %s); each process counts on "
                               "its own until it is back", type(exc).__name__, exc)
            self._down_since = time.monotonic()
            return self._local(namespace, amount)
        if self._down_since is not None:
            logger.warning("budgets: redis reachable again; budgets are shared again")
            self._down_since = None
        return BudgetState(self.limit_of(namespace), float(used), float(reset_s))


def make_budgets(settings: Settings) -> KeyBudgets | None:
    """None while ``budget.limit`` is unset; shared through Redis when a Redis URL is set."""
    budget = settings.budget
    if budget.limit is None:
        return None
    if settings.cache.redis_url:
        return RedisKeyBudgets(settings.cache.redis_url, limit=budget.limit,
                               window_s=budget.window_s, per_key=budget.per_key)
    return KeyBudgets(limit=budget.limit, window_s=budget.window_s, per_key=budget.per_key)
