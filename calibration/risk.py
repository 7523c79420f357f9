"""Choosing the accept threshold: the one with a finite-sample guarantee (fixed-sequence testing
from several starts, with an exact binomial bound), the naive empirical one it
replaces, and the plain budget rule. Throughout, an answer is *accepted* when its confidence is
>= the threshold."""

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
    (0 when nothing passed). ``steps_tested`` counts the thresholds tested over all walks, the
    failing ones included; ``failures`` the tested ones that fell short. Each test ran at level
    ``delta / (starts * (tolerated_failures + 1))``, and ``bound`` is at that level.
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
    starts: int = 1
    tolerated_failures: int = 0
    failures: int = 0

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


# The search's defaults (docs/calibration.md, "The threshold search"): STARTS walks, each from
# its own start (the highest candidate, then 1/STARTS, 2/STARTS ... of the rows further down),
# each at level delta / STARTS, over candidates GRID_STEP of the rows apart. Chosen on BANKING77
# re-draws (bench.guarantee): at 0.98 one early error does not end the search.
STARTS = 3
GRID_STEP = 0.01


def guaranteed_threshold(confidence: ArrayLike, correct: ArrayLike, *, target_accuracy: float,
                         delta: float, min_accepted: int = 100, starts: int = STARTS,
                         tolerated_failures: int = 0, grid_step: float = GRID_STEP
                         ) -> RiskControlResult:
    """The lowest threshold whose accepted answers are at least ``target_accuracy`` accurate,
    with probability at least 1 - ``delta`` over the draw of the tuning rows.

    Candidates are observed confidences from the highest down, from the first that accepts at
    least ``min_accepted`` rows (and as many as an all-correct sample needs to clear the target:
    a test on fewer could only fail), one every ``grid_step`` of the rows (the first candidate
    at or past each step; 0: every distinct confidence). At each t the null hypothesis H(t)
    "accuracy among answers with confidence >= t is below the target" is rejected when the
    Clopper-Pearson lower bound at level 1 - delta / (m (k + 1)) reaches the target (an exact
    one-sided binomial test), m = ``starts``, k = ``tolerated_failures``. There are m walks:
    walk j starts at the candidate that accepts j / m of the rows past the first candidate and
    goes down, past up to k failing candidates, stopping at the (k + 1)-th. The lowest
    candidate any walk rejected is kept: the most coverage the tests allow.

    Why the family-wise error stays at delta: each walk's order is fixed before correctness is
    seen (the grid and starts depend on the confidences only). Within one walk, a false
    rejection needs one of the first k + 1 true nulls in its order to be rejected (if none is,
    each is a failure and the walk has stopped by the last of them before reaching another),
    each with probability at most delta / (m (k + 1)); over the m walks, at most delta in all,
    however many candidates are walked and whether or not accuracy is monotone in the threshold
    (fixed-sequence testing, Bauer 1991, with its multi-start and fallback forms; MAPIE's
    ``FWERFixedSequenceTesting`` has the same multi-start). Going on past a failure at the full
    level would NOT be valid. With m = 1, k = 0 and no grid it is the plain single walk, which
    one early error ends: at 0.98 most candidates near the top accept few rows, so one wrong
    answer among the most confident rows ends it (on one held-out intent draw: coverage 0.013
    where the bound holds to 91% of the rows). A walk started further down is past that region.
    The argument is exact for the accuracy expected on rows with these confidences and
    approximate (to sampling noise in where the grid falls) for new rows. Assumed: new answers
    come from the same source as the tuning rows (exchangeable). ``tests/calibration/
    test_risk.py`` checks the violation rate on fresh data by simulation.
    """
    conf, hits = check_confidence_correct(confidence, correct)
    target = check_fraction(target_accuracy, name="target_accuracy", low_open=True)
    given = check_fraction(delta, name="delta", low_open=True, high_open=True)
    for name, value, low in (("min_accepted", min_accepted, 1), ("starts", starts, 1),
                             ("tolerated_failures", tolerated_failures, 0)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value!r}")
    if not 0.0 <= grid_step < 1.0:
        raise ValueError(f"grid_step must be in [0, 1), got {grid_step!r}")
    level = given / (starts * (tolerated_failures + 1))
    n = len(conf)
    thresholds, n_accepted, n_correct = _candidates(conf, hits)
    grid = walk_candidates(n_accepted, n, target=target, level=level,
                           min_accepted=min_accepted, grid_step=grid_step)
    thresholds, n_accepted, n_correct = thresholds[grid], n_accepted[grid], n_correct[grid]
    bounds = accuracy_lower_bound(n_correct, n_accepted, level)
    kept, steps, failures = fixed_sequence_walks(bounds < target, n_accepted, n, starts=starts,
                                                 tolerated_failures=tolerated_failures)
    if kept < 0:
        return RiskControlResult(
            threshold=None, target_accuracy=target, delta=given,
            bound=float(bounds[0]) if bounds.size else 0.0, coverage=0.0, n=n, n_accepted=0,
            n_correct=0, passed=False, steps_tested=steps, starts=starts,
            tolerated_failures=tolerated_failures, failures=failures)
    return RiskControlResult(
        threshold=float(thresholds[kept]), target_accuracy=target, delta=given,
        bound=float(bounds[kept]), coverage=float(n_accepted[kept] / n), n=n,
        n_accepted=int(n_accepted[kept]), n_correct=int(n_correct[kept]), passed=True,
        steps_tested=steps, starts=starts, tolerated_failures=tolerated_failures,
        failures=failures)


