"""The thresholds of a cascade of fast tiers, fit jointly: the accuracy of every accepted answer,
whichever tier gave it, is at least a target with probability 1 - delta, at the least expected
cost among the vectors that pass (docs/cascade.md has the proof sketch and the figures)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations, product
from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from calibration.risk import (
    GRID_STEP,
    STARTS,
    accuracy_lower_bound,
    fewest_tested_rows,
    fixed_sequence_walks,
    walk_candidates,
)
from calibration.validation import check_confidence, check_fraction

# Candidate thresholds of a tier that later tiers follow: the confidences at which it alone
# accepts 1/LEVELS, 2/LEVELS ... of the rows. The last tier read takes every distinct confidence.
LEVELS = 64


@dataclass(frozen=True)
class _Candidates:
    """Threshold vectors (NaN: the tier is not read) with what each does on the tuning rows."""

    thresholds: NDArray[np.float64]  # (m, n_tiers)
    n_accepted: NDArray[np.int64]
    n_correct: NDArray[np.int64]
    predicted: NDArray[np.float64]  # how accurate the accepted answers look, without the labels
    n_slow: NDArray[np.int64]
    cost: NDArray[np.float64]  # total over the rows

    @staticmethod
    def concat(parts: Sequence[_Candidates], n_tiers: int) -> _Candidates:
        if not parts:
            empty_i = np.zeros(0, dtype=np.int64)
            return _Candidates(np.zeros((0, n_tiers)), empty_i, empty_i, np.zeros(0), empty_i,
                               np.zeros(0))
        return _Candidates(*(np.concatenate([getattr(p, f) for p in parts])
                             for f in ("thresholds", "n_accepted", "n_correct", "predicted",
                                       "n_slow", "cost")))

    def take(self, index: NDArray[np.int64]) -> _Candidates:
        return _Candidates(self.thresholds[index], self.n_accepted[index], self.n_correct[index],
                           self.predicted[index], self.n_slow[index], self.cost[index])


class CascadeThresholds:
    """One threshold per fast tier (None: the tier is not read), fit on labelled rows read by
    every tier, so that the answers the tiers accept are together at least ``target_accuracy``
    accurate with probability at least 1 - ``delta``; with ``max_slow_share``, also at most that
    share of decisions reaches the slow model (both at once, with delta split between them).

    A decision goes to the first tier read; a tier accepts when its calibrated top probability is
    >= its threshold, otherwise the next tier read reads it; what no tier accepts goes to the slow
    model. A decision pays the cost of every tier that read it, plus ``slow_cost`` if escalated.

    The search (docs/cascade.md): candidate vectors over every ordered subset of tiers; the
    Pareto frontier of (cost, predicted accuracy of the accepted answers), both computed without
    the tuning labels, walked from the most expensive (safest) to the cheapest; each step tests
    "accuracy of the accepted answers < target" with the exact binomial bound, by
    ``calibration.risk``'s multi-start fixed-sequence walks at level
    delta / (starts * (tolerated_failures + 1)); the cheapest vector any walk certified is kept.
    With one tier it is ``calibration.risk.guaranteed_threshold`` on the same rows. A cap keeps
    only the vectors whose slow share plus ``slow_share_margin`` is within it. A cost promise's
    ``cost_cap`` (``calibration.block_cost``) keeps only the vectors whose slow share plus the
    margin at ``cost_level`` is within it; that level is the cost promise's own, so delta stays
    the accuracy's.
    """

    def __init__(self, *, target_accuracy: float, delta: float, tier_costs: Sequence[float],
                 slow_cost: float, max_slow_share: float | None = None, min_accepted: int = 100,
                 starts: int = STARTS, tolerated_failures: int = 0, grid_step: float = GRID_STEP,
                 levels: int = LEVELS, cost_cap: float | None = None,
                 cost_level: float | None = None) -> None:
        self.target_accuracy = target_accuracy
        self.delta = delta
        self.tier_costs = tier_costs
        self.slow_cost = slow_cost
        self.max_slow_share = max_slow_share
        self.min_accepted = min_accepted
        self.starts = starts
        self.tolerated_failures = tolerated_failures
        self.grid_step = grid_step
        self.levels = levels
        self.cost_cap = cost_cap
        self.cost_level = cost_level

    def fit(self, confidence: ArrayLike, correct: ArrayLike, *,
            order_confidence: ArrayLike | None = None, order_correct: ArrayLike | None = None
            ) -> Self:
        """``confidence``: (n_samples, n_tiers) calibrated top probability of each tier on each
        row; ``correct``: (n_samples, n_tiers) whether that tier's answer is right.
        ``order_confidence`` / ``order_correct``: other labelled rows, read by every tier, that
        only order the candidates (their labels never enter a test), e.g. the rows the
        calibrators were fit on. Without them the order is the mean calibrated confidence, which
        over-states a later tier's accuracy on the rows earlier tiers turned down
        (docs/cascade.md compares the two orders)."""
        conf, hits = _check_reads(confidence, correct)
        order = None
        if order_confidence is not None or order_correct is not None:
            if order_confidence is None or order_correct is None:
                raise ValueError("order_confidence and order_correct go together: pass both")
            order = _check_reads(order_confidence, order_correct, prefix="order_")
            if order[0].shape[1] != conf.shape[1]:
                raise ValueError(f"order_confidence has {order[0].shape[1]} columns (tiers), "
                                 f"confidence has {conf.shape[1]}")
        n, n_tiers = conf.shape
        costs = self._check_options(n_tiers)
        target = self.target_accuracy
        # With a cap, half of delta goes to the slow-share bound (a union bound over the two).
        delta = self.delta if self.max_slow_share is None else self.delta / 2
        level = delta / (self.starts * (self.tolerated_failures + 1))
        fewest = fewest_tested_rows(n, target=target, level=level, min_accepted=self.min_accepted)
        cap = 1.0 if self.max_slow_share is None else self.max_slow_share
        margin = 0.0 if self.max_slow_share is None else slow_share_margin(
            n, n_tiers=n_tiers, delta=delta)
        cost_cap, cost_margin = self._cost_filter(n, n_tiers)
        parts = []
        for part in _enumerate(conf, hits, costs, slow_cost=self.slow_cost, levels=self.levels,
                               order=order):
            within = part.take(np.flatnonzero((part.n_slow / n + margin <= cap)
                                              & (part.n_slow / n + cost_margin <= cost_cap)))
            parts.append(within.take(_pareto(within, fewest)))
        candidates = _Candidates.concat(parts, n_tiers)
        walk = candidates.take(_pareto(candidates, fewest)[::-1])  # safest (dearest) first
        walk = walk.take(walk_candidates(walk.n_accepted, n, target=target, level=level,
                                         min_accepted=self.min_accepted,
                                         grid_step=self.grid_step))
        bounds = accuracy_lower_bound(walk.n_correct, walk.n_accepted, level)
        kept, steps, failures = fixed_sequence_walks(
            bounds < target, walk.n_accepted, n, starts=self.starts,
            tolerated_failures=self.tolerated_failures)
        self.level_ = level
        self.n_candidates_ = len(walk.cost)
        self.steps_tested_ = steps
        self.failures_ = failures
        self.passed_ = kept >= 0
        if kept < 0:
            self.thresholds_: tuple[float | None, ...] = (None,) * n_tiers
            self.bound_ = float(bounds[0]) if bounds.size else 0.0
            self.reason_ = (
                f"no threshold vector passed (the safest tested one's accuracy bound is "
                f"{self.bound_:.4f} against a target of {target}"
                + ("" if self.max_slow_share is None else
                   f", among those whose slow-share bound is within {self.max_slow_share}")
                + "): every decision escalates to the slow model")
        else:
            self.thresholds_ = tuple(None if np.isnan(t) else float(t)
                                     for t in walk.thresholds[kept])
            self.bound_ = float(bounds[kept])
            self.reason_ = ""
        self.slow_share_bound_ = float(walk.n_slow[kept] / n + margin) if kept >= 0 else 1.0
        tiers = self.route(conf)
        self.coverage_by_tier_ = tuple(float(np.mean(tiers == k)) for k in range(n_tiers + 1))
        self.expected_cost_ = float(np.mean(self.costs(conf)))
        accepted = tiers < n_tiers
        self.accepted_accuracy_ = (float(np.mean(hits[accepted, tiers[accepted]]))
                                   if accepted.any() else None)
        return self

    def _cost_filter(self, n: int, n_tiers: int) -> tuple[float, float]:
        """The cost promise's cap on the slow share and its margin (1 and 0: no promise)."""
        if self.cost_cap is None:
            return 1.0, 0.0
        if self.cost_level is None or not 0.0 < self.cost_level < 1.0:
            raise ValueError(f"cost_level must be in (0, 1) with cost_cap, got "
                             f"{self.cost_level!r}")
        return self.cost_cap, slow_share_margin(n, n_tiers=n_tiers, delta=self.cost_level)

    def route(self, confidence: ArrayLike) -> NDArray[np.int64]:
        """The tier that answers each row: 0 .. n_tiers - 1, or n_tiers for the slow model."""
        conf = self._fitted_reads(confidence)
        answered = np.full(len(conf), len(self.thresholds_), dtype=np.int64)
        waiting = np.ones(len(conf), dtype=bool)
        for k, threshold in enumerate(self.thresholds_):
            if threshold is None:
                continue
            accepts = waiting & (conf[:, k] >= threshold)
            answered[accepts] = k
            waiting &= ~accepts
        return answered

    def costs(self, confidence: ArrayLike) -> NDArray[np.float64]:
        """What each row costs: every tier that read it, and the slow model if it escalated."""
        answered = self.route(confidence)
        total = np.zeros(len(answered))
        for k, threshold in enumerate(self.thresholds_):
            if threshold is not None:
                total += np.where(answered >= k, float(self.tier_costs[k]), 0.0)
        return total + np.where(answered == len(self.thresholds_), float(self.slow_cost), 0.0)

    def _fitted_reads(self, confidence: ArrayLike) -> NDArray[np.float64]:
        if not hasattr(self, "thresholds_"):
            raise RuntimeError("CascadeThresholds is not fitted: call fit(confidence, correct)")
        conf = _check_confidence_2d(confidence)
        if conf.shape[1] != len(self.thresholds_):
            raise ValueError(f"confidence has {conf.shape[1]} columns (tiers), the fit had "
                             f"{len(self.thresholds_)} tiers")
        return conf

    def _check_options(self, n_tiers: int) -> NDArray[np.float64]:
        check_fraction(self.target_accuracy, name="target_accuracy", low_open=True)
        check_fraction(self.delta, name="delta", low_open=True, high_open=True)
        if self.max_slow_share is not None:
            check_fraction(self.max_slow_share, name="max_slow_share")
        for name, value, low in (("min_accepted", self.min_accepted, 1),
                                 ("starts", self.starts, 1),
                                 ("tolerated_failures", self.tolerated_failures, 0),
                                 ("levels", self.levels, 1)):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value!r}")
        if not 0.0 <= self.grid_step < 1.0:
            raise ValueError(f"grid_step must be in [0, 1), got {self.grid_step!r}")
        costs = np.asarray(self.tier_costs, dtype=np.float64)
        if costs.shape != (n_tiers,):
            raise ValueError(f"tier_costs must hold one cost per tier ({n_tiers}), got "
                             f"{list(np.atleast_1d(costs))}")
        if not np.all(np.isfinite(costs)) or np.any(costs < 0.0):
            raise ValueError(f"tier_costs must be finite and >= 0, got {costs.tolist()}")
        if not (np.isfinite(self.slow_cost) and self.slow_cost > 0.0):
            raise ValueError(f"slow_cost must be finite and > 0 (escalating must cost "
                             f"something), got {self.slow_cost!r}")
        return costs


