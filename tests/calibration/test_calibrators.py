"""Calibrators: they fix a known miscalibration on held-out rows, keep rows summing to 1, survive
JSON exactly, and guard their inputs and their fitted state."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from calibration import (
    HistogramBinning,
    IdentityCalibrator,
    IsotonicCalibrator,
    TemperatureScaling,
    calibrator_from_dict,
    ece,
    make_calibrator,
    nll,
)
from tests.calibration.conftest import overconfident

KINDS = ["temperature", "isotonic", "histogram", "none"]


def test_make_calibrator_names_the_kinds() -> None:
    assert isinstance(make_calibrator("temperature"), TemperatureScaling)
    assert isinstance(make_calibrator("isotonic"), IsotonicCalibrator)
    assert isinstance(make_calibrator("histogram", n_bins=5), HistogramBinning)
    assert isinstance(make_calibrator("none"), IdentityCalibrator)
    with pytest.raises(ValueError, match="name must be one of"):
        make_calibrator("platt")


def test_temperature_recovers_the_sharpening(fit_and_test) -> None:
    proba, y_true, _, _ = fit_and_test
    calibrator = TemperatureScaling().fit(proba, y_true)
    assert calibrator.temperature_ == pytest.approx(3.0, rel=0.1)


@pytest.mark.parametrize("kind", ["temperature", "isotonic", "histogram"])
def test_calibration_lowers_error_on_held_out_rows(kind: str, fit_and_test) -> None:
    proba, y_true, proba_test, y_test = fit_and_test
    calibrated = make_calibrator(kind).fit(proba, y_true).transform(proba_test)
    assert ece(calibrated, y_test) < 0.5 * ece(proba_test, y_test)
    assert nll(calibrated, y_test) < nll(proba_test, y_test)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_sum_to_one_and_stay_in_range(kind: str, fit_and_test) -> None:
    proba, y_true, proba_test, _ = fit_and_test
    # Rows with a zero and a one-hot row stress the clipping and the "nothing else left" branch.
    extreme = np.array([[1.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0]])
    out = make_calibrator(kind).fit(proba, y_true).transform(np.vstack([proba_test, extreme]))
    assert out.shape == (len(proba_test) + 2, 5)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(out >= 0.0) and np.all(out <= 1.0)


@pytest.mark.parametrize("kind", KINDS)
def test_json_round_trip_gives_identical_transform(kind: str, fit_and_test) -> None:
    proba, y_true, proba_test, _ = fit_and_test
    calibrator = make_calibrator(kind).fit(proba, y_true)
    data = json.loads(json.dumps(calibrator.to_dict()))
    assert data["kind"] == kind
    restored = calibrator_from_dict(data)
    assert type(restored) is type(calibrator)
    np.testing.assert_array_equal(restored.transform(proba_test), calibrator.transform(proba_test))


def test_top_label_calibrators_set_the_raw_top_option(fit_and_test) -> None:
    proba, y_true, proba_test, _ = fit_and_test
    for calibrator in (IsotonicCalibrator(), HistogramBinning()):
        out = calibrator.fit(proba, y_true).transform(proba_test)
        rows = np.arange(len(proba_test))
        top = np.argmax(proba_test, axis=1)
        others = proba_test.copy()
        others[rows, top] = 0.0
        scaled = out.copy()
        scaled[rows, top] = 0.0
        # The other options keep their proportions: out_j = p_j * (1 - c) / (1 - p_top).
        ratio = (1.0 - out[rows, top]) / others.sum(axis=1)
        np.testing.assert_allclose(scaled, others * ratio[:, None], atol=1e-12)


def test_temperature_is_invariant_to_relabelling(fit_and_test) -> None:
    proba, y_true, proba_test, _ = fit_and_test
    permutation = np.random.default_rng(3).permutation(proba.shape[1])
    inverse = np.argsort(permutation)
    base = TemperatureScaling().fit(proba, y_true)
    # Column j of the relabelled problem is old option permutation[j]; labels move with it.
    relabelled = TemperatureScaling().fit(proba[:, permutation], inverse[y_true])
    assert relabelled.temperature_ == pytest.approx(base.temperature_, rel=1e-6)
    np.testing.assert_allclose(
        relabelled.transform(proba_test[:, permutation]),
        base.transform(proba_test)[:, permutation],
        atol=1e-6,
    )


def test_histogram_quantile_bins_hold_similar_counts() -> None:
    proba, y_true = overconfident(3000, seed=4)
    calibrator = HistogramBinning(n_bins=10).fit(proba, y_true)
    top = proba.max(axis=1)
    counts = np.bincount(np.searchsorted(calibrator.bin_edges_[1:-1], top, side="right"))
    assert len(calibrator.bin_values_) == 10
    assert counts.min() >= 0.8 * 300 and counts.max() <= 1.2 * 300


@pytest.mark.parametrize("kind", ["temperature", "isotonic", "histogram"])
def test_transform_before_fit_says_so(kind: str) -> None:
    with pytest.raises(NotFittedError, match="not fitted yet"):
        make_calibrator(kind).transform(np.array([[0.5, 0.5]]))
    with pytest.raises(NotFittedError, match="not fitted yet"):
        make_calibrator(kind).to_dict()


def test_identity_needs_no_fit() -> None:
    proba = np.array([[0.2, 0.8], [0.6, 0.4]])
    np.testing.assert_allclose(IdentityCalibrator().transform(proba), proba)


@pytest.mark.parametrize(
    ("proba", "y_true", "message"),
    [
        ([[0.5, 0.6], [0.5, 0.5]], [0, 1], "rows of proba must sum to 1"),
        ([[1.2, -0.2], [0.5, 0.5]], [0, 1], r"proba has values outside \[0, 1\]"),
        ([[0.5, 0.5], [0.5, 0.5]], [0, 2], r"y_true has labels outside \[0, n_options\)"),
        ([[0.5, 0.5], [0.5, 0.5]], [0], "y_true has 1 labels but proba has 2 rows"),
        ([0.5, 0.5], [0], "proba must be 2-D"),
        ([[0.5, 0.5], [np.nan, 0.5]], [0, 1], "proba has non-finite values"),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
def test_fit_validation_names_the_argument(kind: str, proba, y_true, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_calibrator(kind).fit(np.asarray(proba), np.asarray(y_true))


def test_from_dict_rejects_a_foreign_kind(fit_and_test) -> None:
    proba, y_true, _, _ = fit_and_test
    data = TemperatureScaling().fit(proba, y_true).to_dict()
    with pytest.raises(ValueError, match="expected 'isotonic'"):
        IsotonicCalibrator.from_dict(data)
    with pytest.raises(ValueError, match="kind 'platt'"):
        calibrator_from_dict({**data, "kind": "platt"})
    with pytest.raises(ValueError, match="lacks state"):
        calibrator_from_dict({**data, "state": {}})
