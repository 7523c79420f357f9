"""The fast tiers a routing service reads (``FastTier``: the first, ``fast``, and a cascade's
later ``tiers``) and each decision's way up a cascade policy's tiers (``climb``, giving a
``Climb`` that ``plan`` routes on; docs/cascade.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.cascade import CascadePolicy
from policies.types import DecisionRequest, TierRead, Verdict
from router.backends.base import FastBackend
from router.routing.backpressure import ConcurrencyLimit
from router.routing.plan import judged_scores
from router.routing.ports import NOT_READ, FastRead
from router.settings import FastBackendSettings


@dataclass(frozen=True, slots=True)
class FastTier:
    """A fast backend the service reads, under its own concurrency cap, timeout and input cut
    (``settings``): the first (``fast``) or a later tier of a cascade (``tiers``)."""

    name: str
    backend: FastBackend
    limit: ConcurrencyLimit
    settings: FastBackendSettings


@dataclass(slots=True)
class Climb:
    """One decision's way up a cascade policy's tiers (``climb``): the tiers
    that read it (index, read, verdict, calibrated probabilities) and the last read, which the
    plan routes on (its verdict None when the read failed: the decision escalates)."""

    policy: CascadePolicy
    shadow: bool
    read: FastRead = field(default_factory=lambda: NOT_READ)
    verdict: Verdict | None = None
    calibrated: list[float] | None = None
    steps: list[tuple[int, FastRead, Verdict]] = field(default_factory=list)

    def evidence(self) -> tuple[TierRead, ...]:
        tiers = self.policy.tiers_
        out = []
        for k, read, verdict in self.steps:
            assert read.scores is not None  # judged
            out.append(TierRead(tiers[k].name, read.scores.options[verdict.index],
                                verdict.probability, verdict.threshold, verdict.accept,
                                read.cached))
        return tuple(out)

    @property
    def tier(self) -> str | None:
        """The tier whose verdict the plan acts on (the last read); None when none judged."""
        return self.policy.tiers_[self.steps[-1][0]].name if self.steps else None


async def climb(
    requests: Sequence[DecisionRequest], reads: Sequence[FastRead], policies: Sequence[Any],
    *, tiers: Mapping[str, FastTier], shadow: Callable[[CascadePolicy], bool],
    read: Callable[[list[DecisionRequest], FastTier], Awaitable[list[FastRead]]],
    judged: Callable[..., None],
) -> list[Climb | None]:
    """The way up each cascade policy's tiers (None for a decision of any other policy): a
    tier judges its read with its calibrator and threshold; a decision it turns down is read by
    the policy's next tier read, each tier once (``read``) for all the decisions waiting on it,
    in the order of ``tiers`` (which the registry checked every cascade follows). ``reads``:
    the first tier's, already made; ``shadow``: the policy's mode (a shadowed read is judged
    even when it may not be routed on); ``judged(tier, accepted=...)``: told of each verdict. A
    failed read stops the climb: the decision escalates, as a one-tier decision's does."""
    climbs: list[Climb | None] = [None] * len(requests)
    waiting: dict[str, list[int]] = {}

    def judge(i: int, k: int, tier_read: FastRead) -> None:
        way = climbs[i]
        assert way is not None
        way.read = tier_read
        scores = judged_scores(tier_read, shadow=way.shadow)
        if scores is None:
            way.verdict = way.calibrated = None
            return
        way.verdict, way.calibrated = way.policy.decide_tier(k, scores)
        way.steps.append((k, tier_read, way.verdict))
        judged(way.policy.tiers_[k].name, accepted=way.verdict.accept)
        following = None if way.verdict.accept else way.policy.next_tier(k)
        if following is not None:
            waiting.setdefault(way.policy.tiers_[following].name, []).append(i)

    for i, policy in enumerate(policies):
        if isinstance(policy, CascadePolicy):
            climbs[i] = Climb(policy, shadow=shadow(policy))
            first = policy.next_tier(-1)
            if first in (0, None):  # None: no tier passed; the first judges (escalates)
                judge(i, 0, reads[i])
            else:
                waiting.setdefault(policy.tiers_[first].name, []).append(i)
    for name, tier in tiers.items():
        indices = waiting.pop(name, [])
        if not indices:
            continue
        for i, tier_read in zip(indices, await read([requests[i] for i in indices], tier),
                                strict=True):
            way = climbs[i]
            assert way is not None
            judge(i, way.policy.tier_index(name), tier_read)
    return climbs
