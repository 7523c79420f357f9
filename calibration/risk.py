"""Choosing the accept threshold: the one with a finite-sample guarantee (fixed-sequence testing
with an exact binomial bound), the naive empirical one it replaces, and the plain budget rule.
Throughout, an answer is *accepted* when its confidence is >= the threshold."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import beta

from calibration.validation import check_confidence, check_confidence_correct, check_fraction


@dataclass(frozen=True)
class RiskControlResult:
    """Outcome of ``guaranteed_threshold``.

    ``threshold`` is None when even the highest candidate failed: the policy must escalate
    everything. ``bound`` is the lower confidence bound (level 1 - delta) on the accuracy of
    accepted answers at ``threshold``; when nothing passed it is the bound at the first candidate,
    which fell short of the target (it guarantees nothing, it says how far off it was).
    ``coverage``, ``n_accepted`` and ``n_correct`` describe the tuning rows at ``threshold``
    (0 when nothing passed). ``steps_tested`` counts the thresholds tested, the failing one
    included.
    """

    threshold: float | None
    target_accuracy: float
    delta: float
    bound: float
    coverage: float
    n: int
    n_accepted: int
    n_correct: int
    passed: bool
    steps_tested: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def accuracy_lower_bound(n_correct: ArrayLike, n_accepted: ArrayLike, delta: float
                         ) -> NDArray[np.float64]:
    """One-sided Clopper-Pearson lower bound at level 1 - delta: Beta(delta; k, n - k + 1), the
    lower end of the two-sided exact interval at level 1 - 2 delta; 0 when k = 0."""
    k = np.asarray(n_correct, dtype=np.float64)
    n = np.asarray(n_accepted, dtype=np.float64)
    safe_k = np.where(k > 0, k, 1.0)
    bound: NDArray[np.float64] = np.where(k > 0, beta.ppf(delta, safe_k, n - k + 1.0), 0.0)
    return bound


def _candidates(confidence: NDArray[np.float64], correct: NDArray[np.bool_]
                ) -> tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.int64]]:
    """Distinct confidences, highest first, with the accepted and correct counts at each."""
    order = np.argsort(-confidence, kind="stable")
    sorted_conf = confidence[order]
    correct_so_far = np.cumsum(correct[order])
    # The last row of each run of equal confidence: accepting t accepts the whole run.
    last = np.flatnonzero(np.append(sorted_conf[1:] != sorted_conf[:-1], True))
    return sorted_conf[last], (last + 1).astype(np.int64), correct_so_far[last].astype(np.int64)


def guaranteed_threshold(confidence: ArrayLike, correct: ArrayLike, *, target_accuracy: float,
                         delta: float, min_accepted: int = 100) -> RiskControlResult:
    """The lowest threshold whose accepted answers are at least ``target_accuracy`` accurate,
    with probability at least 1 - ``delta`` over the draw of the tuning rows.

    Candidates are the distinct confidences, tested from the highest down, starting at the first
    that accepts at least ``min_accepted`` rows (and at least as many as an all-correct sample
    needs to clear the target: a test on fewer could only fail and end the walk). At each t
    the null hypothesis H(t) "accuracy among answers with confidence >= t is below the target" is
    rejected when the Clopper-Pearson lower bound at level 1 - delta reaches the target (an exact
    one-sided binomial test at level delta). The walk stops at the first candidate not rejected;
    the last rejected one is kept, which gives the most coverage the test allows.

    Why no multiplicity correction is needed: in fixed-sequence testing the order is fixed before
    the data are seen and the walk stops at the first non-rejection, so a false rejection can only
    happen if the *first* true null in the order is rejected, which has probability <= delta by
    the single test's level. The family-wise error, hence the chance that the kept threshold
    breaks the promise, is at most delta however many candidates are walked, and whether or not
    accuracy is monotone in the threshold. Here the order is every float in [0, 1], descending
    (fixed in advance); the accepted set only changes at observed confidences, so walking the
    distinct observed values tests the same hypotheses with the same outcomes, and every rejected
    threshold, the kept one included, carries the guarantee. Skipping the first few candidates
    depends on the confidences only, never on correctness, so given the confidences the order
    is still fixed; the argument is then exact for the accuracy expected on rows with these
    confidences and approximate (to sampling noise in where the start falls) for new rows.
    Assumed: new answers come from the same source as the tuning rows (exchangeable).
    ``tests/calibration/test_risk.py`` checks the violation rate on fresh data by simulation.
    """
    conf, hits = check_confidence_correct(confidence, correct)
    target = check_fraction(target_accuracy, name="target_accuracy", low_open=True)
    level = check_fraction(delta, name="delta", low_open=True, high_open=True)
    if min_accepted < 1:
        raise ValueError(f"min_accepted must be >= 1, got {min_accepted!r}")
    n = len(conf)
    thresholds, n_accepted, n_correct = _candidates(conf, hits)
    start = int(np.searchsorted(n_accepted, min(n, max(min_accepted, _rows_needed(target, level)))))
    thresholds, n_accepted, n_correct = thresholds[start:], n_accepted[start:], n_correct[start:]
    bounds = accuracy_lower_bound(n_correct, n_accepted, level)
    failed = np.flatnonzero(bounds < target)
    steps = int(failed[0]) + 1 if failed.size else len(thresholds)
    if failed.size and failed[0] == 0:
        return RiskControlResult(
            threshold=None, target_accuracy=target, delta=level, bound=float(bounds[0]),
            coverage=0.0, n=n, n_accepted=0, n_correct=0, passed=False, steps_tested=steps,
        )
    kept = int(failed[0]) - 1 if failed.size else len(thresholds) - 1
    return RiskControlResult(
        threshold=float(thresholds[kept]), target_accuracy=target, delta=level,
        bound=float(bounds[kept]), coverage=float(n_accepted[kept] / n), n=n,
        n_accepted=int(n_accepted[kept]), n_correct=int(n_correct[kept]), passed=True,
        steps_tested=steps,
    )


def _rows_needed(target: float, delta: float) -> int:
    """Fewest accepted rows whose bound can reach the target at all (all of them correct):
    the smallest m with delta ** (1 / m) >= target."""
    if target >= 1.0:
        return 2**62  # no finite sample proves perfect accuracy
    return int(np.ceil(np.log(delta) / np.log(target) - 1e-9))


def naive_threshold(confidence: ArrayLike, correct: ArrayLike, *, target_accuracy: float
                    ) -> float | None:
    """The lowest threshold whose empirical accuracy on these rows reaches the target (None if
    none does). It has no guarantee: on new data it misses the target far more often than delta,
    which is what ``guaranteed_threshold`` exists to fix; kept for comparison."""
    conf, hits = check_confidence_correct(confidence, correct)
    target = check_fraction(target_accuracy, name="target_accuracy", low_open=True)
    thresholds, n_accepted, n_correct = _candidates(conf, hits)
    meets = np.flatnonzero(n_correct >= target * n_accepted)
    return float(thresholds[meets[-1]]) if meets.size else None


def budget_threshold(confidence: ArrayLike, *, max_escalation: float) -> float:
    """The highest threshold that escalates (confidence < threshold) at most ``max_escalation``
    of these rows: the floor(max_escalation * n)-th smallest confidence. With a budget covering
    every row it is the float just above 1.0, which escalates any confidence."""
    conf = check_confidence(confidence)
    budget = check_fraction(max_escalation, name="max_escalation")
    escalated = int(np.floor(budget * len(conf) + 1e-9))
    if escalated >= len(conf):
        return float(np.nextafter(1.0, 2.0))
    return float(np.sort(conf)[escalated])
