"""Cross-fitting: folds are stratified and seeded, K is checked against the smallest class, each
row's calibrator never saw that row, and cross-fitted tuning keeps its promise on fresh reads."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.calibrators import make_calibrator
from calibration.crossfit import check_folds, check_n_folds, crossfit_calibrated, stratified_folds
from policies.evaluation import evaluate
from policies.policy import Policy
from tests.policies.test_tuning import overconfident_reads


def test_folds_are_stratified_and_seeded() -> None:
    labels = ["a"] * 30 + ["b"] * 12 + ["c"] * 5
    folds = stratified_folds(labels, n_folds=5, seed=3)
    assert sorted(set(folds.tolist())) == [0, 1, 2, 3, 4]
    for k in range(5):  # every class lands in every fold, so each out-of-fold model saw it
        assert {label for label, f in zip(labels, folds, strict=True) if f == k} == {"a", "b", "c"}
    assert (stratified_folds(labels, n_folds=5, seed=3) == folds).all()
    assert not (stratified_folds(labels, n_folds=5, seed=4) == folds).all()


@pytest.mark.parametrize("k", [1, 6])
def test_k_outside_two_and_the_smallest_class_is_refused(k: int) -> None:
    labels = ["a"] * 30 + ["b"] * 5
    with pytest.raises(ValueError, match=r"n_folds must be between 2 and 5 \(the smallest class, "
                                         r"'b', has 5 rows\)"):
        check_n_folds(k, labels)
    assert check_n_folds(5, labels) == 5


def test_fold_column_must_number_the_folds() -> None:
    assert check_folds(np.array([0, 1, 1, 0]), n_samples=4) == 2
    with pytest.raises(ValueError, match="folds must number"):
        check_folds(np.array([0, 2, 2, 0]), n_samples=4)
    with pytest.raises(ValueError, match="folds must number"):
        check_folds(np.zeros(4, dtype=int), n_samples=4)
    with pytest.raises(ValueError, match="must be 4 integers"):
        check_folds(np.array([0.0, 1.0, 1.0, 0.0]), n_samples=4)


def test_each_row_is_calibrated_by_a_calibrator_fit_outside_its_fold() -> None:
    proba, y = overconfident_reads(600, seed=5)
    folds = stratified_folds(y.tolist(), n_folds=3, seed=0)
    out = crossfit_calibrated(proba, y, folds, calibrator="temperature")
    for k in range(3):
        inside = folds == k
        by_hand = make_calibrator("temperature").fit(proba[~inside], y[~inside])
        np.testing.assert_allclose(out[inside], by_hand.transform(proba[inside]))
    fit_on_all = make_calibrator("temperature").fit(proba, y).transform(proba)
    assert not np.allclose(out, fit_on_all)


def test_crossfit_uses_every_row_and_keeps_the_promise_on_fresh_reads() -> None:
    proba, y = overconfident_reads(4000, seed=0)
    folds = stratified_folds(y.tolist(), n_folds=5, seed=0)
    result = Policy(calibrator="temperature", target_accuracy=0.9, delta=0.05).fit(
        proba, y, folds=folds)
    assert result.n_folds_ == 5 and result.risk_.n == 4000 and result.n_calibration_ == 4000
    assert result.risk_.bound >= 0.9
    split = Policy(calibrator="temperature", target_accuracy=0.9,
                             delta=0.05).fit(proba, y)
    assert split.risk_.n == 2000  # the split path spends half the rows on the calibrator
    fresh, y_fresh = overconfident_reads(20000, seed=1)
    metrics = evaluate(result, tuple("abcde"), fresh, y_fresh, n_resamples=20)
    assert metrics["accepted_accuracy"] >= 0.9


def test_crossfit_violation_rate_on_fresh_reads_is_within_delta() -> None:
    """60 tunings on independent synthetic draws: with delta 0.2 the expected number of
    violations is at most 12; more than 20 would be a 1-in-200 event (binomial tail)."""
    fresh, y_fresh = overconfident_reads(20000, seed=99)
    violations = 0
    for seed in range(60):
        proba, y = overconfident_reads(800, seed=seed + 100)
        folds = stratified_folds(y.tolist(), n_folds=4, seed=seed)
        result = Policy(calibrator="temperature", target_accuracy=0.85,
                                  delta=0.2).fit(proba, y, folds=folds)
        if result.risk_.threshold is None:
            continue
        calibrated = result.calibrator_.transform(fresh)
        answers = fresh.argmax(axis=1)
        accepted = calibrated[np.arange(len(answers)), answers] >= result.risk_.threshold
        violations += (answers[accepted] == y_fresh[accepted]).mean() < 0.85
    assert violations <= 20
