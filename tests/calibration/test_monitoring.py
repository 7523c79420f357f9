"""The production monitors: the accuracy sequence is MAPIE's CM-EB bound kept incrementally,
covers the truth at every moment and falls below a target the stream misses; the change
detector sums test martingales started at every step and stays under its run-length bound."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.monitoring import (
    TRAFFIC_BETS,
    AccuracySequence,
    AccuracyShortfallTest,
    Bet,
    ConfidenceDropDetector,
    ConfidenceDropTest,
    reference_summary,
)
from calibration.state import DamagedState


def test_a_reference_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        reference_summary([0.2, 1.3], threshold=0.5)


def test_reference_summary_keeps_sorted_rounded_confidences_and_the_accept_share() -> None:
    confidence = np.random.default_rng(3).uniform(size=8000)
    summary = reference_summary(confidence, threshold=0.75, max_rows=5000)
    assert summary["n"] == 5000 == len(summary["confidence"])
    assert summary["confidence"] == sorted(summary["confidence"])
    assert summary["accept_share"] == pytest.approx(np.mean(confidence >= 0.75))
    assert reference_summary([0.9], threshold=None)["accept_share"] == 0.0


def test_accuracy_sequence_matches_mapies_cm_eb_lower_bound() -> None:
    from mapie.exchangeability_testing.bounds import conjugate_mixture_empirical_bernstein_bound

    x = np.random.default_rng(4).random(120) < 0.85
    sequence = AccuracySequence(alpha=0.05, v_opt=10.0)
    lowers = [sequence.update(bool(v)).lower for v in x]
    expected = conjugate_mixture_empirical_bernstein_bound(x.astype(float), v_opt=10.0,
                                                           alpha=0.05, bound_side="lower")
    np.testing.assert_allclose(lowers, expected, atol=1e-5)


def test_accuracy_sequence_covers_the_truth_at_every_moment() -> None:
    rng = np.random.default_rng(5)
    misses = 0
    for _ in range(100):
        sequence = AccuracySequence(alpha=0.1)
        for v in rng.random(400) < 0.93:
            b = sequence.update(bool(v))
            if not b.lower <= 0.93 <= b.upper:
                misses += 1
                break
    assert misses / 100 <= 0.1


def test_accuracy_sequence_falls_below_a_missed_target() -> None:
    sequence = AccuracySequence(alpha=0.05)
    rng = np.random.default_rng(6)
    n = 0
    while not sequence.below(0.95):
        sequence.update(bool(rng.random() < 0.75))
        n += 1
        assert n < 500
    assert sequence.upper < 0.95 and sequence.bounds().n == n


def test_detector_is_the_sum_of_test_martingales_started_at_every_step() -> None:
    stakes = (0.1, 0.5, 1.0)
    p_values = np.random.default_rng(7).uniform(0, 0.8, size=60)
    detector = ConfidenceDropDetector([0.5], arl=1e6, stakes=stakes)
    for t, p in enumerate(p_values, start=1):
        detector.bet(float(p))
        bets = 1.0 + np.outer(0.5 - p_values[:t], stakes)  # (t, stakes)
        started = [np.prod(bets[k:], axis=0) for k in range(t)]  # a martingale from each step
        expected = float(np.mean(np.sum(started, axis=0)))
        assert detector.log_value == pytest.approx(np.log(expected), rel=1e-9)


def test_detector_false_alarms_within_n_steps_stay_under_n_over_arl() -> None:
    rng = np.random.default_rng(8)
    reference = rng.beta(6, 1, size=500)
    alarms = 0
    for seed in range(200):  # exchangeable: n / arl = 400 / 8,000 = 0.05
        detector = ConfidenceDropDetector(reference, arl=8_000.0, seed=seed)
        alarms += any(detector.update(float(c)) for c in rng.beta(6, 1, size=400))
    assert alarms / 200 <= 0.1  # <= 0.05 in expectation; 0.1 leaves room for noise


def test_detector_ignores_surer_confidences_and_forgets_a_long_clean_prefix() -> None:
    rng = np.random.default_rng(9)
    reference = rng.beta(6, 1, size=1000)
    detector = ConfidenceDropDetector(reference, arl=1e5)
    for _ in range(3000):  # the same confident value, over and over
        detector.update(0.999)
    assert not detector.alarm and detector.log_value < detector.threshold / 2
    detector_delays, martingale_delays = [], []
    for seed in range(8):  # 3,000 clean rows, then 30% of confidences from a lower distribution
        clean = rng.beta(6, 1, size=3000)
        shifted = np.where(rng.random(3000) < 0.3, rng.beta(2, 2, size=3000),
                           rng.beta(6, 1, size=3000))
        for make, delays in ((lambda s: ConfidenceDropDetector(reference, arl=1e5, seed=s),
                              detector_delays),
                             (lambda s: ConfidenceDropTest(reference, alpha=0.025, seed=s),
                              martingale_delays)):
            test = make(seed)
            assert not any(test.update(float(c)) for c in clean)
            delays.append(next((i for i, c in enumerate(shifted) if test.update(float(c))), 3000))
    assert max(detector_delays) < 3000
    assert np.median(detector_delays) < np.median(martingale_delays)


def test_detector_resumes_where_it_stopped() -> None:
    p_values = np.random.default_rng(10).uniform(0, 0.9, size=200)
    whole = ConfidenceDropDetector([0.5], arl=1e4)
    first = ConfidenceDropDetector([0.5], arl=1e4)
    for p in p_values:
        whole.bet(float(p))
    for p in p_values[:120]:
        first.bet(float(p))
    second = ConfidenceDropDetector([0.5], arl=1e4)
    second.resume(first.state())
    for p in p_values[120:]:
        second.bet(float(p))
    assert second.log_value == pytest.approx(whole.log_value, rel=1e-12)
    assert second.alarm_at == whole.alarm_at and second.n == 200
    with pytest.raises(ValueError, match="detector"):
        second.resume({**first.state(), "detector": [1.0]})
    with pytest.raises(ValueError, match="arl"):
        ConfidenceDropDetector([0.5], arl=1.0)


def test_rescaled_wealths_resume_and_unreachable_ones_are_refused() -> None:
    """Long runs rescale the wealth (its log kept apart): such a state resumes exactly, while
    one its bets could not have reached is refused naming the field."""
    shortfall = AccuracyShortfallTest(0.95, alpha=0.0125)
    for _ in range(30_000):  # right answers: the wealth shrinks past 1e-100
        shortfall.update(True)
    detector = ConfidenceDropDetector([0.5] * 10, arl=1e4, bets=TRAFFIC_BETS)
    for _ in range(200):  # the lowest ranks: the detector grows past 1e100
        detector.bet(0.0)
    assert shortfall.state()["log_scale"] < 0 < detector.state()["log_scale"]
    for test, again in ((shortfall, AccuracyShortfallTest(0.95, alpha=0.0125)),
                        (detector, ConfidenceDropDetector([0.5] * 10, arl=1e4, bets=TRAFFIC_BETS))):
        state = json.loads(json.dumps(test.state(), allow_nan=False))
        again.resume(state)
        assert again.state() == test.state() and again.log_value == test.log_value
    fresh = AccuracyShortfallTest(0.95, alpha=0.0125)
    with pytest.raises(DamagedState, match="log_scale"):  # 10 bets cannot reach e^100
        fresh.resume({**fresh.state(), "n": 10, "log_scale": 100.0, "alarm_at": 1})
    with pytest.raises(DamagedState, match="alarm_at"):  # past the alarm level, no alarm
        fresh.resume({**fresh.state(), "n": 100, "log_scale": 8.0})
    with pytest.raises(DamagedState, match="log_scale"):  # an untripped detector's scale
        again.resume({**detector.state(), "alarm_at": None})
    assert fresh.n == 0 and fresh.log_value == 0.0  # nothing taken


def test_every_traffic_bet_has_mean_one_on_uniform_p_values_and_at_most_one_on_larger() -> None:
    grid = (np.arange(40_000) + 0.5) / 40_000  # midpoints: the integral over [0, 1]
    for bet in TRAFFIC_BETS:
        factors = np.array([bet.factor(float(p)) for p in grid])
        assert factors.min() >= 0.0
        assert factors.mean() == pytest.approx(1.0, abs=2e-3)  # the floor at 1e-9 lowers it
        assert np.array([bet.factor(float(p)) for p in np.sqrt(grid)]).mean() < 1.0  # surer


def test_bets_outside_their_range_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="stake of a power bet"):
        Bet("power", 3.5, 0.7)  # 1 + 3.5 (0.7 - 1) < 0 at p = 1
    with pytest.raises(ValueError, match="shape of a below bet"):
        Bet("below", 0.1, 1.0)
    with pytest.raises(ValueError, match="kind"):
        Bet("square", 0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bets"):
        ConfidenceDropDetector([0.5], arl=10.0, bets=())


def test_power_bets_trip_sooner_than_linear_ones_on_a_few_very_low_ranks() -> None:
    """A quarter of the confidences far below the reference (a class the model never learnt),
    the rest like it: the traffic bets trip sooner than linear stakes up to 1."""
    rng = np.random.default_rng(11)
    reference = rng.beta(6, 1, size=1000)
    delays: dict[str, list[int]] = {"power": [], "linear": []}
    for seed in range(6):
        stream = np.where(rng.random(2000) < 0.25, rng.beta(1, 6, size=2000),
                          rng.beta(6, 1, size=2000))
        for name, bets in (("power", TRAFFIC_BETS), ("linear", None)):
            detector = ConfidenceDropDetector(reference, arl=1e5, seed=seed, bets=bets)
            delays[name].append(next((i for i, c in enumerate(stream)
                                      if detector.update(float(c))), 2000))
    assert max(delays["power"]) < 2000
    assert np.median(delays["power"]) < np.median(delays["linear"])
