"""The fast tiers a routing service reads (``FastTier``: the first, ``fast``, and a cascade's
later ``tiers``) and one decision's way up a cascade policy's tiers (``Climb``), which
``RoutingService._climb`` builds and ``plan`` routes on (docs/cascade.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.cascade import CascadePolicy
from policies.types import TierRead, Verdict
from router.backends.base import FastBackend
from router.routing.backpressure import ConcurrencyLimit
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
    """One decision's way up a cascade policy's tiers (``RoutingService._climb``): the tiers
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
