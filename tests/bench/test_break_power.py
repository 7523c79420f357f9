"""bench.break_power: labels to the watch's accuracy alarm, and the decisions they take at an
audit rate."""

from __future__ import annotations

import numpy as np

from bench.break_power import decisions_for, labels_to_alarm


def test_a_gross_break_alarms_within_a_few_labels_and_a_kept_promise_does_not() -> None:
    n = labels_to_alarm(0.5, target=0.95, alarm_alpha=0.05, cap=200, seed=0)
    assert n is not None and n < 30
    assert labels_to_alarm(0.99, target=0.95, alarm_alpha=0.05, cap=500, seed=0) is None


def test_decisions_per_label_follow_the_labelled_share() -> None:
    rng = np.random.default_rng(0)
    assert decisions_for(40, rate=1.0, rng=rng) == 40
    draws = [decisions_for(100, rate=0.08, rng=rng) for _ in range(200)]
    assert min(draws) >= 100 and abs(np.mean(draws) - 100 / 0.08) < 60
