"""The two-sided baseline (``tests/calibration/conformal_drift.py``): its martingale is MAPIE's
jumper on exact conformal p-values, its p-values are uniform on exchangeable streams, it rarely
alarms on them and soon after a shift."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kstest

from tests.calibration.conformal_drift import ConformalDriftTest


def test_martingale_equals_mapies_jumper_on_the_same_p_values() -> None:
    from mapie.exchangeability_testing import OnlineMartingaleTest

    rng = np.random.default_rng(0)
    p_values = np.concatenate([rng.uniform(size=300), rng.uniform(0, 0.3, size=300)])
    ours = ConformalDriftTest([0.5], alpha=0.05, jump=0.01)
    theirs = OnlineMartingaleTest(test_level=0.05, jump_size=0.01, warn=False)
    for p in p_values:
        ours.bet(float(p))
        expected = theirs.update_simple_jumper_martingale(float(p))
        assert ours.log_value == pytest.approx(np.log(expected), rel=1e-9, abs=1e-9)
    assert ours.alarm and ours.alarm_at is not None
    first_crossing = 1 + int(np.argmax(np.asarray(theirs.martingale_value_history) >= 20.0))
    assert ours.alarm_at == first_crossing


def test_p_values_are_uniform_when_the_stream_looks_like_the_reference() -> None:
    rng = np.random.default_rng(1)
    test = ConformalDriftTest(rng.beta(5, 1, size=500).round(3), seed=1)  # many ties
    p_values = []
    for c in rng.beta(5, 1, size=2000).round(3):
        p_values.append(test.p_value(float(c)))
        test.update(float(c))
    assert kstest(p_values, "uniform").pvalue > 0.01


def test_false_alarm_rate_stays_near_alpha_and_a_shift_is_caught_fast() -> None:
    rng = np.random.default_rng(2)
    reference = rng.beta(6, 1, size=1000)
    alarms = 0
    for seed in range(60):
        test = ConformalDriftTest(reference, alpha=0.05, seed=seed)
        for c in rng.beta(6, 1, size=1500):
            test.update(float(c))
        alarms += test.alarm
    assert alarms / 60 <= 0.12  # Ville: <= 0.05 in expectation; 0.12 leaves room for noise
    delays = []
    for seed in range(10):
        test = ConformalDriftTest(reference, alpha=0.05, seed=seed)
        shifted = np.where(rng.random(3000) < 0.3, rng.beta(2, 2, size=3000),
                           rng.beta(6, 1, size=3000))
        for i, c in enumerate(shifted):
            if test.update(float(c)):
                delays.append(i + 1)
                break
    assert len(delays) == 10 and np.median(delays) < 500


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ValueError, match="alpha"):
        ConformalDriftTest([0.5], alpha=1.5)
    with pytest.raises(ValueError, match="reference is empty"):
        ConformalDriftTest([])
    with pytest.raises(ValueError, match="confidence must be in"):
        ConformalDriftTest([0.5]).update(1.2)
