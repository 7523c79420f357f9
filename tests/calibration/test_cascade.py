"""The cascade's joint thresholds: one tier is the one-tier search, the promise holds on fresh
data across re-draws, cost rises with the target, a second tier that knows other rows is used,
the slow-share cap holds, bad inputs are refused by name, and a hopeless fit escalates all."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from calibration.cascade import CascadeThresholds
from calibration.risk import accuracy_lower_bound, guaranteed_threshold

# Each tier's confidence c ~ Beta(A, 1) with P(correct | c) = c: calibrated by construction.
A = 4.0


def reads(n: int, n_tiers: int, rng: np.random.Generator
          ) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    confidence = rng.beta(A, 1.0, size=(n, n_tiers))
    return confidence, rng.uniform(size=(n, n_tiers)) < confidence


def accepted_accuracy(fitted: CascadeThresholds, confidence: NDArray[np.float64],
                      correct: NDArray[np.bool_]) -> float | None:
    tiers = fitted.route(confidence)
    accepted = tiers < confidence.shape[1]
    return float(correct[accepted, tiers[accepted]].mean()) if accepted.any() else None


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("target", [0.8, 0.9, 0.95])
def test_one_tier_is_the_one_tier_search(seed: int, target: float) -> None:
    confidence, correct = reads(1500, 1, np.random.default_rng(seed))
    one = guaranteed_threshold(confidence[:, 0], correct[:, 0], target_accuracy=target,
                               delta=0.05)
    fitted = CascadeThresholds(target_accuracy=target, delta=0.05, tier_costs=[1.0],
                               slow_cost=50.0).fit(confidence, correct)
    assert fitted.thresholds_ == (one.threshold,)
    assert fitted.passed_ == one.passed
    assert fitted.bound_ == pytest.approx(one.bound)
    assert fitted.steps_tested_ == one.steps_tested
    assert fitted.coverage_by_tier_[0] == pytest.approx(one.coverage)


@pytest.mark.parametrize("ordered", [True, False])
def test_the_promise_holds_on_fresh_data_across_redraws(ordered: bool) -> None:
    rng = np.random.default_rng(7)
    target, delta, redraws = 0.9, 0.1, 60
    fresh_conf, fresh_correct = reads(20_000, 3, rng)
    violations, covered = 0, []
    for _ in range(redraws):
        confidence, correct = reads(1000, 3, rng)
        order_conf, order_correct = reads(1000, 3, rng) if ordered else (None, None)
        fitted = CascadeThresholds(target_accuracy=target, delta=delta,
                                   tier_costs=[1.0, 2.0, 4.0], slow_cost=40.0, levels=6
                                   ).fit(confidence, correct, order_confidence=order_conf,
                                         order_correct=order_correct)
        accuracy = accepted_accuracy(fitted, fresh_conf, fresh_correct)
        violations += accuracy is not None and accuracy < target
        covered.append(1.0 - fitted.coverage_by_tier_[-1])
    # Two binomial standard errors of slack over delta; the fits accept most rows, so the
    # promise is not kept by escalating everything.
    assert violations / redraws <= delta + 2 * np.sqrt(delta * (1 - delta) / redraws)
    assert np.mean(covered) > 0.5


def test_cost_rises_with_the_target() -> None:
    confidence, correct = reads(2000, 2, np.random.default_rng(3))
    costs = [CascadeThresholds(target_accuracy=target, delta=0.05, tier_costs=[1.0, 3.0],
                               slow_cost=30.0).fit(confidence, correct).expected_cost_
             for target in (0.8, 0.85, 0.9, 0.95)]
    assert costs == sorted(costs)
    assert costs[0] < costs[-1]


def test_a_second_tier_sure_of_other_rows_is_used_and_costs_less() -> None:
    rng = np.random.default_rng(4)
    n = 3000
    # Tier 0 is sure (and right) on the first half only, tier 1 on the second half only.
    half = np.arange(n) < n // 2
    confidence = np.where(half[:, None], [0.97, 0.3], [0.3, 0.97]) + rng.uniform(
        -0.02, 0.02, size=(n, 2))
    correct = rng.uniform(size=(n, 2)) < confidence
    both = CascadeThresholds(target_accuracy=0.9, delta=0.05, tier_costs=[1.0, 2.0],
                             slow_cost=50.0).fit(confidence, correct)
    assert all(t is not None for t in both.thresholds_)
    assert both.coverage_by_tier_[0] > 0.4 and both.coverage_by_tier_[1] > 0.4
    for k in (0, 1):
        alone = CascadeThresholds(target_accuracy=0.9, delta=0.05, tier_costs=[[1.0, 2.0][k]],
                                  slow_cost=50.0).fit(confidence[:, [k]], correct[:, [k]])
        assert both.expected_cost_ < alone.expected_cost_
    assert both.costs(confidence).mean() == pytest.approx(both.expected_cost_)
    # The bound is the exact binomial bound of the answers the vector accepts on these rows.
    tiers = both.route(confidence)
    accepted = tiers < 2
    assert both.bound_ == pytest.approx(float(accuracy_lower_bound(
        int(correct[accepted, tiers[accepted]].sum()), int(accepted.sum()), both.level_)))
    assert both.bound_ >= 0.9


def test_the_slow_share_cap_holds_on_fresh_data() -> None:
    rng = np.random.default_rng(5)
    fresh_conf, _ = reads(20_000, 2, rng)
    confidence, correct = reads(2000, 2, rng)
    capped = CascadeThresholds(target_accuracy=0.85, delta=0.05, tier_costs=[1.0, 2.0],
                               slow_cost=30.0, max_slow_share=0.3).fit(confidence, correct)
    assert capped.passed_ and capped.slow_share_bound_ <= 0.3
    assert np.mean(capped.route(fresh_conf) == 2) <= 0.3
    # A cap no accurate-enough vector meets: nothing passes, and the reason names the cap.
    impossible = CascadeThresholds(target_accuracy=0.95, delta=0.05, tier_costs=[1.0, 2.0],
                                   slow_cost=30.0, max_slow_share=0.01).fit(confidence, correct)
    assert not impossible.passed_
    assert "slow-share" in impossible.reason_


def test_no_passing_vector_escalates_everything_and_says_so() -> None:
    confidence, _ = reads(500, 2, np.random.default_rng(6))
    fitted = CascadeThresholds(target_accuracy=0.9, delta=0.05, tier_costs=[1.0, 1.0],
                               slow_cost=10.0).fit(confidence, np.zeros((500, 2), dtype=bool))
    assert not fitted.passed_
    assert fitted.thresholds_ == (None, None)
    assert fitted.coverage_by_tier_ == (0.0, 0.0, 1.0)
    assert fitted.expected_cost_ == 10.0
    assert np.all(fitted.route(confidence) == 2)
    assert "every decision escalates" in fitted.reason_


GOOD = {"target_accuracy": 0.9, "delta": 0.05, "tier_costs": [1.0, 2.0], "slow_cost": 10.0}


@pytest.mark.parametrize(("changes", "field"), [
    ({"target_accuracy": 0.0}, "target_accuracy"),
    ({"delta": 1.0}, "delta"),
    ({"max_slow_share": 1.5}, "max_slow_share"),
    ({"tier_costs": [1.0]}, "tier_costs"),
    ({"tier_costs": [1.0, -2.0]}, "tier_costs"),
    ({"slow_cost": 0.0}, "slow_cost"),
    ({"min_accepted": 0}, "min_accepted"),
    ({"starts": 0}, "starts"),
    ({"levels": 0}, "levels"),
    ({"grid_step": 1.0}, "grid_step"),
])
def test_bad_options_are_refused_by_name(changes: dict[str, object], field: str) -> None:
    confidence, correct = reads(200, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match=field):
        CascadeThresholds(**{**GOOD, **changes}).fit(confidence, correct)  # type: ignore[arg-type]


def test_ordering_rows_come_in_pairs_of_the_same_tiers() -> None:
    confidence, correct = reads(200, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="order_confidence and order_correct"):
        CascadeThresholds(**GOOD).fit(confidence, correct,  # type: ignore[arg-type]
                                      order_confidence=confidence)
    with pytest.raises(ValueError, match="order_confidence has 1 columns"):
        CascadeThresholds(**GOOD).fit(confidence, correct,  # type: ignore[arg-type]
                                      order_confidence=confidence[:, :1],
                                      order_correct=correct[:, :1])
    with pytest.raises(ValueError, match="order_correct must hold"):
        CascadeThresholds(**GOOD).fit(confidence, correct,  # type: ignore[arg-type]
                                      order_confidence=confidence,
                                      order_correct=np.full((200, 2), 3))


@pytest.mark.parametrize(("confidence", "correct", "field"), [
    (np.full(10, 0.5), np.ones(10), "confidence"),
    (np.full((10, 2), 1.5), np.ones((10, 2)), "confidence"),
    (np.full((10, 2), np.nan), np.ones((10, 2)), "confidence"),
    (np.zeros((0, 2)), np.zeros((0, 2)), "confidence"),
    (np.full((10, 2), 0.5), np.ones((10, 1)), "correct"),
    (np.full((10, 2), 0.5), np.full((10, 2), 2), "correct"),
])
def test_bad_reads_are_refused_by_name(confidence: NDArray[np.float64], correct: NDArray[np.int64],
                                       field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CascadeThresholds(**GOOD).fit(confidence, correct)  # type: ignore[arg-type]


def test_routing_needs_a_fit_and_the_fitted_tier_count() -> None:
    confidence, correct = reads(300, 2, np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="not fitted"):
        CascadeThresholds(**GOOD).route(confidence)  # type: ignore[arg-type]
    fitted = CascadeThresholds(**GOOD).fit(confidence, correct)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2 tiers"):
        fitted.route(confidence[:, :1])
