"""Single-flight: concurrent callers asking the same question (the same slow-answer key) share
one call instead of making one each. 50 identical escalations arriving together cost one slow
call; the first caller starts it, the others wait on it.

The call runs as its own task, so one caller leaving (a client that disconnects, a request whose
other question failed) does not fail the others; when the last caller leaves, the call is
cancelled, so no escalation keeps running for nobody."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class _Call(Generic[T]):
    task: asyncio.Future[T]
    waiters: int = 0


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._calls: dict[str, _Call[T]] = {}

    def __len__(self) -> int:
        return len(self._calls)

    async def run(self, key: str, call: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """``call()``'s result and whether it was shared (another caller had started it).
        Every caller of one flight gets the same result or the same exception."""
        flight = self._calls.get(key)
        shared = flight is not None
        if flight is None:
            flight = _Call(asyncio.ensure_future(call()))
            self._calls[key] = flight
            flight.task.add_done_callback(lambda task: self._done(key, flight, task))
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task), shared
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()  # nobody is waiting for it any more
                self._forget(key, flight)
                # Until it has stopped: a caller that leaves leaves nothing running behind it.
                await asyncio.gather(flight.task, return_exceptions=True)

    def _done(self, key: str, flight: _Call[T], task: asyncio.Future[T]) -> None:
        self._forget(key, flight)
        if not task.cancelled():
            task.exception()  # marked retrieved: the waiters got it, or left before it came

    def _forget(self, key: str, flight: _Call[T]) -> None:
        if self._calls.get(key) is flight:
            del self._calls[key]
