"""A promise on cost in the worst case an operator budgets for: the slow model answers more
than a share ``share`` of the decisions in a block of ``block`` consecutive ones with
probability at most ``delta`` (``BlockCostPromise``: checked when a policy is tuned), and the
live test that the escalation probability has not risen past what the promise allows
(``SlowShareTest``, by betting).

Assumption: the rows a policy was tuned on and the decisions it serves are exchangeable (i.i.d.
given the traffic's mix, by de Finetti). Given the tuned rule, the escalations of a fixed block
are then Binomial(block, q), q the rule's escalation probability; q is bounded from the
threshold rows (docs/calibration.md, "A promise on cost")."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import brentq
from scipy.stats import beta, binom

from calibration.betting import JumperBet
from calibration.validation import check_fraction

__all__ = ["BlockCostPromise", "CostBound", "SlowShareTest"]

# Stakes of the live test, as fractions of the largest bet that keeps the wealth >= 0 (1 / cap).
SLOW_SHARE_FRACTIONS = (0.0, 0.025, 0.05, 0.1, 0.2, 0.4)


@dataclass(frozen=True, slots=True, kw_only=True)
class CostBound:
    """The cost promise at a tuned rule: on ``n`` threshold rows it escalated ``n_escalated``;
    ``escalation_upper`` bounds its escalation probability at level ``level``;
    ``block_bound`` = level + P(Binomial(block, escalation_upper) > allowed) bounds the chance
    that a block's slow share exceeds the promised share; ``kept``: ``block_bound`` <= delta."""

    n: int
    n_escalated: int
    escalation_upper: float
    block_bound: float
    kept: bool

    @property
    def escalation_rate(self) -> float:
        return self.n_escalated / self.n


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCostPromise:
    """P(the slow model answers more than ``share`` of a block of ``block`` consecutive
    decisions) <= ``delta``; blocks are fixed (decisions 1..block, block+1..2 block, ...).
    Half of ``delta`` (``level``) bounds the escalation probability from the threshold rows,
    the other half the block's binomial tail at that bound."""

    share: float
    block: int
    delta: float

    def __post_init__(self) -> None:
        check_fraction(self.share, name="cost_share")
        check_fraction(self.delta, name="cost_delta", low_open=True, high_open=True)
        if self.block < 1:
            raise ValueError(f"cost_block must be >= 1, got {self.block!r}")

    @property
    def level(self) -> float:
        return self.delta / 2.0

    @property
    def allowed(self) -> int:
        """The most escalations a block may hold (rounding guards B * N = 150.0000001)."""
        return math.floor(self.share * self.block + 1e-9)

    def block_tail(self, p: float) -> float:
        """P(Binomial(block, p) > allowed): a block breaks the share when escalating at ``p``."""
        return float(binom.sf(self.allowed, self.block, p))

    def max_escalation(self, tail: float) -> float:
        """The largest escalation probability whose block tail is at most ``tail`` (1.0 when
        even escalating everything keeps it)."""
        if self.block_tail(1.0) <= tail:
            return 1.0
        if self.block_tail(0.0) > tail:
            return 0.0
        return float(brentq(lambda p: self.block_tail(p) - tail, 0.0, 1.0, xtol=1e-12))

    @property
    def live_cap(self) -> float:
        """The escalation probability past which the promise fails for a known probability
        (block tail = delta): what the live test guards."""
        return self.max_escalation(self.delta)

    def bound(self, n_escalated: int, n: int, *, n_tiers: int = 1) -> CostBound:
        """The promise at a rule that escalated ``n_escalated`` of ``n`` threshold rows.

        One tier (a threshold on one confidence): with ``k`` escalations the rule's threshold
        is at most the (k+1)-th smallest confidence, whose escalation probability is at most
        a Beta(k+1, n-k) draw: the Clopper-Pearson upper limit, valid for the threshold the
        data chose: ``kept`` is monotone in ``k``, so it is ``k <= most_escalations(n)``, a
        bound at one order statistic fixed before the data are seen. Several tiers (a lower orthant of the confidences, chosen from many): the
        multivariate Dvoretzky-Kiefer-Wolfowitz margin of ``calibration.cascade``."""
        if not 0 <= n_escalated <= n or n < 1:
            raise ValueError(f"n_escalated must be in [0, n] with n >= 1, got {n_escalated} "
                             f"of {n}")
        upper = escalation_upper(n_escalated, n, level=self.level, n_tiers=n_tiers)
        block_bound = min(1.0, self.level + self.block_tail(upper))
        return CostBound(n=n, n_escalated=n_escalated, escalation_upper=upper,
                         block_bound=block_bound, kept=block_bound <= self.delta)

    def most_escalations(self, n: int) -> int:
        """The most escalations of ``n`` threshold rows a one-tier rule may have and keep the
        promise (-1: none keeps it). Fixed before the data are seen, so the order statistic
        it names carries the whole level: no union over thresholds is needed."""
        low, high = -1, n  # invariant: bound(low) kept (or low = -1), bound(high + 1) not
        while low < high:
            mid = (low + high + 1) // 2
            if self.bound(mid, n).kept:
                low = mid
            else:
                high = mid - 1
        return low


def escalation_upper(n_escalated: int, n: int, *, level: float, n_tiers: int = 1) -> float:
    """An upper bound, at ``level``, on the escalation probability of a rule that escalated
    ``n_escalated`` of ``n`` rows (``BlockCostPromise.bound`` says why each holds)."""
    if n_tiers == 1:
        if n_escalated >= n:
            return 1.0
        return float(beta.ppf(1.0 - level, n_escalated + 1, n - n_escalated))
    from calibration.cascade import slow_share_margin

    return min(1.0, n_escalated / n + slow_share_margin(n, n_tiers=n_tiers, delta=level))


class SlowShareTest(JumperBet):
    """A one-sided test by betting that the escalation probability is at most ``cap``, from
    every decision (1: the slow model answered it, 0: a fast tier did): each bets
    ``1 + lam (x - cap)``. While each decision's escalation probability given the past is at
    most ``cap`` every bet has conditional mean at most 1, so ``alarm`` (the wealth reached
    1 / ``alpha``) fires with probability at most ``alpha`` over the whole stream (Ville)."""

    def __init__(self, cap: float, *, alpha: float, jump: float = 0.01,
                 fractions: tuple[float, ...] = SLOW_SHARE_FRACTIONS) -> None:
        check_fraction(cap, name="cap", low_open=True)
        check_fraction(alpha, name="alpha", low_open=True, high_open=True)
        super().__init__(tuple(f / cap for f in fractions), alpha=alpha, jump=jump,
                         edges=(-cap, 1.0 - cap))
        self.cap = cap

    def update(self, escalated: bool) -> bool:
        """Take one decision; True when the alarm is (already or newly) raised."""
        self._bet((1.0 if escalated else 0.0) - self.cap)
        return self.alarm