def slow_share_margin(n: int, *, n_tiers: int, delta: float) -> float:
    """How far the share of decisions reaching the slow model can sit above its share on ``n``
    tuning rows, for every threshold vector at once, with probability 1 - ``delta``. A vector
    escalates exactly the rows whose confidence is below its threshold at every tier read: a
    lower orthant of the confidence space, so the multivariate Dvoretzky-Kiefer-Wolfowitz
    inequality (Naaman 2021: P(sup |F_n - F| > eps) <= d (n + 1) exp(-2 n eps^2)) bounds all of
    them, whichever vector the data picks."""
    return float(np.sqrt(np.log(n_tiers * (n + 1) / delta) / (2.0 * n)))


def _enumerate(conf: NDArray[np.float64], hits: NDArray[np.bool_], costs: NDArray[np.float64],
               *, slow_cost: float, levels: int,
               order: tuple[NDArray[np.float64], NDArray[np.bool_]] | None
               ) -> Iterator[_Candidates]:
    """Every candidate vector, one batch per (ordered subset of tiers read, thresholds of all
    but its last tier): the last tier takes each distinct confidence on the rows it reads.
    ``predicted`` is the accuracy of the accepted answers on the ``order`` rows (smoothed by one
    right and one wrong answer), or without them their mean calibrated confidence."""
    n_tiers = conf.shape[1]
    grids = [_levels(conf[:, k], levels) for k in range(n_tiers)]
    for size in range(1, n_tiers + 1):
        for tiers in combinations(range(n_tiers), size):
            *earlier, last = tiers
            for prefix in product(*(grids[k] for k in earlier)):
                reaching, (n_acc, n_hit), cost = _prefix(conf, hits, costs, earlier, prefix)
                if reaching.size == 0:
                    continue  # the last tier would read nothing: a shorter subset covers it
                row_order = np.argsort(-conf[reaching, last], kind="stable")
                sorted_conf = conf[reaching, last][row_order]
                run_end = np.flatnonzero(np.append(sorted_conf[1:] != sorted_conf[:-1], True))
                thresholds = sorted_conf[run_end]
                total_acc = n_acc + run_end + 1
                if order is None:
                    predicted = ((_accepted_sum(conf, earlier, prefix, conf)
                                  + np.cumsum(sorted_conf)[run_end]) / total_acc)
                else:
                    predicted = _order_accuracy(*order, earlier, prefix, last, thresholds)
                vectors = np.full((run_end.size, n_tiers), np.nan)
                vectors[:, list(earlier)] = prefix
                vectors[:, last] = thresholds
                yield _Candidates(
                    thresholds=vectors, n_accepted=total_acc.astype(np.int64),
                    n_correct=(n_hit + np.cumsum(hits[reaching, last][row_order])[run_end]
                               ).astype(np.int64),
                    predicted=predicted,
                    n_slow=(reaching.size - run_end - 1).astype(np.int64),
                    cost=cost + costs[last] * reaching.size
                    + slow_cost * (reaching.size - run_end - 1))


