"""Fast reads shared by key: decisions that need the same fast read at the same time (one
read-cache key: namespace, question, message, backend fingerprint) make one backend read.

Real traffic repeats itself in bursts: a popular message, a client's retries, a page that asks
twice. Each such decision missed the read cache (the first read had not answered yet) and took
its own place in the GPU's batch; 50 identical decisions cost 50 reads. Now the first asks the
backend and the others wait on its read (their route says ``cache``: they cost no read).

The read runs as its own task, so a decision that leaves (a client that disconnects) fails no
one waiting on its read; the task writes the read cache whether or not anyone still waits. A
failed read fails every decision that waited on it, each with the same error (each escalates).
Within one process; across replicas the read cache is what they share.

Not ``singleflight.SingleFlight`` (the escalations'): that runs one call per key and stops it
when its last waiter leaves; here one backend call reads all of a decision list's new keys (an
HTTP backend's batch), and it runs to the end so that the read cache gets its answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from policies.types import DecisionRequest, OptionScores
from router.errors import BackendError

ReadMany = Callable[[list[DecisionRequest]], Awaitable[list[OptionScores]]]
Store = Callable[[list[tuple[str, OptionScores]]], Awaitable[None]]


class SharedRead(NamedTuple):
    """One key's read: its scores, or the backend's error; ``shared``: another decision's read."""

    scores: OptionScores | None
    error: BackendError | None
    shared: bool


class SharedReads:
    def __init__(self) -> None:
        self._flights: dict[str, asyncio.Future[OptionScores]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Keys being read now."""
        return len(self._flights)

    async def read(self, keys: Sequence[str], requests: Sequence[DecisionRequest], read_many: ReadMany,
                   store: Store) -> list[SharedRead]:
        """Each request's read (``keys[i]`` its read-cache key): a key already being read is
        waited for; the others are read by one ``read_many`` call (a key asked twice, once) whose
        results ``store`` writes. Errors other than a ``BackendError`` are raised."""
        loop = asyncio.get_running_loop()
        flights: dict[str, asyncio.Future[OptionScores]] = {}
        own: dict[str, DecisionRequest] = {}
        for key, request in zip(keys, requests, strict=True):
            if key in flights:
                continue
            flight = self._flights.get(key)
            if flight is None:
                flight = loop.create_future()
                flight.add_done_callback(_retrieved)
                self._flights[key] = flight
                own[key] = request
            flights[key] = flight
        if own:
            task = loop.create_task(self._read(own, {key: flights[key] for key in own}, read_many, store))
            self._tasks.add(task)  # a reference until it ends (the loop keeps weak ones)
            task.add_done_callback(self._tasks.discard)
        out = []
        for key in keys:
            try:
                out.append(SharedRead(await asyncio.shield(flights[key]), None, key not in own))
            except BackendError as exc:
                out.append(SharedRead(None, exc, key not in own))
        return out

    async def _read(self, own: dict[str, DecisionRequest], flights: dict[str, asyncio.Future[OptionScores]],
                    read_many: ReadMany, store: Store) -> None:
        try:
            try:
                fresh = await read_many(list(own.values()))
            except asyncio.CancelledError:
                for flight in flights.values():
                    flight.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 (every waiter gets it: BackendError or a bug)
                for flight in flights.values():
                    flight.set_exception(exc)
                return
            for flight, scores in zip(flights.values(), fresh, strict=True):
                flight.set_result(scores)
            await store(list(zip(own, fresh, strict=True)))
        finally:
            for key, flight in flights.items():
                if self._flights.get(key) is flight:
                    del self._flights[key]


def _retrieved(flight: asyncio.Future[OptionScores]) -> None:
    """Marks a flight's error as retrieved: its waiters got it, or all of them left."""
    if not flight.cancelled():
        flight.exception()
