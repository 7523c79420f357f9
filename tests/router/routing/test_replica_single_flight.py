"""One slow call per question across replicas: two routing services (two replicas) share a real
private Redis; identical escalations on both make one slow call, the other replica takes the
answer from the cache, and takes over when the replica holding the claim gives it up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from policies.types import Decision, DecisionRequest, Option
from router.backends.mock import MockBackend
from router.errors import SlowPathUnavailable
from router.routing.ports import SlowAnswer
from router.routing.registry import PolicyRegistry
from router.routing.service import RoutingService
from router.settings import Settings
from router.store.cache import RedisCache
from router.store.metrics import Metrics
from tests.router.routing.test_service import ListLog

QUESTION = DecisionRequest("intent", "Which intent?", (Option("a"), Option("b"), Option("c")),
                           "my card never came")


class GatedSlow:
    """A slow model that answers 'c' once ``gate`` opens (or fails, when ``fail`` is set);
    ``calls`` is shared by the replicas' slow models, so it counts calls across them."""

    available = True

    def __init__(self, calls: list[str], gate: asyncio.Event, *, fail: bool = False) -> None:
        self.calls, self.gate, self.fail = calls, gate, fail

    async def ask(self, request: DecisionRequest) -> SlowAnswer:
        self.calls.append(request.state)
        await self.gate.wait()
        if self.fail:
            raise SlowPathUnavailable("this replica's slow model is down")
        return SlowAnswer("c", "gated", 1.0, 1)
    audit = ask  # one budget: audits and escalations alike


@pytest.fixture
async def caches(redis_url: str) -> AsyncIterator[tuple[RedisCache, RedisCache]]:
    """Two replicas' caches on the session's private Redis (flushed for each test)."""
    a, b = RedisCache(redis_url, ttl_s=60), RedisCache(redis_url, ttl_s=60)
    yield a, b
    await a.aclose()
    await b.aclose()


def replica(cache: RedisCache, slow: GatedSlow, *, claim_ttl_s: float = 3.0) -> RoutingService:
    """A replica whose fast read (0.5 on 'a') is always below the 0.9 fallback threshold."""
    return RoutingService(
        backend=MockBackend(lambda _: [0.5, 0.3, 0.2]), cache=cache, registry=PolicyRegistry(),
        slow=slow, log=ListLog(), metrics=Metrics(),  # type: ignore[arg-type]
        settings=Settings.model_validate({"slow": {"model": "gated", "timeout_s": 10},
                                          "cache": {"claim_ttl_s": claim_ttl_s}}))


async def burst(service: RoutingService, n: int) -> list[Decision]:
    return [d for ds in await asyncio.gather(*(
        service.route([QUESTION], namespace="t") for _ in range(n))) for d in ds]


async def test_identical_escalations_on_two_replicas_make_one_slow_call(
    caches: tuple[RedisCache, RedisCache],
) -> None:
    calls: list[str] = []
    gate = asyncio.Event()
    a = replica(caches[0], GatedSlow(calls, gate))
    b = replica(caches[1], GatedSlow(calls, gate))
    on_a = asyncio.ensure_future(burst(a, 10))
    await asyncio.sleep(0.1)  # a's call is in flight, holding the claim
    on_b = asyncio.ensure_future(burst(b, 10))
    await asyncio.sleep(0.1)
    gate.set()
    decisions = await on_a + await on_b
    assert len(calls) == 1
    assert {d.answer for d in decisions} == {"c"}
    assert [d.route for d in decisions].count("slow") == 1  # the rest: another's call
    assert all(d.escalated for d in decisions)


async def test_a_replica_whose_call_fails_hands_the_question_over(
    caches: tuple[RedisCache, RedisCache],
) -> None:
    calls: list[str] = []
    failing_gate, working_gate = asyncio.Event(), asyncio.Event()
    working_gate.set()
    a = replica(caches[0], GatedSlow(calls, failing_gate, fail=True))
    b = replica(caches[1], GatedSlow(calls, working_gate))
    on_a = asyncio.ensure_future(burst(a, 3))
    await asyncio.sleep(0.1)
    on_b = asyncio.ensure_future(burst(b, 3))
    await asyncio.sleep(0.1)
    assert len(calls) == 1  # b waits on a's claim
    failing_gate.set()
    with pytest.raises(SlowPathUnavailable):
        await on_a
    assert {d.answer for d in await on_b} == {"c"}
    assert len(calls) == 2  # a's failed call, then b's own


async def test_a_call_longer_than_the_claim_ttl_keeps_its_claim_by_heartbeat(
    caches: tuple[RedisCache, RedisCache],
) -> None:
    """The claim is short (so a dead holder frees it soon) and renewed while the call runs: a
    slow call four times the TTL is still the only one."""
    calls: list[str] = []
    gate = asyncio.Event()
    a = replica(caches[0], GatedSlow(calls, gate), claim_ttl_s=0.3)
    b = replica(caches[1], GatedSlow(calls, gate), claim_ttl_s=0.3)
    on_a = asyncio.ensure_future(burst(a, 3))
    await asyncio.sleep(0.1)
    on_b = asyncio.ensure_future(burst(b, 3))
    await asyncio.sleep(1.2)
    gate.set()
    assert {d.answer for d in await on_a + await on_b} == {"c"}
    assert len(calls) == 1


async def test_renew_extends_only_this_replicas_claim(
    caches: tuple[RedisCache, RedisCache],
) -> None:
    a, b = caches
    assert await a.claim("k", ttl_s=0.2) and not await b.claim("k", ttl_s=0.2)
    assert not await b.renew("k", ttl_s=5)  # not b's to extend
    assert await a.renew("k", ttl_s=5)
    await asyncio.sleep(0.4)  # past the first TTL: renewed, so still held
    assert not await b.claim("k", ttl_s=0.2)
    await a.release("k")
    assert await b.claim("k", ttl_s=0.2)
