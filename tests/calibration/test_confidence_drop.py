"""The one-sided drift test: at most alpha false alarms while confidences are exchangeable with
the reference, none when they are surer (a sharper served model, confident traffic), where the
two-sided test alarms; lower confidences are still caught."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.monitoring import ConfidenceDropTest
from tests.calibration.conformal_drift import ConformalDriftTest


def alarm_rate(make: type[ConformalDriftTest], reference: np.ndarray, draw: object,
               runs: int, n: int) -> float:
    rng = np.random.default_rng(7)
    alarms = 0
    for seed in range(runs):
        test = make(reference, alpha=0.05, seed=seed)
        for c in draw(rng, n):  # type: ignore[operator]
            if test.update(float(c)):
                break
        alarms += test.alarm
    return alarms / runs


def test_exchangeable_confidences_alarm_at_most_alpha() -> None:
    reference = np.random.default_rng(1).beta(6, 1, size=1000)
    rate = alarm_rate(ConfidenceDropTest, reference, lambda rng, n: rng.beta(6, 1, size=n),
                      runs=60, n=1500)
    assert rate <= 0.12  # Ville: <= 0.05 in expectation; 0.12 leaves room for noise


def test_surer_confidences_never_alarm_where_the_two_sided_test_does() -> None:
    reference = np.random.default_rng(1).beta(6, 1, size=1000)
    sharper = lambda rng, n: rng.beta(9, 1, size=n)  # stochastically larger
    assert alarm_rate(ConformalDriftTest, reference, sharper, runs=20, n=1500) >= 0.9
    assert alarm_rate(ConfidenceDropTest, reference, sharper, runs=20, n=1500) == 0.0
    test = ConfidenceDropTest(reference)
    for _ in range(5000):  # the same confident value, over and over
        test.update(0.999)
    assert not test.alarm and test.log_value < 0


def test_lower_confidences_are_caught() -> None:
    rng = np.random.default_rng(2)
    reference = rng.beta(6, 1, size=1000)
    delays = []
    for seed in range(10):
        test = ConfidenceDropTest(reference, alpha=0.05, seed=seed)
        shifted = np.where(rng.random(3000) < 0.3, rng.beta(2, 2, size=3000),
                           rng.beta(6, 1, size=3000))
        for i, c in enumerate(shifted):
            if test.update(float(c)):
                delays.append(i + 1)
                break
    assert len(delays) == 10 and np.median(delays) < 1000


def test_stakes_must_keep_every_bet_non_negative() -> None:
    with pytest.raises(ValueError, match="stakes"):
        ConfidenceDropTest([0.5], stakes=(0.0, 3.0))


def test_the_accuracy_shortfall_test_holds_alpha_at_the_target_and_catches_a_drop() -> None:
    from calibration.monitoring import AccuracyShortfallTest

    rng = np.random.default_rng(3)
    alarms = 0
    for _ in range(100):  # accuracy exactly at the target: the hardest null
        test = AccuracyShortfallTest(0.95, alpha=0.05)
        for c in rng.random(2000) < 0.95:
            if test.update(bool(c)):
                break
        alarms += test.alarm
    assert alarms / 100 <= 0.1  # Ville: <= 0.05 in expectation
    needed = []
    for _ in range(20):  # 87% right against 95%: caught within a couple of hundred labels
        test = AccuracyShortfallTest(0.95, alpha=0.025)
        for n, c in enumerate(rng.random(2000) < 0.87, start=1):
            if test.update(bool(c)):
                needed.append(n)
                break
    assert len(needed) == 20 and np.median(needed) < 200