def walk_candidates(n_accepted: NDArray[np.int64], n: int, *, target: float, level: float,
                    min_accepted: int, grid_step: float) -> NDArray[np.int64]:
    """Indices, in walk order, of the candidates the walks may test; label-free (it reads only
    how many rows each candidate accepts): those accepting at least ``min_accepted`` rows and
    as many as an all-correct sample needs to clear ``target`` at ``level`` (a test on fewer
    could only fail), thinned to one every ``grid_step`` of the ``n`` rows by ``_grid``."""
    eligible = np.flatnonzero(n_accepted >= fewest_tested_rows(n, target=target, level=level,
                                                                min_accepted=min_accepted))
    reach = np.maximum.accumulate(n_accepted[eligible])
    return eligible[_grid(reach, step_rows=int(np.floor(grid_step * n)))].astype(np.int64)


def fixed_sequence_walks(failed: NDArray[np.bool_], n_accepted: NDArray[np.int64], n: int, *,
                         starts: int, tolerated_failures: int) -> tuple[int, int, int]:
    """The multi-start fixed-sequence walks over candidates in walk order (``failed``: the
    candidate's test did not reject its null). Walk j starts where the candidates first accept
    j / ``starts`` of the rows past the first candidate and goes on past up to
    ``tolerated_failures`` failures. Returns the last index any walk rejected (-1: none), the
    candidates tested and the tested ones that failed (``guaranteed_threshold`` says why the
    family-wise error stays at the level each test ran at times ``starts * (k + 1)``)."""
    reach = np.maximum.accumulate(n_accepted) if n_accepted.size else n_accepted
    kept, steps, failures = -1, 0, 0
    begins = {int(np.searchsorted(reach, reach[0] + (n - reach[0]) * j / starts))
              for j in range(starts)} if reach.size else set()
    for begin in sorted(begins - {len(failed)}):
        walk = failed[begin:]
        # Tested: at most k failures before it. Rejected: tested and not failed.
        tested = np.asarray((np.cumsum(walk) - walk) <= tolerated_failures)
        rejected = np.flatnonzero(tested & ~walk)
        steps += int(np.count_nonzero(tested))
        failures += int(np.count_nonzero(tested & walk))
        if rejected.size:
            kept = max(kept, begin + int(rejected[-1]))
    return kept, steps, failures


def _grid(n_accepted: NDArray[np.int64], *, step_rows: int) -> NDArray[np.int64]:
    """Indices of the candidates on the grid: the first, then the first at or past each
    ``step_rows`` more accepted rows, and the last (accept everything the walk may reach)."""
    if n_accepted.size == 0 or step_rows <= 1:
        return np.arange(n_accepted.size, dtype=np.int64)
    cell = (n_accepted - n_accepted[0]) // step_rows
    first = np.flatnonzero(np.diff(cell, prepend=-1) > 0)
    return np.unique(np.append(first, n_accepted.size - 1)).astype(np.int64)


def fewest_tested_rows(n: int, *, target: float, level: float, min_accepted: int) -> int:
    """Fewest accepted rows (of ``n``) a candidate needs to be tested: ``min_accepted``, and as
    many as an all-correct sample needs to clear ``target`` at ``level``."""
    return min(n, max(min_accepted, _rows_needed(target, level)))


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
