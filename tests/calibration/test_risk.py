"""Risk control: the guaranteed threshold's bound is the exact binomial bound, one walk is the
fixed-sequence walk, the promise holds on fresh data (simulated) where the naive rule breaks it,
and the multi-start search survives an early error that ends a single walk."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy.stats import binomtest

from calibration import budget_threshold, guaranteed_threshold, naive_threshold

# Confidence c ~ Beta(A, 1) and P(correct | c) = c: the true accuracy of {c >= t} is known.
A = 4.0


def true_accuracy(threshold: float) -> float:
    return (A / (A + 1.0)) * (1.0 - threshold ** (A + 1.0)) / (1.0 - threshold**A)


def draw(n: int, rng: np.random.Generator) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    confidence = rng.beta(A, 1.0, size=n)
    return confidence, rng.uniform(size=n) < confidence


def exact_lower_bound(k: int, n: int, delta: float) -> float:
    return float(binomtest(k, n).proportion_ci(confidence_level=1.0 - 2.0 * delta,
                                               method="exact").low)


def test_bound_is_the_exact_binomial_bound() -> None:
    confidence, correct = draw(1000, np.random.default_rng(0))
    result = guaranteed_threshold(confidence, correct, target_accuracy=0.9, delta=0.1)
    assert result.passed and result.threshold is not None
    accepted = confidence >= result.threshold
    assert result.n_accepted == int(accepted.sum())
    assert result.n_correct == int(correct[accepted].sum())
    assert result.coverage == pytest.approx(accepted.mean())
    # Each of the three walks tests at delta / 3.
    assert result.starts == 3
    assert result.bound == pytest.approx(
        exact_lower_bound(result.n_correct, result.n_accepted, 0.1 / 3), abs=1e-9)
    assert result.bound >= 0.9


def test_walk_matches_a_plain_fixed_sequence_walk() -> None:
    confidence, correct = draw(400, np.random.default_rng(1))
    confidence = np.round(confidence, 2)  # ties: a threshold accepts a whole run of equal values
    target, delta, min_accepted = 0.85, 0.1, 50
    kept = None
    for threshold in np.unique(confidence)[::-1]:
        accepted = confidence >= threshold
        if accepted.sum() < min_accepted:
            continue
        if exact_lower_bound(int(correct[accepted].sum()), int(accepted.sum()), delta) < target:
            break
        kept = float(threshold)
    result = guaranteed_threshold(confidence, correct, target_accuracy=target, delta=delta,
                                  min_accepted=min_accepted, starts=1, grid_step=0.0)
    assert kept is not None
    assert result.threshold == kept


@pytest.mark.parametrize("search", [{}, {"starts": 1, "grid_step": 0.0},
                                    {"starts": 2, "tolerated_failures": 2, "grid_step": 0.0}])
def test_guarantee_holds_on_fresh_data_where_the_naive_rule_breaks(
        search: dict[str, float]) -> None:
    rng = np.random.default_rng(2)
    target, delta, repetitions = 0.9, 0.1, 300
    violations = naive_violations = 0
    for _ in range(repetitions):
        confidence, correct = draw(1000, rng)
        result = guaranteed_threshold(confidence, correct, target_accuracy=target, delta=delta,
                                      **search)  # type: ignore[arg-type]
        if result.threshold is not None and true_accuracy(result.threshold) < target:
            violations += 1
        naive = naive_threshold(confidence, correct, target_accuracy=target)
        if naive is not None and true_accuracy(naive) < target:
            naive_violations += 1
    # Binomial noise of 300 repetitions at rate 0.1 has sd ~0.017: 0.05 of slack is ~3 sd.
    assert violations / repetitions <= delta + 0.05
    assert naive_violations / repetitions >= 0.3


def test_no_threshold_passes_means_escalate_everything() -> None:
    confidence, correct = draw(500, np.random.default_rng(3))
    result = guaranteed_threshold(confidence, correct, target_accuracy=0.999, delta=0.05)
    assert result.threshold is None and not result.passed
    assert result.coverage == 0.0 and result.n_accepted == 0 and result.n_correct == 0
    assert result.bound < 0.999
    assert 1 <= result.steps_tested == result.failures <= result.starts  # each walk failed at once


def test_too_few_rows_to_prove_the_target_fail_cleanly() -> None:
    # 20 rows, all correct, cannot show 0.95 at delta 0.05 (needs 59): escalate, not crash.
    result = guaranteed_threshold(np.linspace(0.5, 1.0, 20), np.ones(20, dtype=bool),
                                  target_accuracy=0.95, delta=0.05)
    assert result.threshold is None
    assert result.bound == pytest.approx((0.05 / 3) ** (1 / 20))


def test_all_correct_rows_accept_everything() -> None:
    confidence = np.random.default_rng(4).uniform(size=500)
    result = guaranteed_threshold(confidence, np.ones(500, dtype=bool), target_accuracy=0.9,
                                  delta=0.05)
    assert result.threshold == pytest.approx(confidence.min())
    assert result.coverage == 1.0


def test_naive_threshold_is_the_lowest_with_enough_empirical_accuracy() -> None:
    confidence = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    correct = np.array([True, True, False, True, False])
    assert naive_threshold(confidence, correct, target_accuracy=0.75) == 0.6
    assert naive_threshold(confidence, correct, target_accuracy=1.0) == 0.8
    assert naive_threshold(confidence, ~np.ones(5, dtype=bool), target_accuracy=0.5) is None


@pytest.mark.parametrize("max_escalation", [0.0, 0.1, 0.25, 0.5, 0.99])
def test_budget_threshold_escalates_at_most_the_budget(max_escalation: float) -> None:
    confidence = np.random.default_rng(5).uniform(size=1000)
    threshold = budget_threshold(confidence, max_escalation=max_escalation)
    escalated = np.mean(confidence < threshold)
    assert escalated <= max_escalation
    assert escalated >= max_escalation - 1e-3  # the highest such threshold: uses the budget


def test_full_budget_escalates_every_confidence() -> None:
    threshold = budget_threshold(np.array([0.2, 1.0]), max_escalation=1.0)
    assert threshold > 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_accuracy": 1.5, "delta": 0.05}, r"target_accuracy must be in \(0, 1\]"),
        ({"target_accuracy": 0.9, "delta": 0.0}, r"delta must be in \(0, 1\)"),
        ({"target_accuracy": 0.9, "delta": 0.05, "min_accepted": 0}, "min_accepted must be"),
        ({"target_accuracy": 0.9, "delta": 0.05, "starts": 0}, "starts must be >= 1"),
        ({"target_accuracy": 0.9, "delta": 0.05, "grid_step": 1.0}, r"grid_step must be in \[0, 1\)"),
    ],
)
def test_risk_options_are_validated(kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        guaranteed_threshold([0.5, 0.9], [True, False], **kwargs)


def test_confidence_and_correct_are_validated() -> None:
    with pytest.raises(ValueError, match=r"confidence has values outside \[0, 1\]"):
        guaranteed_threshold([0.5, 1.2], [True, False], target_accuracy=0.9, delta=0.1)
    with pytest.raises(ValueError, match="correct has 1 values but confidence has 2"):
        naive_threshold([0.5, 0.9], [True], target_accuracy=0.9)
    with pytest.raises(ValueError, match="confidence is empty"):
        budget_threshold([], max_escalation=0.1)
    with pytest.raises(ValueError, match=r"max_escalation must be in \[0, 1\]"):
        budget_threshold([0.5], max_escalation=-0.1)


def early_error_rows() -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """4,000 rows whose accuracy is 0.995 down to 70% coverage, with the second and third most
    confident answers wrong: a single walk at 0.98 ends among the first rows."""
    rng = np.random.default_rng(7)
    confidence = np.sort(rng.uniform(0.5, 1.0, size=4000))[::-1]
    correct = np.where(np.arange(4000) < 2800, rng.uniform(size=4000) < 0.995,
                       rng.uniform(size=4000) < 0.8)
    correct[[1, 2]] = False
    return confidence, correct


def test_an_early_error_does_not_end_the_search() -> None:
    confidence, correct = early_error_rows()
    single = guaranteed_threshold(confidence, correct, target_accuracy=0.98, delta=0.05,
                                  starts=1, grid_step=0.0)
    assert single.coverage < 0.1  # the walk ends among the first few hundred rows
    result = guaranteed_threshold(confidence, correct, target_accuracy=0.98, delta=0.05)
    assert result.coverage > 0.6 and result.bound >= 0.98
    assert result.failures >= 1  # the top walk failed; a walk started further down did not


@pytest.mark.parametrize("target", [0.9, 0.95, 0.98])
def test_the_search_covers_at_least_what_mapie_certifies_on_the_same_rows(target: float) -> None:
    """MAPIE's BinaryClassificationController (Learn then Test, Holm over its grid) asked for the
    same promise as in bench/guarantee_methods.py, on the same simulated rows."""
    from bench.guarantee_methods import Scored, mapie_threshold

    rng = np.random.default_rng(8)
    ours, theirs = [], []
    for _ in range(8):
        confidence, correct = draw(4000, rng)
        confidence = 1.0 - (1.0 - confidence) ** 3  # sharper, as a calibrated LR: most near 1
        correct = rng.uniform(size=4000) < np.minimum(1.0, confidence + 0.005)
        result = guaranteed_threshold(confidence, correct, target_accuracy=target, delta=0.05)
        ours.append(result.coverage)
        theirs_t = mapie_threshold(Scored(confidence, correct, confidence, correct),
                                   target=target, delta=0.05)
        theirs.append(0.0 if theirs_t is None else float(np.mean(confidence >= theirs_t)))
    assert np.mean(ours) >= np.mean(theirs), (ours, theirs)
