"""The fast tiers a routing service reads (``FastTier``, in the configured order) and each
decision's way up its policy's tiers (``climb``, giving a ``Climb`` that ``plan`` routes on;
docs/cascade.md). A one-tier policy's climb is its first tier's step; a cascade's goes on to
the next tier read while each turns the read down."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from policies.policy import Policy, Step
from policies.rules import EscalationWindow
from policies.types import DecisionRequest, TierRead, Verdict
from router.backends.base import FastBackend
from router.routing.backpressure import ConcurrencyLimit
from router.routing.plan import judged_scores
from router.routing.ports import NOT_READ, FastRead
from router.settings import FastBackendSettings


@dataclass(frozen=True, slots=True)
class FastTier:
    """A fast backend the service reads, under its own concurrency cap, timeout and input cut
    (``settings``)."""

    name: str
    backend: FastBackend
    limit: ConcurrencyLimit
    settings: FastBackendSettings


@dataclass(slots=True)
class Climb:
    """One decision's way up its policy's tiers: the steps of the tiers that read it (index,
    read, step) and the last read, which the plan routes on (no step when that read failed:
    the decision escalates)."""

    policy: Policy
    shadow: bool
    read: FastRead = field(default_factory=lambda: NOT_READ)
    step: Step | None = None
    steps: list[tuple[int, FastRead, Step]] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict | None:
        return None if self.step is None else self.step.verdict

    @property
    def calibrated(self) -> list[float] | None:
        return None if self.step is None else self.step.calibrated

    def evidence(self) -> tuple[TierRead, ...] | None:
        """Every tier's read as replies and logs show it; None for a one-tier policy (its
        verdict is the decision's own)."""
        tiers = self.policy.tiers_
        if len(tiers) == 1:
            return None
        out = []
        for k, read, step in self.steps:
            assert read.scores is not None  # judged
            verdict = step.verdict
            out.append(TierRead(tiers[k].name, read.scores.options[verdict.index],
                                verdict.probability, verdict.threshold, verdict.accept,
                                read.cached))
        return tuple(out)

    def tier_reads(self) -> dict[str, list[float]] | None:
        """Each tier's raw read (its name -> the read's probabilities) for the decision log,
        so a cascade's decisions can be judged again; None for a one-tier policy."""
        tiers = self.policy.tiers_
        if len(tiers) == 1:
            return None
        return {tiers[k].name: list(read.scores.proba)
                for k, read, _ in self.steps if read.scores is not None}

    @property
    def tier(self) -> str | None:
        """The cascade tier whose verdict the plan acts on (the last read); None for a one-tier
        policy and when none judged."""
        tiers = self.policy.tiers_
        return tiers[self.steps[-1][0]].name if self.steps and len(tiers) > 1 else None


async def climb(
    requests: Sequence[DecisionRequest], reads: Sequence[FastRead],
    policies: Sequence[Policy | None], *, tiers: Mapping[str, FastTier],
    shadow: Callable[[Policy], bool],
    window: Callable[[Policy], EscalationWindow | None],
    read: Callable[[list[DecisionRequest], FastTier], Awaitable[list[FastRead]]],
    judged: Callable[..., None],
) -> list[Climb | None]:
    """The way up each decision's policy (None for an unscoped decision): a tier steps on its
    read; a decision it turns down is read by the policy's next tier, each tier once
    (``read``) for all the decisions waiting on it, in the order of ``tiers`` (which the
    registry checked every policy follows). ``reads``: the first tier's, already made;
    ``shadow``: the policy's mode (a shadowed read is judged even when it may not be routed
    on); ``window``: the policy's escalation window (its first tier's budget, state the caller
    owns); ``judged(tier, accepted=...)``: told of each cascade tier's verdict. A failed read
    stops the climb: the decision escalates."""
    climbs: list[Climb | None] = [None] * len(requests)
    waiting: dict[str, list[int]] = {}

    def judge(i: int, k: int, tier_read: FastRead) -> None:
        way = climbs[i]
        assert way is not None
        way.read = tier_read
        scores = judged_scores(tier_read, shadow=way.shadow)
        if scores is None:
            way.step = None
            return
        budget = window(way.policy) if k == 0 else None
        way.step = step = way.policy.step(
            k, scores, escalations=0 if budget is None else budget.escalations)
        if budget is not None:
            budget.record(step.verdict)
        way.steps.append((k, tier_read, step))
        if len(way.policy.tiers_) > 1:
            judged(way.policy.tiers_[k].name, accepted=step.verdict.accept)
        if step.climb is not None:
            waiting.setdefault(way.policy.tiers_[step.climb].name, []).append(i)

    for i, policy in enumerate(policies):
        if policy is None:
            continue
        climbs[i] = Climb(policy, shadow=shadow(policy))
        if policy.reads_first_tier:  # a policy reading no tier: the first judges (escalates)
            judge(i, 0, reads[i])
        else:
            first = policy.next_tier(-1)
            assert first is not None
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
