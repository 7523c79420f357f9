"""The routing service: cache, fast read, calibrated policy, escalation, decision log. It speaks
DecisionRequest/Decision only (no HTTP types), so every wire surface shares one behaviour.

Failure semantics: a fast backend that fails or passes ``fast.timeout_s`` escalates (counted);
an escalation with no usable slow path raises a ``SlowPathError`` (``NoSlowModel`` when none is
configured: 503, its message says escalation is unavailable) unless
``slow.serve_unverified_on_failure``, which returns the fast answer with route ``unverified`` and
a note. A full fast-backend or slow-model queue raises ``TooManyRequests``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import orjson

from policies.types import Decision, DecisionRequest, OptionScores
from router.backends.base import FastBackend
from router.errors import (
    BackendError,
    BackendMalformed,
    BackendTimeout,
    SlowPathError,
)
from router.routing.backpressure import ConcurrencyLimit
from router.routing.escalation import Escalation
from router.routing.ports import (
    NOT_READ,
    DecisionObserver,
    DecisionSink,
    FastRead,
    Observation,
    ReadCache,
    SlowModel,
)
from router.routing.registry import PolicyRegistry, RuntimePolicy
from router.routing.shared_reads import SharedReads
from router.routing.unscoped import route_unscoped
from router.settings import Settings
from router.store.cache import read_key
from router.store.metrics import Metrics
from router.store.records import DecisionRecord

_T = TypeVar("_T")
_S = TypeVar("_S", bound=OptionScores | None)




class RoutingService:
    """Decisions through cache, fast read, policy and escalation. The parts come in through the
    seams of ``router.routing.ports``; the slow model brings its own concurrency cap."""

    def __init__(
        self,
        *,
        backend: FastBackend,
        cache: ReadCache,
        registry: PolicyRegistry,
        slow: SlowModel | None,
        log: DecisionSink,
        metrics: Metrics,
        settings: Settings,
        monitor: DecisionObserver | None = None,
    ) -> None:
        self.backend = backend
        self.monitor = monitor  # production monitoring: told of every decision with a fast read
        self.cache = cache
        self.registry = registry
        self.slow = slow
        self.log = log
        self.metrics = metrics
        self.settings = settings
        self._fast_limit = ConcurrencyLimit(
            f"fast backend ({backend.name})", capacity=settings.fast.max_concurrency,
            max_waiting=settings.max_queue, on_reject=lambda: metrics.queue_rejected(backend.name))
        self.escalation = Escalation(slow=slow, cache=cache, metrics=metrics, settings=settings)
        self.shared_reads = SharedReads()  # identical fast reads at once: one backend read
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def escalation_available(self) -> bool:
        return self.escalation.available

    async def decide(
        self, requests: Sequence[DecisionRequest], *, namespace: str,
        reads: Sequence[FastRead] | None = None,
    ) -> list[Decision]:
        """One Decision per request, in order; every one is in the decision log when this returns.
        ``reads``: the requests' fast reads, already made (a staged read); else they are read."""
        self._in_flight += 1
        self._idle.clear()
        started = time.perf_counter()
        try:
            # Policies first: an unknown policy name is the caller's error, found before any read.
            fingerprint = self.backend.fingerprint
            policies = [self.registry.lookup(r, fingerprint=fingerprint) for r in requests]
            if reads is None:
                reads = await self._fast_reads(
                    requests, namespace=namespace, fingerprint=fingerprint,
                    needed=[self.reads_fast(p) for p in policies])
            elif len(reads) != len(requests):
                raise ValueError(f"{len(reads)} reads given for {len(requests)} requests")
            reads = list(reads)  # a read made late (``read_later``) is logged in its place

            def read_later(i: int) -> Callable[[], Awaitable[FastRead]]:
                async def read() -> FastRead:
                    [reads[i]] = await self._fast_reads([requests[i]], namespace=namespace,
                                                        fingerprint=fingerprint)
                    return reads[i]
                return read

            decisions = await _all_or_none([
                self._route(request, read, policy, namespace=namespace, started=started,
                            read_later=read_later(i))
                for i, (request, read, policy) in enumerate(zip(requests, reads, policies,
                                                                strict=True))
            ])
            await asyncio.gather(*(
                self.log.append(_record(request, read, decision, namespace, fingerprint))
                for request, read, decision in zip(requests, reads, decisions, strict=True)
            ))
            self.metrics.stage("total", time.perf_counter() - started)
            return list(decisions)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def drain(self, *, timeout_s: float) -> bool:
        """Wait until no decision is in flight (graceful shutdown); False if time ran out."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def reads_fast(self, policy: RuntimePolicy | None) -> bool:
        """Whether routing a decision that ``registry.lookup`` gave ``policy`` uses a fast read:
        every decision a policy (or the ``threshold`` fallback) judges does, and so does an
        unscoped one under ``policy.unscoped`` ``shadow`` (or ``policy.shadow``, which logs it)
        and ``unverified`` (which serves it). An unscoped one under ``escalate`` goes to the slow
        model whatever the read says, so none is made: no backend call, no read-cache lookup
        (``slow.serve_unverified_on_failure`` reads it only when the slow path fails)."""
        registry = self.registry
        return policy is not None or registry.unscoped != "escalate" or registry.shadow_all

    async def _fast_reads(
        self, requests: Sequence[DecisionRequest], *, namespace: str, fingerprint: str,
        needed: Sequence[bool] | None = None,
    ) -> list[FastRead]:
        """The reads of ``requests``, those ``needed`` (default: all) through the read cache and
        the backend; the others are ``NOT_READ``. A backend that reads jointly reads the whole
        batch when any question needs it (its answers depend on their co-questions)."""
        backend = self.backend
        if needed is not None and not all(needed):
            if not any(needed):
                return [NOT_READ] * len(requests)
            if not backend.reads_jointly:
                wanted = [i for i, need in enumerate(needed) if need]
                reads = [NOT_READ] * len(requests)
                for i, read in zip(wanted, await self._fast_reads(
                        [requests[i] for i in wanted], namespace=namespace,
                        fingerprint=fingerprint), strict=True):
                    reads[i] = read
                return reads
        keys = [read_key(namespace, r, fingerprint, backend.read_inputs(r, requests))
                for r in requests]
        blobs = await self.look_up(keys)
        reads = [FastRead(decode_scores(blob, request), cached=True)
                 for blob, request in zip(blobs, requests)]
        misses = [i for i, read in enumerate(reads) if read.scores is None]
        self.metrics.cache_lookups(store="read", hits=len(reads) - len(misses), misses=len(misses))
        if not misses:
            return reads
        if backend.reads_jointly:  # a joint read's answers depend on each other: read all again
            misses = list(range(len(requests)))
            try:
                fresh = await self._read_backend([requests[i] for i in misses])
            except BackendError as exc:
                failure = self.read_failed(exc)
                for i in misses:
                    reads[i] = FastRead(None, cached=False, failure=failure)
                return reads
            for i, scores in zip(misses, fresh):
                reads[i] = FastRead(scores, cached=False)
            await self._store_reads([(keys[i], s) for i, s in zip(misses, fresh)])
            return reads
        # a read another decision is making now (the same key) is waited for, not made again
        outcomes = await self.shared_reads.read([keys[i] for i in misses], [requests[i] for i in misses],
                                                self._read_backend, self._store_reads)
        counted: set[int] = set()  # one failed backend call counts once
        for i, outcome in zip(misses, outcomes, strict=True):
            if outcome.error is None:
                reads[i] = FastRead(outcome.scores, cached=outcome.shared)
                continue
            count = not outcome.shared and id(outcome.error) not in counted
            counted.add(id(outcome.error))
            reads[i] = FastRead(None, cached=False, failure=self.read_failed(outcome.error, count=count))
        self.metrics.reads_shared(sum(outcome.shared for outcome in outcomes))
        return reads

    async def _store_reads(self, reads: list[tuple[str, OptionScores]]) -> None:
        await self.cache.set_many([(key, encode_scores(scores)) for key, scores in reads])

    async def look_up(self, keys: Sequence[str]) -> list[bytes | None]:
        """The read cache's blobs for ``keys`` (None where absent), timed as the cache stage."""
        t0 = time.perf_counter()
        blobs = await self.cache.get_many(keys)
        self.metrics.stage("cache", time.perf_counter() - t0)
        return blobs

    def read_failed(self, exc: BackendError, *, count: bool = True) -> str:
        """A failed read, counted (``count``: not again for the decisions that shared it); the
        text leads the escalations' notes."""
        kind = type(exc).__name__
        if count:
            self.metrics.backend_error(kind)
        return f"fast backend failed ({kind}: {exc.message})"

    def _bounded_all(self, requests: Sequence[DecisionRequest]) -> list[DecisionRequest]:
        return [_bounded(r, self.settings.fast.max_input_chars) for r in requests]

    async def _read_backend(self, requests: list[DecisionRequest]) -> list[OptionScores]:
        return await self.read_upstream(requests, self.backend.read)

    async def read_upstream(
        self, requests: Sequence[DecisionRequest],
        read: Callable[[list[DecisionRequest]], Awaitable[list[_S]]],
    ) -> list[_S]:
        """``read`` (a backend call) of ``requests`` as every fast read is made: states cut to
        ``fast.max_input_chars``, under the concurrency cap and timeout, the answers checked
        against the options asked (None: a question the backend's server skipped). Raises
        ``BackendError``; ``read_failed`` counts it."""
        bounded = self._bounded_all(requests)
        scores = await self._timed_read(lambda: read(bounded))
        _check_options(scores, requests)
        return scores

    async def _timed_read(self, read: Callable[[], Awaitable[_T]]) -> _T:
        """One backend call under the concurrency cap; the wait queue is bounded (429 beyond it)
        and the timeout covers the read only, so queueing shows up as 429s, not as escalations."""
        timeout_s = self.settings.fast.timeout_s
        async with self._fast_limit.acquire():
            t0 = time.perf_counter()
            try:
                async with asyncio.timeout(timeout_s):
                    return await read()
            except TimeoutError as exc:
                raise BackendTimeout(f"the fast read took longer than {timeout_s} s") from exc
            finally:
                self.metrics.stage("fast", time.perf_counter() - t0)

    async def _route(
        self,
        request: DecisionRequest,
        read: FastRead,
        policy: RuntimePolicy | None,
        *,
        namespace: str,
        started: float,
        read_later: Callable[[], Awaitable[FastRead]],
    ) -> Decision:
        if policy is None:  # no loaded policy covers it: policy.unscoped, no policy touched
            return await route_unscoped(
                request, read, mode=self.registry.unscoped, shadow_all=self.registry.shadow_all,
                escalation=self.escalation, metrics=self.metrics, settings=self.settings,
                namespace=namespace, started=started, read_later=read_later)
        decision_id = uuid.uuid4().hex
        # Shadow mode (per policy file, or the server's policy.shadow): the slow model answers
        # every decision and is served; the fast read and the policy's verdict are still logged.
        shadow, guarantee = self.registry.mode(policy)
        if read.scores is None or (read.failure is not None and not shadow):
            # No read to route on (the backend failed, or its read cannot be trusted): only the
            # slow path can answer.
            answer, from_cache = await self.escalation.answer(request, namespace=namespace)
            self.metrics.decision(route="cache" if from_cache else "slow", escalated=True)
            return Decision(
                decision_id, request.question_id, answer, "cache" if from_cache else "slow",
                None, None, None, policy.policy_id, _ms(started),
                note=f"{read.failure}; answered by the slow path",
                escalated=True, shadow=shadow, guarantee=guarantee)
        scores = read.scores
        verdict, calibrated = policy.decide(scores)
        accepted = verdict.accept  # the policy's own verdict: what its watch takes
        gate = self.registry.gate(policy)
        if accepted and gate is not None:  # an alarm's action (on_alarm), beside the mode
            verdict = dataclasses.replace(verdict, accept=False, reason=gate)
        index = scores.top_index  # the fast answer is always the raw argmax
        answer, route, note = scores.options[index], "cache" if read.cached else "fast", None
        if shadow:
            note = (f"shadow mode: the slow model's answer is served; the fast read answered "
                    f"{answer!r} and the policy would have "
                    f"{'accepted' if verdict.accept else 'escalated'} it ({verdict.reason})")
        if not verdict.accept or shadow:
            try:
                answer, from_cache = await self.escalation.answer(request, namespace=namespace)
                route = "cache" if from_cache else "slow"
            except SlowPathError as exc:
                if not self.settings.slow.serve_unverified_on_failure:
                    raise
                route = "unverified"
                note = (f"{exc.message}; the fast answer is " + (
                    "in shadow mode" if shadow else f"below the threshold ({verdict.reason})")
                    + " and was not verified")
            index = scores.options.index(answer)
        escalated = not verdict.accept or shadow
        self.metrics.decision(route=route, escalated=escalated)
        if self.monitor is not None:  # the observer port: once per decision, never waits
            self.monitor.decided(Observation(
                request, decision_id, policy.policy_id, calibrated[scores.top_index], accepted,
                answer, served_fast=not escalated))
        return Decision(
            decision_id, request.question_id, answer, route,  # type: ignore[arg-type]
            calibrated[index], scores.proba[index], verdict.threshold, policy.policy_id,
            _ms(started), probabilities=dict(zip(scores.options, calibrated)), note=note,
            escalated=route in ("slow", "cache") and escalated, shadow=shadow,
            guarantee=guarantee)


