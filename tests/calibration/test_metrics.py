"""Metrics: hand-checkable values, agreement with their textbook definitions, and intervals."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from calibration import (
    accuracy,
    accuracy_at_coverage,
    aurc,
    bootstrap_ci,
    brier,
    confidence_auroc,
    ece,
    mce,
    nll,
    proportion_ci,
    risk_coverage_curve,
)
from tests.calibration.conftest import overconfident

PROBA = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
Y_TRUE = np.array([0, 1, 1, 0])


def test_accuracy_brier_nll_by_hand() -> None:
    assert accuracy(PROBA, Y_TRUE) == 0.5
    expected_brier = np.mean(np.sum((PROBA - np.eye(2)[Y_TRUE]) ** 2, axis=1))
    assert brier(PROBA, Y_TRUE) == pytest.approx(expected_brier)
    assert nll(PROBA, Y_TRUE) == pytest.approx(-np.mean(np.log([0.9, 0.2, 0.7, 0.4])))


def test_ece_and_mce_by_hand() -> None:
    # Uniform bins of width 0.1: confidences 0.9, 0.8, 0.7, 0.6 each alone in a bin.
    gaps = np.abs(np.array([1, 0, 1, 0]) - np.array([0.9, 0.8, 0.7, 0.6]))
    assert ece(PROBA, Y_TRUE, n_bins=10) == pytest.approx(gaps.mean())
    assert mce(PROBA, Y_TRUE, n_bins=10) == pytest.approx(gaps.max())
    # One bin: |mean accuracy - mean confidence|.
    assert ece(PROBA, Y_TRUE, n_bins=1) == pytest.approx(abs(0.5 - 0.75))


def test_ece_is_near_zero_when_calibrated_and_large_when_not() -> None:
    rng = np.random.default_rng(0)
    confidence = rng.uniform(0.5, 1.0, size=20000)
    correct = rng.uniform(size=20000) < confidence
    proba = np.column_stack([confidence, 1.0 - confidence])
    y_true = np.where(correct, 0, 1)
    for strategy in ("uniform", "quantile"):
        assert ece(proba, y_true, strategy=strategy) < 0.02
    sharp, labels = overconfident(3000)
    assert ece(sharp, labels, strategy="quantile") > 0.1


def test_risk_coverage_curve_and_aurc() -> None:
    confidence = np.array([0.9, 0.6, 0.8, 0.7])
    correct = np.array([True, False, False, True])
    coverage, risk = risk_coverage_curve(confidence, correct)
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0.0, 0.5, 1 / 3, 0.5])
    assert aurc(confidence, correct) == pytest.approx(np.mean([0.0, 0.5, 1 / 3, 0.5]))
    assert accuracy_at_coverage(confidence, correct, 0.5) == 0.5
    assert accuracy_at_coverage(confidence, correct, 0.25) == 1.0
    assert accuracy_at_coverage(confidence, correct, 1.0) == 0.5


def test_confidence_auroc() -> None:
    assert confidence_auroc([0.9, 0.8, 0.3, 0.2], [True, True, False, False]) == 1.0
    assert confidence_auroc([0.1, 0.8, 0.3, 0.7], [True, True, False, False]) == 0.5
    assert np.isnan(confidence_auroc([0.9, 0.8], [True, True]))


def test_proportion_ci_is_clopper_pearson() -> None:
    low, high = proportion_ci(45, 50)
    reference = binomtest(45, 50).proportion_ci(confidence_level=0.95, method="exact")
    assert (low, high) == pytest.approx((reference.low, reference.high))
    assert proportion_ci(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        proportion_ci(5, 3)


def test_bootstrap_ci_covers_the_estimate_and_is_reproducible() -> None:
    proba, y_true = overconfident(1000)
    low, high = bootstrap_ci(ece, proba, y_true, n_resamples=200, seed=7, n_bins=10)
    point = ece(proba, y_true, n_bins=10)
    assert low < point < high
    assert bootstrap_ci(ece, proba, y_true, n_resamples=200, seed=7, n_bins=10) == (low, high)


def test_metric_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="rows of proba must sum to 1"):
        ece([[0.6, 0.6]], [0])
    with pytest.raises(ValueError, match=r"y_true has labels outside \[0, n_options\)"):
        nll(PROBA, [0, 1, 2, 0])
    with pytest.raises(ValueError, match="strategy must be"):
        ece(PROBA, Y_TRUE, strategy="equal")
    with pytest.raises(ValueError, match=r"coverage must be in \(0, 1\]"):
        accuracy_at_coverage([0.5], [True], 0.0)
    with pytest.raises(ValueError, match="correct must hold booleans or 0/1"):
        aurc([0.5, 0.6], [2, 0])