def _prefix(conf: NDArray[np.float64], hits: NDArray[np.bool_], costs: NDArray[np.float64],
            earlier: Sequence[int], prefix: Sequence[float]
            ) -> tuple[NDArray[np.int64], tuple[int, int], float]:
    """Rows no earlier tier accepted, (accepted, right) counts of the earlier tiers, their cost."""
    waiting = np.ones(len(conf), dtype=bool)
    n_acc, n_hit, cost = 0, 0, 0.0
    for k, threshold in zip(earlier, prefix, strict=True):
        cost += costs[k] * np.count_nonzero(waiting)
        accepts = waiting & (conf[:, k] >= threshold)
        n_acc += int(np.count_nonzero(accepts))
        n_hit += int(np.count_nonzero(hits[accepts, k]))
        waiting &= ~accepts
    return np.flatnonzero(waiting), (n_acc, n_hit), cost


def _accepted_sum(conf: NDArray[np.float64], earlier: Sequence[int], prefix: Sequence[float],
                  values: NDArray[np.float64]) -> float:
    """Sum of ``values`` (per row and tier) over the answers the earlier tiers accepted."""
    waiting = np.ones(len(conf), dtype=bool)
    total = 0.0
    for k, threshold in zip(earlier, prefix, strict=True):
        accepts = waiting & (conf[:, k] >= threshold)
        total += float(values[accepts, k].sum())
        waiting &= ~accepts
    return total


