"""Backpressure: a concurrency cap with a bounded wait queue, so overload becomes a prompt 429
with Retry-After instead of unbounded memory and latency. Under a deadline
(router/routing/deadline.py) the queue also refuses a caller it cannot serve in time, and a
caller never waits past its deadline."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from router.errors import TooManyRequests
from router.routing.deadline import note_refusal, remaining_s

# Weight of the newest hold time in the moving average the deadline check uses: recent enough
# to see a stalled upstream within a few calls, smooth enough not to swing on one fast answer.
HOLD_EWMA_WEIGHT = 0.2


class ConcurrencyLimit:
    """A concurrency cap with a bounded wait queue: past ``max_waiting`` waiters a caller gets
    TooManyRequests (429 + Retry-After) at once, never unbounded memory or latency."""

    def __init__(self, name: str, *, capacity: int, max_waiting: int,
                 on_reject: Callable[[], None]) -> None:
        self.name = name
        self.capacity = capacity
        self.max_waiting = max_waiting
        self._semaphore = asyncio.Semaphore(capacity)
        self._waiting = 0
        self._on_reject = on_reject
        self.hold_s: float | None = None  # moving average of how long a slot is held

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[None]:
        if self._semaphore.locked():
            self._refuse_if_hopeless()
        self._waiting += 1
        try:
            budget_s = remaining_s(math.inf)
            try:
                async with asyncio.timeout(None if math.isinf(budget_s) else budget_s):
                    await self._semaphore.acquire()
            except TimeoutError:
                raise self._refuse_at_deadline() from None
            except asyncio.CancelledError:
                # Cancelled while waiting, with the deadline passed: a backstop past the deadline
                # expired in the same turn of a lagging loop and ended the wait before this
                # wait's own timeout could (router/routing/deadline.py). The queue still could
                # not serve it in time: counted and noted, and the cancellation goes on.
                if remaining_s(math.inf) == 0.0:
                    note_refusal(self._refuse_at_deadline())
                raise
        finally:
            self._waiting -= 1
        started = time.monotonic()
        try:
            yield
        finally:
            self._semaphore.release()
            held = time.monotonic() - started
            self.hold_s = held if self.hold_s is None else (
                HOLD_EWMA_WEIGHT * held + (1 - HOLD_EWMA_WEIGHT) * self.hold_s)

    def _refuse_if_hopeless(self) -> None:
        """429 now when the queue is full, or when the wait it would take (the callers ahead,
        served ``capacity`` at a time, each holding a slot for the average hold time) is longer
        than the time left before the deadline."""
        if self._waiting >= self.max_waiting:
            reason = f"the {self.name} queue is full ({self.max_waiting} waiting)"
        else:
            budget_s = remaining_s(math.inf)
            expected_s = (self._waiting // self.capacity + 1) * (self.hold_s or 0.0)
            if expected_s < budget_s:
                return
            reason = (f"the {self.name} cannot serve this request before its deadline "
                      f"(about {expected_s:.1f} s of queue, {budget_s:.1f} s left)")
        self._on_reject()
        raise TooManyRequests(f"{reason}; retry later", retry_after_s=self._retry_after_s())

    def _refuse_at_deadline(self) -> TooManyRequests:
        """The refusal of a wait that ran out with its deadline (counted)."""
        self._on_reject()
        return TooManyRequests(f"the {self.name} had no free slot before the deadline; retry later",
                               retry_after_s=self._retry_after_s())

    def _retry_after_s(self) -> float:
        """About when a slot frees up: the average hold, at least a second."""
        return max(1.0, self.hold_s or 1.0)
