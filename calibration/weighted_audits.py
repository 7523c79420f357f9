"""Audits drawn where the risk is, and the accuracy test that weighs them back.

``AuditDesign`` gives each accepted decision a draw probability that depends on its calibrated
confidence ``c`` (risk ``q = 1 - c``): proportional to the spread of the 0/1 error ``e`` around
its prediction ``q`` in the decision's stratum of ``q``, ``sqrt(E[(e - q)^2])``, which is the
variance-optimal draw for the prediction-powered estimate below (Neyman allocation over strata
of ``q``). Before a stratum has labels that spread is a calibrated answer's, ``sqrt(q (1 - q))``;
its audits' labels (``learn``) then move it towards what they show, ``DESIGN_PRIOR_LABELS``
labels' worth of the calibrated spread kept as a prior: where a shift puts errors the model
does not expect, the spread grows and the draws follow it. Each draw probability depends only
on labels that came before it, so the estimate stays unbiased. The strata's shares come from
unlabelled traffic (every accepted decision is seen, labelled or not), so the average draw
probability over that traffic is the audit rate: the budget keeps its meaning as an expected
share. A ``floor`` (a share of the rate) keeps every decision drawable, which bounds what one
label can weigh when errors come where the model is sure.

``WeightedShortfallTest`` bets on every accepted decision, labelled or not, with the
prediction-powered (PPI) estimate of its error,
``Z = eta q + A (e - eta q) / pi`` (``A`` audited, ``e`` wrong, ``pi`` its draw probability):
``E[Z | past] = E[e | past]`` whatever the predictions are (the label corrects their bias;
``pi`` is set and ``A`` drawn before the label is known), and with ``eta = 1`` a calibrated ``q``
takes off the part of the label's variance the confidence explains (the prediction cuts it).
``eta = 0`` is the plain inverse-probability-weighted estimate. A drawn audit whose label never
came (dropped, capped by its key's share of the queue, failed) counts as a right answer: ``Z``
only gets smaller, so the test stays valid (conservative). The wealth is the simple jumper
(``JumperBet``) over stakes sized for breaks of one, two and four points at the design's
variance of ``Z``, each capped at the largest stake that keeps a bet non-negative; both come
from the design before the decision is seen, so each bet has conditional mean at most 1 while
accepted accuracy is at least the target, and Ville's inequality bounds the false alarm by
``alpha``.

No anytime-valid betting library fits here: ``confseq`` does not build on Python 3.11 and
``expectation`` needs 3.12 (``calibration.monitoring.AccuracySequence`` says why), and neither
bets on importance-weighted, prediction-corrected increments; the wealth process is
``calibration.betting.JumperBet``, the one the other monitors bet with.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

from calibration.betting import JumperBet
from calibration.state import DamagedState, count, numbers
from calibration.validation import check_fraction

__all__ = ["DESIGN_PRIOR_LABELS", "PI_MIN", "Q_CAP", "RISK_EDGES", "WEIGHTED_GAPS", "WEIGHTED_JUMP",
           "AuditDesign", "WeightedShortfallTest"]

# The calibrated spread of a stratum counts as this many labels against its audits' own
# (``AuditDesign.learn``). ``python -m bench.break_power`` measured 50 against 20 and 100: within
# a few labels of each other on the low-confidence break, 50 the best on the even one.
DESIGN_PRIOR_LABELS = 50.0
# Strata of the risk q = 1 - confidence: finer where sure answers crowd (most accepted
# answers are right with probability above 0.99).
RISK_EDGES = (0.0, 0.001, 0.003, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 1.0)
PI_MIN = 0.001  # no draw probability below this: one label weighs at most 1 / PI_MIN
# The prediction is the risk capped here. Any prediction keeps the estimate unbiased; the cap
# bounds how far below it one audited right answer can pull the estimate, and so
# how small the stakes must be (an accepted answer is rarely less sure than even).
Q_CAP = 0.5
# The jumper's share moved between stakes per decision, far below the per-label test's 0.01:
# most decisions carry no label, and a jump on each would bleed the best stake's lead.
WEIGHTED_JUMP = 0.0003
# The breaks (in accuracy) the stakes are sized for (``WeightedShortfallTest``): one, two and
# four points.
WEIGHTED_GAPS = (0.01, 0.02, 0.04)


class AuditDesign:
    """Draw probabilities by stratum of risk (``RISK_EDGES``), from the accepted confidences
    seen so far (``see``; ``reference``: the tuning rows the policy accepted, counted first)."""

    def __init__(self, reference: Sequence[float] = (), *, floor: float = 0.25) -> None:
        check_fraction(floor, name="floor")
        self.floor = floor
        k = len(RISK_EDGES) - 1
        self.counts = [0] * k
        self.sums = [0.0] * k  # of q, per stratum
        self.labelled = [0] * k  # audits' labels learnt, per stratum
        self.squares = [0.0] * k  # of (e - q)^2 over them
        self._cache: dict[float, list[float]] = {}
        for confidence in reference:
            self.see(confidence)

    @staticmethod
    def stratum(confidence: float) -> int:
        q = min(1.0, max(0.0, 1.0 - confidence))
        return min(len(RISK_EDGES) - 2, bisect.bisect_right(RISK_EDGES, q) - 1)

    def see(self, confidence: float) -> None:
        """Count one accepted decision (labelled or not) in its stratum."""
        b = self.stratum(confidence)
        self.counts[b] += 1
        self.sums[b] += min(1.0, max(0.0, 1.0 - confidence))
        self._cache.clear()

    def learn(self, confidence: float, *, wrong: bool) -> None:
        """One audit's label of an accepted decision drawn by this design: its stratum's spread
        moves towards what the labels show. Only audits drawn by the design's own probabilities
        belong here (within a stratum they are a uniform sample of it)."""
        b = self.stratum(confidence)
        q = min(1.0, max(0.0, 1.0 - confidence))
        self.labelled[b] += 1
        self.squares[b] += (float(wrong) - q) ** 2
        self._cache.clear()

    def spread(self, b: int) -> float:
        """Stratum ``b``'s spread of the error around its prediction: the calibrated
        ``q (1 - q)`` at its mean risk, weighted ``DESIGN_PRIOR_LABELS`` against its labels'
        mean of ``(e - q)^2``, square-rooted."""
        n = self.counts[b]
        q = self.sums[b] / n if n else _middle(b)
        prior = DESIGN_PRIOR_LABELS * q * (1.0 - q)
        return math.sqrt(max((prior + self.squares[b]) / (DESIGN_PRIOR_LABELS + self.labelled[b]),
                             1e-12))

    def probabilities(self, rate: float) -> list[float]:
        """Each stratum's draw probability at audit ``rate``: ``c`` times its ``spread``, at
        least ``floor * rate`` (and ``PI_MIN``), at most 1, with ``c`` set so the strata's
        shares average ``rate``. Uniform before any decision was seen."""
        check_fraction(rate, name="rate", low_open=True)
        cached = self._cache.get(rate)
        if cached is not None:
            return cached
        total = sum(self.counts)
        low = max(PI_MIN, self.floor * rate)
        if total == 0 or rate >= 1.0:
            probs = [rate] * len(self.counts)
        else:
            shares = [n / total for n in self.counts]
            probs = _water_fill(shares, [self.spread(b) for b in range(len(self.counts))],
                                rate=rate, low=low)
        self._cache[rate] = probs
        return probs

    def probability(self, confidence: float, rate: float) -> float:
        return self.probabilities(rate)[self.stratum(confidence)]

    def bound(self, rate: float, *, eta: float = 1.0) -> float:
        """Largest loss ``eta q (1/pi - 1)`` one decision's estimate can show below its
        prediction, over every stratum (its highest risk): with the allowed error it scales the
        stakes (``WeightedShortfallTest.update``)."""
        probs = self.probabilities(rate)
        return max(eta * min(Q_CAP, RISK_EDGES[b + 1]) * (1.0 / p - 1.0)
                   for b, p in enumerate(probs))

    def variance(self, rate: float, *, eta: float = 1.0, allowed: float = 0.05) -> float:
        """The variance of one decision's estimate ``Z`` at the edge of the promise (error
        ``allowed``) when each stratum's answers are wrong with their mean risk: the label's own
        ``allowed (1 - allowed)`` plus what sampling adds, ``E[(e - eta q)^2 (1/pi - 1)]``."""
        probs = self.probabilities(rate)
        total = sum(self.counts)
        added = 0.0
        for b, (n, p) in enumerate(zip(self.counts, probs, strict=True)):
            q = self.sums[b] / n if n else _middle(b)
            qc = eta * min(Q_CAP, q)
            added += (n / total if total else 1.0 / len(probs)) * (
                q * (1.0 - qc) ** 2 + (1.0 - q) * qc ** 2) * (1.0 / p - 1.0)
        return allowed * (1.0 - allowed) + added

    def scale(self, rate: float, *, eta: float = 1.0,
              allowed: float = 0.05) -> tuple[float, float]:
        """``(variance, bound)`` at ``rate``: what ``WeightedShortfallTest.update`` sizes its
        stakes by."""
        return self.variance(rate, eta=eta, allowed=allowed), self.bound(rate, eta=eta)

    def state(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sums": list(self.sums),
                "labelled": list(self.labelled), "squares": list(self.squares)}

    def resume(self, state: dict[str, Any]) -> None:
        """Take back ``state()``; a stratum whose risk sum lies outside what its count of
        risks in the stratum's range can add up to, or whose squares exceed its labels (each
        is at most 1), is refused (DamagedState naming it) and nothing is taken."""
        k = len(self.counts)
        counts = _whole(numbers(state, "counts", length=k, low=0.0), "counts")
        sums = numbers(state, "sums", length=k, low=0.0)
        labelled = _whole(numbers(state, "labelled", length=k, low=0.0), "labelled")
        squares = numbers(state, "squares", length=k, low=0.0)
        for b, (n, s) in enumerate(zip(counts, sums, strict=True)):
            low, high = RISK_EDGES[b] * n, RISK_EDGES[b + 1] * n
            if not low - 1e-6 * (1 + n) <= s <= high + 1e-6 * (1 + n):
                raise DamagedState(f"sums[{b}] must be in [{low:g}, {high:g}] for {n} "
                                   f"risks in [{RISK_EDGES[b]:g}, {RISK_EDGES[b + 1]:g}], got {s!r}")
            if squares[b] > labelled[b] + 1e-6 * (1 + labelled[b]):
                raise DamagedState(f"squares[{b}] must be at most labelled[{b}] "
                                   f"({labelled[b]}), got {squares[b]!r}")
        self.counts, self.sums = counts, list(sums)
        self.labelled, self.squares = labelled, list(squares)
        self._cache.clear()


def _middle(b: int) -> float:
    return (RISK_EDGES[b] + RISK_EDGES[b + 1]) / 2.0


def _whole(values: list[float], name: str) -> list[int]:
    for i, v in enumerate(values):
        if v != int(v):
            raise DamagedState(f"{name}[{i}] must be a whole number, got {v!r}")
    return [int(v) for v in values]


def _water_fill(shares: list[float], spread: list[float], *, rate: float,
                low: float) -> list[float]:
    """``clip(c * spread, low, 1)`` with ``c`` found by bisection so the shares average
    ``rate`` (the average rises with ``c`` from ``low`` to 1)."""
    if low >= rate:
        return [rate] * len(shares)

    def probs(c: float) -> list[float]:
        return [min(1.0, max(low, c * s)) for s in spread]

    lo, hi = 0.0, 1.0 / min(spread)
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if sum(w * p for w, p in zip(shares, probs(mid), strict=True)) < rate:
            lo = mid
        else:
            hi = mid
    return probs(hi)


class WeightedShortfallTest(JumperBet):
    """A one-sided betting test that accepted accuracy is at least ``target``, on every accepted
    decision with the prediction-powered estimate ``Z`` of its error (module docstring).

    Each decision bets ``1 + g (Z - (1 - target)) / V`` for each ``g`` in ``gaps``, mixed by the
    jumper: ``V`` is the design's variance of ``Z`` at the edge of the promise
    (``AuditDesign.variance``), so the stake ``g / V`` is the one that grows fastest against a
    break of ``g`` (Kelly's, to first order): three breaks stand in for a grid of stakes,
    whatever the audit rate. Each stake is capped at
    ``1 / bound`` (``AuditDesign.bound`` plus the allowed error), the largest that keeps a bet
    non-negative; ``V`` and the cap come from the design before the decision is seen."""

    def __init__(self, target: float, *, alpha: float, eta: float = 1.0,
                 jump: float = WEIGHTED_JUMP, gaps: tuple[float, ...] = WEIGHTED_GAPS) -> None:
        check_fraction(target, name="target", high_open=True)
        check_fraction(alpha, name="alpha", low_open=True, high_open=True)
        check_fraction(eta, name="eta")
        if not gaps or any(not 0.0 <= g <= 1.0 for g in gaps):
            raise ValueError(f"gaps must be in [0, 1], got {gaps!r}")
        self.allowed = 1.0 - target
        self.eta = eta
        self.gaps = tuple(gaps)
        floor = self.allowed * target  # V is at least the label's own variance at the edge
        super().__init__(tuple(gaps), alpha=alpha, jump=jump,
                         edges=(-(self.allowed + Q_CAP / PI_MIN) / floor,
                                (1.0 + 1.0 / PI_MIN) / floor))
        self.target = target
        self.labels = 0

    def state(self) -> dict[str, Any]:
        """The wealth (``JumperBet.state``) and the labels it has taken."""
        return {**super().state(), "labels": self.labels}

    def resume(self, state: dict[str, Any]) -> None:
        """Continue from ``state()``; a label count past the decisions bet on, or a wealth no
        run could reach, is refused (DamagedState naming the field) and nothing is taken."""
        n = count(state, "n")
        labels = count(state, "labels", high=n)
        super().resume(state)
        self.labels = labels

    def update(self, confidence: float, *, probability: float, audited: bool,
               correct: bool | None, scale: tuple[float, float]) -> bool:
        """One accepted decision: its confidence, its draw probability, whether it was drawn for
        an audit and the audit's verdict (None: drawn, no label came; counted as right), and the
        design's ``(variance, loss)`` before it was seen (``AuditDesign.scale``). True when the
        alarm is raised."""
        if not PI_MIN <= probability <= 1.0:
            raise ValueError(f"probability must be in [{PI_MIN}, 1], got {probability!r}")
        variance, loss = scale
        q = self.eta * min(Q_CAP, max(0.0, 1.0 - confidence))
        if q * (1.0 / probability - 1.0) > loss + 1e-12:
            raise ValueError(f"loss {loss!r} is below this decision's possible loss "
                             f"{q * (1.0 / probability - 1.0)!r}: the bet could go negative")
        if not variance >= self.allowed * self.target:
            raise ValueError(f"variance must be at least {self.allowed * self.target:g} (a "
                             f"label's own at the edge), got {variance!r}")
        z = q
        if audited:
            self.labels += 1
            z += ((0.0 if correct or correct is None else 1.0) - q) / probability
        self._bet((z - self.allowed) / variance, most=variance / (self.allowed + loss))
        return self.alarm
