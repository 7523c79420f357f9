"""The claim holder's heartbeat (router/routing/escalation.py) ends when its escalation is done,
even when the Redis call it is making at that moment swallows the cancellation.

The case: a renew in flight when the cancel comes (``RedisCache.renew``, redis-py 8.1) can
return True with the task's ``cancelling()`` at 1, i.e. the CancelledError never reaches
``_renew``. A ``while True`` renew loop then goes on renewing the claim every second, back in its
``asyncio.sleep``, while ``Escalation._ask`` waits in ``await asyncio.gather(heartbeat)`` after
``heartbeat.cancel()``: the answer is cached, yet the request gets a 504 at slow.timeout_s, and
the claim stays alive for the others. Any escalation through Redis whose slow call ends while a
renew is on the wire (every ``claim_ttl_s / 3`` = 1 s; a long call or a first call waiting for
litellm's import makes several) is exposed; under CPU load the 900 KB memory test
(tests/reliability/test_memory.py, redis variant) meets it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from policies.types import DecisionRequest, Option
from router.routing.escalation import Escalation
from router.routing.ports import SlowAnswer
from router.settings import Settings
from router.store.metrics import Metrics


class RenewSwallowsCancel:
    """A shared cache whose ``renew`` finishes its round trip when cancelled mid-way and returns
    its result, as redis-py's call did: the cancellation is consumed, nothing is raised."""

    def __init__(self) -> None:
        self.renewing = asyncio.Event()
        self.renews = 0
        self.swallowed = 0
        self.released = False

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [None] * len(keys)

    async def set_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        return None

    async def ping(self) -> bool:
        return True

    async def claim(self, key: str, *, ttl_s: float) -> bool:
        return True

    async def renew(self, key: str, *, ttl_s: float) -> bool:
        self.renews += 1
        self.renewing.set()
        try:
            await asyncio.sleep(0.05)  # the round trip
        except asyncio.CancelledError:
            if self.swallowed:  # once, as seen: a later cancel ends the task
                raise
            self.swallowed += 1
            await asyncio.sleep(0.01)  # the reply is read all the same; the cancel is lost
        return True

    async def release(self, key: str) -> None:
        self.released = True


class AnswersDuringARenew:
    """A slow model that answers while the claim's heartbeat has a renew on the wire."""

    available = True
    unavailable_reason = None

    def __init__(self, cache: RenewSwallowsCancel) -> None:
        self.cache = cache

    async def ask(self, request: DecisionRequest) -> SlowAnswer:
        await self.cache.renewing.wait()
        return SlowAnswer(request.options[0].name, "standin", 1.0, 1)
    audit = ask  # one budget: audits and escalations alike


async def test_an_escalation_ends_when_its_heartbeats_renew_swallows_the_cancel() -> None:
    """The answer comes as soon as the slow call ends, and the heartbeat stops renewing; a
    heartbeat that missed its cancel would hold the answer until slow.timeout_s (here 5 s:
    SlowPathTimeout), renewing the claim all the while."""
    cache = RenewSwallowsCancel()
    settings = Settings(slow={"model": "openai/standin", "timeout_s": 5},
                        cache={"claim_ttl_s": 0.03})  # a renew every 10 ms
    escalation = Escalation(slow=AnswersDuringARenew(cache), cache=cache,  # type: ignore[arg-type]
                            metrics=Metrics(), settings=settings)
    request = DecisionRequest("intent", "Which?", (Option("lost_card"), Option("card_arrival")),
                              "where is my card?")
    t0 = time.monotonic()
    answer, elsewhere = await escalation.answer(request, namespace="default")
    elapsed_s = time.monotonic() - t0
    renews_at_answer = cache.renews
    await asyncio.sleep(0.1)  # a heartbeat still running would renew ~10 more times here
    assert (answer, elsewhere) == ("lost_card", False)
    assert cache.swallowed == 1  # the case: the heartbeat's cancel was lost in a renew
    assert elapsed_s < 1.0, f"the answer waited {elapsed_s:.2f} s for the heartbeat"
    assert cache.renews == renews_at_answer and cache.released
