"""Backpressure: a concurrency cap with a bounded wait queue, so overload becomes a prompt 429
with Retry-After instead of unbounded memory and latency."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from router.errors import TooManyRequests


class ConcurrencyLimit:
    """A concurrency cap with a bounded wait queue: past ``max_waiting`` waiters a caller gets
    TooManyRequests (429 + Retry-After) at once, never unbounded memory or latency."""

    def __init__(self, name: str, *, capacity: int, max_waiting: int,
                 on_reject: Callable[[], None]) -> None:
        self.name = name
        self.max_waiting = max_waiting
        self._semaphore = asyncio.Semaphore(capacity)
        self._waiting = 0
        self._on_reject = on_reject

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[None]:
        if self._semaphore.locked() and self._waiting >= self.max_waiting:
            self._on_reject()
            raise TooManyRequests(
                f"the {self.name} queue is full ({self.max_waiting} waiting); retry later",
                retry_after_s=1.0)
        self._waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self._waiting -= 1
        try:
            yield
        finally:
            self._semaphore.release()
