"""A wait for a slow-call slot that runs out with its deadline on a lagging event loop (a loaded
machine): the escalation's backstops, a little past the deadline, expire in the same turn as the
wait's own timeout, and the wait must be what ends, not the outermost backstop. The request never
reached the slow model, so it is the queue's refusal (429 + Retry-After, counted as rejected), not
a slow-model timeout (504). tests/reliability/test_slow_deadlines.py meets this under load: with 4
busy processes beside it and 16 slots, a backstop ending the wait gives 31 of 200 requests a
504."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from router.errors import SlowPathTimeout, TooManyRequests
from router.routing.deadline import deadline_in, queue_refusal, remaining_s
from router.routing.escalation import Escalation
from router.routing.litellm_import import litellm_module
from router.settings import Settings
from router.store.cache import MemoryCache
from router.store.metrics import Metrics
from tests.router.routing.test_backpressure import limit, one_slot_held, wait_for_a_slot
from tests.router.routing.test_slow import ScriptedCompletion, request, slow_path

DEADLINE_S = 0.2
# Resumed 0.05 + lag s in: 0.55 is past the slow path's backstop (the deadline + 0.25), 1.05 past
# the escalation's too (+ 0.5); either is the outermost timer due in that turn.
LAGS_S = {"slow path's backstop": 0.5, "escalation's backstop": 1.0}


async def lag_the_loop(after_s: float, lag_s: float = 1.0) -> None:
    """Block the event loop for ``lag_s``, ``after_s`` from now: every timer due meanwhile fires
    in the same turn afterwards."""
    await asyncio.sleep(after_s)
    time.sleep(lag_s)  # noqa: ASYNC251 - the point: a loop that lags


@pytest.fixture(scope="module", autouse=True)
def _litellm_imported() -> None:
    """As in a running server: the slow path translates a timeout with litellm's exception
    classes, and a first import there would block the loop for seconds, past every backstop."""
    litellm_module()


@pytest.mark.parametrize("lag_s", list(LAGS_S.values()), ids=list(LAGS_S))
async def test_a_queued_escalation_is_refused_not_timed_out_when_the_loop_lags(lag_s: float) -> None:
    gate = asyncio.Event()  # the slow model never answers the first call
    cap, rejected = limit(1, max_waiting=10)
    slow = slow_path(ScriptedCompletion('"lost_card"', gate=gate), limit=cap, timeout_s=DEADLINE_S)
    escalation = Escalation(slow=slow, cache=MemoryCache(), metrics=Metrics(),
                            settings=Settings(slow={"model": "openai/standin",
                                                    "timeout_s": DEADLINE_S}))
    in_flight = asyncio.create_task(escalation.answer(request("first"), namespace="default"))
    await asyncio.sleep(0.01)  # the first holds the only slot
    queued = asyncio.create_task(escalation.answer(request("second"), namespace="default"))
    await lag_the_loop(0.05, lag_s)
    results = await asyncio.gather(in_flight, queued, return_exceptions=True)
    assert isinstance(results[0], SlowPathTimeout)  # it was with the slow model: a 504
    assert isinstance(results[1], TooManyRequests), results[1]  # it never got a slot: a 429
    assert results[1].retry_after_s >= 1 and rejected == [1]
    gate.set()


async def test_a_wait_ended_by_a_backstop_past_its_deadline_is_noted_as_refused() -> None:
    async with one_slot_held() as (cap, rejected):
        with deadline_in(DEADLINE_S) as deadline:
            lag = asyncio.create_task(lag_the_loop(0.05))
            # The backstop's timeout, as the slow path's and the escalation's would be: it wins,
            # so the wait ends as a cancellation that goes on through it (never swallowed) ...
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(DEADLINE_S + 0.5):
                    await wait_for_a_slot(cap)
            # ... and the wait's refusal is noted on the deadline, and counted once.
            assert remaining_s(math.inf) == 0.0
            assert isinstance(queue_refusal(), TooManyRequests) and deadline.refusal is queue_refusal()
        assert rejected == [1]
        await lag


async def test_a_wait_cancelled_before_its_deadline_is_no_refusal() -> None:
    async with one_slot_held() as (cap, rejected):
        with deadline_in(5.0):
            waiting = asyncio.create_task(wait_for_a_slot(cap))
            await asyncio.sleep(0.01)
            waiting.cancel()  # a client that left
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert queue_refusal() is None
        assert rejected == []