def _order_accuracy(conf: NDArray[np.float64], hits: NDArray[np.bool_], earlier: Sequence[int],
                    prefix: Sequence[float], last: int, thresholds: NDArray[np.float64]
                    ) -> NDArray[np.float64]:
    """Accuracy of the accepted answers on the ordering rows at each last-tier threshold,
    smoothed by one right and one wrong answer (few accepted rows say little)."""
    reaching, (n_acc, n_hit), _ = _prefix(conf, hits, np.zeros(conf.shape[1]), earlier, prefix)
    sorted_conf = -np.sort(-conf[reaching, last], kind="stable")
    right = np.concatenate([[0], np.cumsum(hits[reaching, last][np.argsort(
        -conf[reaching, last], kind="stable")])])
    taken = np.searchsorted(-sorted_conf, -thresholds, side="right")
    result: NDArray[np.float64] = (n_hit + right[taken] + 1.0) / (n_acc + taken + 2.0)
    return result


def _levels(confidence: NDArray[np.float64], levels: int) -> NDArray[np.float64]:
    """Thresholds at which this tier alone accepts 1/levels, 2/levels ... of the rows."""
    shares = np.arange(1, levels + 1) / levels
    return np.unique(np.quantile(confidence, 1.0 - shares, method="lower"))[::-1]