async def _all_or_none(coros: list[Coroutine[Any, Any, Decision]]) -> list[Decision]:
    """Every result, or the first error with the other questions cancelled: a request that
    fails as a whole must not leave escalations running behind it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _check_options(scores: Sequence[OptionScores | None],
                   requests: Sequence[DecisionRequest]) -> None:
    if len(scores) != len(requests) or any(
        s is not None and s.options != r.option_names for s, r in zip(scores, requests)
    ):
        raise BackendMalformed("the fast backend answered other options than were asked")


def _bounded(request: DecisionRequest, max_chars: int) -> DecisionRequest:
    """The request as the fast tier reads it: the head of the state, at most ``max_chars``. A
    read of a 900 KB message outlives its timeout and, in a thread, keeps running after it."""
    if len(request.state) <= max_chars:
        return request
    return dataclasses.replace(request, state=request.state[:max_chars])


def encode_scores(scores: OptionScores) -> bytes:
    """A read as the read cache keeps it."""
    return orjson.dumps({"options": scores.options, "proba": scores.proba})


def decode_scores(blob: bytes | None, request: DecisionRequest) -> OptionScores | None:
    """A cached read, or None when absent or unusable (then it is read again, never trusted)."""
    if blob is None:
        return None
    try:
        payload = orjson.loads(blob)
        scores = OptionScores(tuple(payload["options"]), tuple(payload["proba"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return scores if scores.options == request.option_names else None


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _record(
    request: DecisionRequest, read: FastRead, decision: Decision, namespace: str, fingerprint: str
) -> DecisionRecord:
    return DecisionRecord.trusted(
        **decision.facts(),
        time=time.time(),
        namespace=namespace,
        signature=request.signature(),
        fingerprint=fingerprint,
        options=list(request.option_names),
        # A read not routed on (failure set, outside shadow mode): no row to tune from.
        proba=list(read.scores.proba) if read.scores is not None and (
            read.failure is None or decision.shadow) else None,
        text=request.state,
    )
