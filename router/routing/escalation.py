"""Escalation: the slow model's answer to a decision the policy did not accept, through the
slow-answer cache, with one slow call per question (identical escalations share it: in this
process by single-flight, across replicas by a claim in the shared cache) and the slow deadline.
The routing service owns one; it raises what the service's callers map (``SlowPathError``
subclasses, ``TooManyRequests``)."""

from __future__ import annotations

import asyncio
import copy
import time

from policies.types import DecisionRequest
from router.errors import NoSlowModel, SlowPathError, SlowPathTimeout, SlowPathUnavailable
from router.routing.deadline import deadline_in, queue_refusal
from router.routing.ports import ReadCache, SlowModel
from router.routing.singleflight import SingleFlight
from router.settings import Settings
from router.store.cache import slow_key
from router.store.metrics import Metrics

# How long past slow.timeout_s the service waits before cancelling an escalation itself. The
# slow path's own timeout (litellm's, set to what is left of the deadline) ends a call first and
# cleanly; cancelling litellm mid-call instead leaves its internal coroutines never awaited.
DEADLINE_GRACE_S = 0.5

# How often a replica waiting for another replica's slow answer looks for it in the cache: from
# CLAIM_POLL_S, doubling up to CLAIM_POLL_MAX_S (slow answers take ~0.5-5 s; polling, not
# pub/sub, keeps the shared store a plain key-value cache with nothing to subscribe to).
CLAIM_POLL_S = 0.02
CLAIM_POLL_MAX_S = 0.25


class Escalation:
    """Slow answers for the routing service: ``answer(request)`` is (answer, without a slow call
    of its own)."""

    def __init__(self, *, slow: SlowModel | None, cache: ReadCache, metrics: Metrics,
                 settings: Settings) -> None:
        self.slow = slow
        self.cache = cache
        self.metrics = metrics
        self.settings = settings
        self._calls: SingleFlight[tuple[str, bool]] = SingleFlight()

    @property
    def available(self) -> bool:
        return self.slow is not None and self.slow.available

    async def answer(self, request: DecisionRequest, *, namespace: str) -> tuple[str, bool]:
        """(answer, without a slow call of its own: from the slow cache, or shared with an
        identical escalation already in flight). Raises SlowPathError subclasses (SlowPathTimeout
        past ``slow.timeout_s``, which covers the cache, the wait for a slot, the call and its
        corrective retry), or TooManyRequests when the slow model's queue is full or cannot
        serve it before that deadline."""
        if self.slow is None or not self.slow.available:
            reason = getattr(self.slow, "unavailable_reason", None)
            if reason and self.settings.slow.model:  # configured, but no credentials for it
                raise SlowPathUnavailable(reason)
            raise NoSlowModel()
        timeout_s = self.settings.slow.timeout_s
        key = slow_key(namespace, request, self.settings.slow.model or "")
        with deadline_in(timeout_s):
            try:  # a backstop: the slow path and its queue end at the deadline themselves
                async with asyncio.timeout(timeout_s + DEADLINE_GRACE_S):
                    [blob] = await self.cache.get_many([key])
                    answer = _slow_answer(blob, request)
                    if answer is not None:
                        self.metrics.cache_lookups(store="slow", hits=1, misses=0)
                        return answer, True
                    self.metrics.cache_lookups(store="slow", hits=0, misses=1)
                    # One slow call per question: identical escalations in flight share it,
                    # in this process (single-flight) and across replicas (the cache's claim).
                    (answer, elsewhere), shared = await self._calls.run(
                        key, lambda: self._ask(request, key))
                    return answer, shared or elsewhere
            except TimeoutError as exc:
                if (refused := queue_refusal()) is not None:
                    raise refused from None  # the wait for a slot ran out: a 429, not a 504
                raise SlowPathTimeout(
                    f"no slow answer within slow.timeout_s = {timeout_s:g} s (the wait for a "
                    "slow-call slot included)") from exc

    async def _ask(self, request: DecisionRequest, key: str) -> tuple[str, bool]:
        """The one slow call of a single flight, and whether another replica made it. The
        replica that claims ``key`` in the shared cache calls the slow model and caches the
        answer; the others poll the cache for it, and claim in turn if the claim is given up
        without one (that replica's call failed). The claim is short (``cache.claim_ttl_s``)
        and renewed by its holder while the call runs: a replica that dies holding it frees the
        question within that time, and a waiter then claims it and calls."""
        assert self.slow is not None  # answer() checked
        ttl_s = self.settings.cache.claim_ttl_s
        poll_s = CLAIM_POLL_S
        while not await self.cache.claim(key, ttl_s=ttl_s):
            await asyncio.sleep(poll_s)
            poll_s = min(2 * poll_s, CLAIM_POLL_MAX_S)
            [blob] = await self.cache.get_many([key])
            if (answer := _slow_answer(blob, request)) is not None:
                return answer, True
        # Claimed. A replica that cached its answer and released between our last look and our
        # claim (a window of one round trip) costs a second call, as before claims existed;
        # looking again here would cost every escalation a round trip instead.
        done = asyncio.Event()
        heartbeat = asyncio.create_task(self._renew(key, ttl_s, done))
        try:
            t0 = time.perf_counter()
            try:
                slow_answer = await self.slow.ask(request)
            finally:
                self.metrics.stage("slow", time.perf_counter() - t0)
            await self.cache.set_many([(key, slow_answer.answer.encode())])
            return slow_answer.answer, False
        finally:
            # ``done`` first: a cancel that lands while a renew is on the wire can be consumed by
            # the Redis client (redis-py 8.1 returned the renew's reply instead of raising), and
            # the heartbeat must not go on renewing while this waits for it (it did: the answer
            # was held until slow.timeout_s, a 504; tests/reliability/test_claim_heartbeat.py).
            done.set()
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            await self.cache.release(key)

    async def _renew(self, key: str, ttl_s: float, done: asyncio.Event) -> None:
        """The claim holder's heartbeat: renew every third of the TTL, so two beats can be late
        (a loaded event loop) before another replica takes the question over. Stops when the
        claim is no longer ours (lapsed and taken: that replica's answer is as good), and once
        ``done`` is set, whether or not the cancellation that comes with it got through."""
        while not done.is_set():
            await asyncio.sleep(ttl_s / 3)
            if done.is_set() or not await self.cache.renew(key, ttl_s=ttl_s):
                return


def _slow_answer(blob: bytes | None, request: DecisionRequest) -> str | None:
    """A cached slow answer, if it is one of the request's options (else it is asked again)."""
    if blob is None:
        return None
    answer = blob.decode(errors="replace")
    return answer if answer in request.option_names else None


def explained(exc: SlowPathError, error_note: str | None,
              failure: str | None = None) -> SlowPathError:
    """The slow path's error, with why the decision needed the slow model appended (a copy:
    single flight hands one exception object to every waiter of the question)."""
    if error_note is None:
        return exc
    out = copy.copy(exc)
    out.message = f"{exc.message}; {error_note}" + (f"; {failure}" if failure else "")
    out.args = (out.message,)
    return out