def _pareto(candidates: _Candidates, fewest: int) -> NDArray[np.int64]:
    """Indices of the candidates that accept at least ``fewest`` rows and that no cheaper one
    matches in mean calibrated confidence, cheapest first. Label-free: cost and confidence
    only, so the walk's order is fixed before correctness is looked at."""
    eligible = np.flatnonzero(candidates.n_accepted >= fewest)
    order = eligible[np.lexsort((-candidates.predicted[eligible], candidates.cost[eligible]))]
    predicted = candidates.predicted[order]
    best_cheaper = np.maximum.accumulate(np.concatenate([[-np.inf], predicted[:-1]]))
    return order[predicted > best_cheaper].astype(np.int64)


def _check_confidence_2d(confidence: ArrayLike, name: str = "confidence"
                         ) -> NDArray[np.float64]:
    array = np.asarray(confidence, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"{name} must be 2-D (n_samples, n_tiers), got shape {array.shape}")
    check_confidence(array.ravel(), name=name)  # non-empty, finite, in [0, 1]
    return array


def _check_reads(confidence: ArrayLike, correct: ArrayLike, *, prefix: str = ""
                 ) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    conf = _check_confidence_2d(confidence, f"{prefix}confidence")
    hits = np.asarray(correct)
    if hits.shape != conf.shape:
        raise ValueError(f"{prefix}correct must have the shape of {prefix}confidence "
                         f"{conf.shape}, got {hits.shape}")
    if hits.dtype != np.bool_:
        if not np.all(np.isin(hits, (0, 1))):
            raise ValueError(f"{prefix}correct must hold booleans or 0/1")
        hits = hits.astype(bool)
    return conf, hits
