"""SingleFlight on its own: identical concurrent calls share one, different keys do not, an
error reaches every caller, and the call stops once its last caller has left."""

from __future__ import annotations

import asyncio

import pytest

from router.routing.singleflight import SingleFlight


async def test_concurrent_callers_of_one_key_share_one_call() -> None:
    flights: SingleFlight[str] = SingleFlight()
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return "answer"

    results = await asyncio.gather(*(flights.run("k", call) for _ in range(50)))
    assert calls == 1 and {answer for answer, _ in results} == {"answer"}
    assert sorted(shared for _, shared in results) == [False] + [True] * 49
    assert len(flights) == 0  # forgotten once done: a later caller makes a new call
    await flights.run("k", call)
    assert calls == 2


async def test_different_keys_are_separate_calls() -> None:
    flights: SingleFlight[str] = SingleFlight()
    seen: list[str] = []

    async def call(key: str) -> str:
        seen.append(key)
        await asyncio.sleep(0.01)
        return key

    results = await asyncio.gather(*(flights.run(k, lambda k=k: call(k)) for k in "abc"))
    assert sorted(seen) == ["a", "b", "c"] and [r for r, _ in results] == ["a", "b", "c"]


async def test_an_error_reaches_every_caller() -> None:
    flights: SingleFlight[str] = SingleFlight()

    async def fail() -> str:
        await asyncio.sleep(0.01)
        raise ValueError("upstream broke")

    results = await asyncio.gather(*(flights.run("k", fail) for _ in range(3)),
                                   return_exceptions=True)
    assert all(isinstance(r, ValueError) for r in results)


async def test_one_caller_leaving_keeps_the_call_the_last_one_stops_it() -> None:
    flights: SingleFlight[str] = SingleFlight()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()
        return "late"

    first = asyncio.create_task(flights.run("k", slow))
    second = asyncio.create_task(flights.run("k", slow))
    await started.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not stopped.is_set() and len(flights) == 1  # the second caller still waits on it
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert stopped.is_set() and len(flights) == 0
