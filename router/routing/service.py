"""The routing service: read -> plan -> execute -> log. Each decision is read (cache, fast
backend), judged by its policy (pure; the budget windows are state owned here), planned by
``router.routing.plan.plan`` (the one place shadow mode, an alarm's gate, ``policy.unscoped``,
``slow.serve_unverified_on_failure`` and a caller's spent escalation budget act; the budgets'
counts are looked up and charged here), executed (escalation) and logged. It speaks
DecisionRequest/Decision only (no HTTP types), so every wire surface shares one behaviour.

Failure semantics: a fast backend that fails or passes ``fast.timeout_s`` escalates (counted);
an escalation with no usable slow path raises a ``SlowPathError`` (``NoSlowModel`` when none is
configured: 503, its message says escalation is unavailable) unless
``slow.serve_unverified_on_failure``, which returns the fast answer with route ``unverified`` and
a note. A full fast-backend or slow-model queue raises ``TooManyRequests``; a decision refused
for its caller's spent budget, ``BudgetSpent``.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from policies.policy import Policy
from policies.rules import EscalationWindow
from policies.scope import describe
from policies.types import Decision, DecisionRequest, OptionScores, Route
from router.backends.base import FastBackend
from router.errors import (
    BudgetSpent,
    SlowPathError,
)
from router.routing.backpressure import ConcurrencyLimit
from router.routing.escalation import Escalation, explained
from router.routing.near_miss import count_near_misses
from router.routing.plan import (
    UNSCOPED_POLICY_ID,
    Mode,
    Plan,
    Scope,
    Spent,
    calls_slow_model,
    judged_scores,
    plan,
    reads_first_tier,
    receipt,
)
from router.routing.ports import (
    DecisionObserver,
    DecisionSink,
    FastRead,
    Observation,
    ReadCache,
    SlowModel,
)
from router.routing.reads import FastReads
from router.routing.registry import PolicyRegistry
from router.routing.tiers import Climb, FastTier, climb
from router.routing.tracing import NO_TRACING, DecisionTracing
from router.settings import Settings
from router.store.budgets import KeyBudgets
from router.store.metrics import Metrics
from router.store.records import DecisionRecord

_S = TypeVar("_S", bound=OptionScores | None)


class RoutingService:
    """Decisions through cache, fast read, policy and escalation. The parts come in through the
    seams of ``router.routing.ports``; the slow model brings its own concurrency cap."""

    def __init__(
        self,
        *,
        backend: FastBackend,
        tiers: Mapping[str, FastBackend] | None = None,
        cache: ReadCache,
        registry: PolicyRegistry,
        slow: SlowModel | None,
        log: DecisionSink,
        metrics: Metrics,
        settings: Settings,
        monitor: DecisionObserver | None = None,
        tracing: DecisionTracing = NO_TRACING,
        budgets: KeyBudgets | None = None,
        cheaper: SlowModel | None = None,
    ) -> None:
        self.backend = backend
        self.tracing = tracing  # a span per decision (router/routing/tracing.py); off: NO_TRACING
        self.monitor = monitor  # production monitoring: told of every decision with a fast read
        self.cache = cache
        self.registry = registry
        self.slow = slow
        self.log = log
        self.metrics = metrics
        self.settings = settings
        first = FastTier(settings.fast.name, backend, ConcurrencyLimit(
            f"fast backend ({backend.name})", capacity=settings.fast.max_concurrency,
            max_waiting=settings.max_queue, on_reject=lambda: metrics.queue_rejected(backend.name)),
            settings.fast)
        # Every fast tier by name, in the order a cascade reads them: ``fast``, then ``tiers``.
        self.tiers: dict[str, FastTier] = {first.name: first}
        configured = {t.name: t for t in settings.tiers}
        for name, later in (tiers or {}).items():
            if name not in configured:
                raise ValueError(f"tier {name!r} has a backend but no settings (tiers[].name)")
            self.tiers[name] = FastTier(name, later, ConcurrencyLimit(
                f"fast tier {name} ({later.name})", capacity=configured[name].max_concurrency,
                max_waiting=settings.max_queue,
                on_reject=functools.partial(metrics.queue_rejected, later.name)),
                configured[name])
        self._first = first
        self.escalation = Escalation(slow=slow, cache=cache, metrics=metrics, settings=settings)
        # Per-key escalation budgets (``budget``; None: off) and the model that answers once a
        # key's is spent under ``budget.on_spent: cheaper_model``.
        self.budgets = budgets
        self.cheaper = None if settings.budget.on_spent != "cheaper_model" else Escalation(
            slow=cheaper, cache=cache, metrics=metrics, settings=settings.model_copy(update={
                "slow": settings.slow.model_copy(update={"model": settings.budget.cheaper_model})}))
        self.reads = FastReads(first, cache=cache, metrics=metrics)
        # The budget windows of the policies that have one: state of running a policy, kept
        # here so that a policy's ``decide`` stays pure.
        self._windows: weakref.WeakKeyDictionary[Policy, EscalationWindow | None] = (
            weakref.WeakKeyDictionary())
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def escalation_available(self) -> bool:
        return self.escalation.available

    async def route(
        self, requests: Sequence[DecisionRequest], *, namespace: str,
        reads: Sequence[FastRead] | None = None,
        policies: Sequence[Policy | None] | None = None,
    ) -> list[Decision]:
        """One Decision per request, in order; every one is in the decision log when this returns.
        ``reads``: the requests' fast reads, already made (a staged read); else they are read.
        ``policies``: what ``lookup`` gave each request, when the caller looked them up (a
        staged body, once for all its stages); else they are looked up here."""
        self._in_flight += 1
        self._idle.clear()
        started = time.perf_counter()
        try:
            fingerprint = self.backend.fingerprint
            if policies is None:
                policies = self.lookup(requests)
            elif len(policies) != len(requests):
                raise ValueError(f"{len(policies)} policies given for {len(requests)} requests")
            # A state the first tier cannot see (images) is unscoped and read by none.
            blind = [self._blind(r) for r in requests]
            policies = [None if why else p for why, p in zip(blind, policies, strict=True)]
            if reads is None:
                reads = await self._fast_reads(
                    requests, namespace=namespace, fingerprint=fingerprint,
                    needed=[self.reads_fast(p) and not why for why, p in zip(blind, policies)])
            elif len(reads) != len(requests):
                raise ValueError(f"{len(reads)} reads given for {len(requests)} requests")
            # A read made late (``read_later``) is logged in its place.
            reads = [FastRead(None, cached=False, failure=why) if why else read
                     for why, read in zip(blind, reads, strict=True)]
            climbs = await climb(
                requests, reads, policies, tiers=self.tiers,
                shadow=lambda policy: self.registry.mode(policy)[0], window=self._window,
                read=lambda wanted, tier: self._fast_reads(
                    wanted, namespace=namespace, fingerprint=tier.backend.fingerprint,
                    tier=tier),
                judged=self.metrics.tier_read)

            def read_later(i: int) -> Callable[[], Awaitable[FastRead]]:
                async def read() -> FastRead:
                    [reads[i]] = await self._fast_reads([requests[i]], namespace=namespace,
                                                        fingerprint=fingerprint)
                    return reads[i]
                return read

            decisions = await _all_or_none([
                self._route(request, read, policy, namespace=namespace, started=started,
                            read_later=read_later(i), climb=way)
                for i, (request, read, policy, way) in enumerate(zip(
                    requests, reads, policies, climbs, strict=True))
            ])
            await asyncio.gather(*(
                self.log.append(_record(request, read, decision, namespace, fingerprint, way))
                for request, read, decision, way in zip(requests, reads, decisions, climbs,
                                                        strict=True)
            ))
            self.metrics.stage("total", time.perf_counter() - started)
            # An unscoped decision one field away from a tuned question, counted (every surface).
            count_near_misses(requests, decisions, registry=self.registry, metrics=self.metrics)
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

    def _blind(self, request: DecisionRequest) -> str | None:
        """Why the first tier cannot read ``request`` (None: it can)."""
        if request.images and not self.backend.reads_images:
            return (f"the fast tier ({self.backend.name}) reads no images, so the slow model "
                    "answers")
        return None

    def lookup(self, requests: Sequence[DecisionRequest]) -> list[Policy | None]:
        """The policy of each request (``PolicyRegistry.lookup``; None: unscoped). Done before
        any read: an unknown policy name is the caller's error (``InvalidRequest``)."""
        fingerprint = self.backend.fingerprint
        return [self.registry.lookup(r, fingerprint=fingerprint) for r in requests]

    def reads_fast(self, policy: Policy | None) -> bool:
        """Whether routing a decision that ``registry.lookup`` gave ``policy`` uses the first
        tier's read (``plan.reads_first_tier``, the read plan)."""
        registry = self.registry
        return reads_first_tier(policy, Mode(
            shadow=registry.shadow_all, unscoped=registry.unscoped,
            serve_unverified_on_failure=self.settings.slow.serve_unverified_on_failure))

    async def _fast_reads(
        self, requests: Sequence[DecisionRequest], *, namespace: str, fingerprint: str,
        needed: Sequence[bool] | None = None, tier: FastTier | None = None,
    ) -> list[FastRead]:
        return await self.reads.read(requests, namespace=namespace, fingerprint=fingerprint,
                                     needed=needed, tier=tier)

    async def read_through_cache(
        self, requests: Sequence[DecisionRequest], keys: Sequence[str],
        read: Callable[[list[DecisionRequest]], Awaitable[Sequence[OptionScores | None]]],
    ) -> list[FastRead]:
        """``FastReads.read_through_cache`` with the first tier (a staged body's joint read)."""
        return await self.reads.read_through_cache(requests, keys, read)

    async def read_upstream(
        self, requests: Sequence[DecisionRequest],
        read: Callable[[list[DecisionRequest]], Awaitable[Sequence[_S]]],
    ) -> list[_S]:
        """``FastReads.read_upstream`` with the first tier."""
        return await self.reads.read_upstream(requests, read)

    async def _route(
        self,
        request: DecisionRequest,
        read: FastRead,
        policy: Policy | None,
        *,
        namespace: str,
        started: float,
        read_later: Callable[[], Awaitable[FastRead]],
        climb: Climb | None = None,
    ) -> Decision:
        """One decision, in its span when tracing is on."""
        if not self.tracing.enabled:
            return await self._decide(request, read, policy, namespace=namespace,
                                      started=started, read_later=read_later, climb=climb)
        with self.tracing.decision(started) as span:
            decision = await self._decide(request, read, policy, namespace=namespace,
                                          started=started, read_later=read_later, climb=climb)
            self.tracing.describe(span, request, read if climb is None else climb.read,
                                  decision, namespace=namespace)
            return decision

    async def _decide(
        self,
        request: DecisionRequest,
        read: FastRead,
        policy: Policy | None,
        *,
        namespace: str,
        started: float,
        read_later: Callable[[], Awaitable[FastRead]],
        climb: Climb | None = None,
    ) -> Decision:
        """One decision: its climb's last step (the policy's verdict on the last read), the
        plan, its execution."""
        registry = self.registry
        shadow = registry.shadow_all if policy is None else registry.mode(policy)[0]
        if climb is not None:
            read = climb.read
        facts = (read, None if climb is None else climb.verdict,
                 Mode(shadow=shadow, unscoped=registry.unscoped,
                      serve_unverified_on_failure=self.settings.slow.serve_unverified_on_failure,
                      fallback_threshold=registry.fallback_threshold),
                 None if policy is None else registry.gate(policy),
                 Scope(covered=policy is not None,
                       question="" if policy is not None else describe(request)),
                 None if climb is None else climb.calibrated)
        cost_alarm = None if policy is None else registry.cost_alarm(policy)
        the_plan = plan(*facts, cost_alarm=cost_alarm)
        if self.budgets is not None and calls_slow_model(the_plan):
            budget = await self.budgets.state(namespace)
            if budget.spent:  # the same facts, with the caller's budget spent
                on_spent = self.settings.budget.on_spent
                the_plan = plan(*facts, cost_alarm=cost_alarm, spent=Spent(
                    on_spent=on_spent, limit=budget.limit,
                    window_s=self.settings.budget.window_s, reset_s=budget.reset_s))
                self.metrics.budget_spent(namespace, on_spent)
        decision = await self._execute(
            request, read, the_plan, namespace=namespace, started=started,
            read_later=read_later, policy=policy, climb=climb)
        calibrated = the_plan.calibrated
        if self.monitor is not None and policy is not None and calibrated is not None:
            # The observer port: once per decision a policy judged, never waits.
            assert read.scores is not None
            self.monitor.decided(Observation(
                request, decision.decision_id, decision.policy_id,
                calibrated[read.scores.top_index], the_plan.accepted, decision.answer,
                served_fast=the_plan.action == "fast", caller=namespace))
        return decision

    def _window(self, policy: Policy) -> EscalationWindow | None:
        """The escalation window of a budgeted policy, owned here (one per loaded policy
        object: a reloaded policy starts a fresh one)."""
        try:
            return self._windows[policy]
        except KeyError:
            window = self._windows[policy] = policy.escalation_window()
            return window

    async def _execute(
        self, request: DecisionRequest, read: FastRead, the_plan: Plan, *, namespace: str,
        started: float, read_later: Callable[[], Awaitable[FastRead]], policy: Policy | None,
        climb: Climb | None = None,
    ) -> Decision:
        """Carry out ``the_plan``: serve the fast answer, or ask the slow path and, when it
        fails, refuse or serve the fast answer unverified, as planned; then the decision and
        its receipt."""
        escalates = the_plan.action in ("escalate", "shadow")
        answer, route, note, scores = await self._answer(
            request, read, the_plan, namespace=namespace, read_later=read_later)
        self.metrics.decision(route=route, escalated=escalates)
        verdict, calibrated = the_plan.verdict, the_plan.calibrated
        raw = calibrated_p = probabilities = None
        if scores is not None and answer in scores.options:
            index = scores.options.index(answer)
            raw = scores.proba[index]
            if calibrated is not None:
                calibrated_p = calibrated[index]
                probabilities = dict(zip(scores.options, calibrated, strict=True))
        tier = climb.tier if climb is not None and the_plan.action == "fast" else None
        promised = receipt(
            the_plan, route, None if policy is None else self.registry.promise(policy),
            tier=tier, watch=None if policy is None else self.registry.watch_state(policy))
        return Decision(
            decision_id=uuid.uuid4().hex, question_id=request.question_id, answer=answer,
            route=route, probability=calibrated_p, raw_probability=raw,
            threshold=None if verdict is None else verdict.threshold,
            policy_id=UNSCOPED_POLICY_ID if policy is None else policy.policy_id,
            latency_ms=_ms(started), probabilities=probabilities, note=note,
            escalated=escalates and route in ("slow", "cache"),
            shadow=the_plan.action == "shadow", guarantee=promised.guarantee, tier=tier,
            tiers=None if climb is None else climb.evidence(), receipt=promised,
            thought=None if scores is None else scores.raw.get("server_thought"))

    async def _escalate(self, request: DecisionRequest, the_plan: Plan, *,
                        namespace: str) -> tuple[str, bool]:
        """The slow answer (``Escalation.answer``), from ``budget.cheaper_model`` when the plan
        says so; a slow call of the caller's own is charged to its budget (the cheaper model's,
        once the budget is spent, and answers shared or cached are not)."""
        escalation = (self.cheaper if the_plan.cheaper and self.cheaper is not None
                      else self.escalation)
        answer, from_cache = await escalation.answer(request, namespace=namespace)
        if self.budgets is not None and not from_cache and escalation is self.escalation:
            cost = self.settings.budget.call_cost
            await self.budgets.charge(namespace, cost)
            self.metrics.budget_charged(namespace, cost)
        return answer, from_cache

    async def _answer(
        self, request: DecisionRequest, read: FastRead, the_plan: Plan, *, namespace: str,
        read_later: Callable[[], Awaitable[FastRead]],
    ) -> tuple[str, Route, str | None, OptionScores | None]:
        """The answer served, its route, the note and the scores it came from (None: none)."""
        action, note = the_plan.action, the_plan.note
        if action == "unverified" and read.skipped:  # the caller's budget is spent: read now
            read = await read_later()
        scores = judged_scores(read, shadow=action == "shadow")
        _refuse_if_over_budget(the_plan, read, scores)
        if action not in ("escalate", "shadow"):
            assert scores is not None  # planned only on a read
            route: Route = ("unverified" if action == "unverified"
                            else "cache" if read.cached else "fast")
            return scores.options[scores.top_index], route, note, scores
        try:
            answer, from_cache = await self._escalate(request, the_plan, namespace=namespace)
            return answer, "cache" if from_cache else "slow", note, scores
        except SlowPathError as exc:
            late_failure = None
            if the_plan.fallback == "unverified":
                if read.skipped:  # the fallback the configuration asks for needs it now
                    read = await read_later()
                    late_failure = read.failure
                scores = judged_scores(read, shadow=action == "shadow")
            if the_plan.fallback == "refuse" or scores is None:
                self.metrics.decision(route="failed", escalated=True)
                raise explained(exc, the_plan.error_note, late_failure) from exc
            return (scores.options[scores.top_index], "unverified",
                    f"{exc.message}; {the_plan.fallback_note}", scores)


def _refuse_if_over_budget(the_plan: Plan, read: FastRead, scores: OptionScores | None) -> None:
    """A decision refused for its caller's spent budget: planned so, or planned unverified
    with a read made late that failed."""
    if the_plan.action == "refuse":
        raise BudgetSpent(the_plan.error_note or "escalation budget spent",
                          retry_after_s=the_plan.retry_after_s or 1.0)
    if the_plan.action == "unverified" and scores is None:
        raise BudgetSpent(f"{the_plan.error_note}; no fast answer to serve instead "
                          f"({read.failure})", retry_after_s=the_plan.retry_after_s or 1.0)


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


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _record(
    request: DecisionRequest, read: FastRead, decision: Decision, namespace: str,
    fingerprint: str, climb: Climb | None,
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
        tier_proba=None if climb is None else climb.tier_reads(),
    )
