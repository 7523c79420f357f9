"""ConcurrencyLimit on its own: at most ``capacity`` holders, at most ``max_waiting`` waiters,
everyone past that refused at once with TooManyRequests (429 + Retry-After), and slots and wait
places given back when a holder fails or a waiter is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from router.errors import TooManyRequests
from router.routing.backpressure import ConcurrencyLimit


def limit(capacity: int, max_waiting: int) -> tuple[ConcurrencyLimit, list[int]]:
    rejected: list[int] = []
    return ConcurrencyLimit("test backend", capacity=capacity, max_waiting=max_waiting,
                            on_reject=lambda: rejected.append(1)), rejected


@contextlib.asynccontextmanager
async def one_slot_held(max_waiting: int = 10) -> AsyncIterator[tuple[ConcurrencyLimit, list[int]]]:
    """A cap of one slot, held until the block ends: (the cap, its rejections)."""
    cap, rejected = limit(1, max_waiting=max_waiting)
    gate = asyncio.Event()

    async def hold() -> None:
        async with cap.acquire():
            await gate.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    try:
        yield cap, rejected
    finally:
        gate.set()
        await holder


async def wait_for_a_slot(cap: ConcurrencyLimit) -> None:
    async with cap.acquire():
        pass


async def test_at_most_capacity_hold_it_at_once() -> None:
    cap, rejected = limit(2, max_waiting=10)
    running = peak = 0

    async def work() -> None:
        nonlocal running, peak
        async with cap.acquire():
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

    await asyncio.gather(*(work() for _ in range(8)))
    assert peak == 2 and rejected == []


async def test_past_the_wait_queue_callers_are_refused_at_once() -> None:
    async with one_slot_held(max_waiting=1) as (cap, rejected):
        waiter = asyncio.create_task(wait_for_a_slot(cap))
        await asyncio.sleep(0)
        with pytest.raises(TooManyRequests) as info:
            await wait_for_a_slot(cap)
        assert info.value.status_code == 429 and info.value.retry_after_s >= 1
        assert "test backend queue is full (1 waiting)" in info.value.message and rejected == [1]
    await waiter
    await wait_for_a_slot(cap)  # all given back


async def test_a_failing_holder_and_a_cancelled_waiter_give_their_places_back() -> None:
    cap, rejected = limit(1, max_waiting=1)
    with pytest.raises(RuntimeError):
        async with cap.acquire():
            raise RuntimeError("the call failed")
    gate = asyncio.Event()

    async def hold() -> None:
        async with cap.acquire():
            await gate.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # The cancelled waiter's place is free again: one more may wait instead of being refused.
    second = asyncio.create_task(hold())
    await asyncio.sleep(0)
    assert rejected == []
    gate.set()
    await asyncio.gather(holder, second)


async def test_under_a_deadline_a_hopeless_wait_is_refused_at_once() -> None:
    from router.routing.deadline import deadline_in

    async with one_slot_held(max_waiting=100) as (cap, rejected):
        cap.hold_s = 1.0  # a slot is held about a second: a 0.3 s deadline cannot be met
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with deadline_in(0.3), pytest.raises(TooManyRequests, match="before its deadline") as info:
            await wait_for_a_slot(cap)
        assert loop.time() - t0 < 0.05 and rejected == [1] and info.value.retry_after_s >= 1.0
        cap.hold_s = 0.0  # no history of long holds: it waits, but never past its deadline
        t0 = loop.time()
        with deadline_in(0.2), pytest.raises(TooManyRequests, match="no free slot before the deadline"):
            await wait_for_a_slot(cap)
        assert 0.15 < loop.time() - t0 < 0.5 and rejected == [1, 1]
