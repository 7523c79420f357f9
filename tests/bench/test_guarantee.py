"""bench/guarantee's threshold choosers on synthetic calibrated confidences: MAPIE is asked for
accepted accuracy >= target (precision of "accept"), and both it and slotgate's bound keep the
promise on fresh rows; the outcome counts a violation only when accepted accuracy misses."""

from __future__ import annotations

import numpy as np
import pytest

from bench import guarantee_methods as gm


def calibrated_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Confidences whose accuracy is the confidence itself (perfectly calibrated)."""
    rng = np.random.default_rng(seed)
    confidence = rng.beta(6, 1, size=n)
    return confidence, rng.random(n) < confidence


@pytest.mark.parametrize("fixed_sequence", [False, True])
def test_mapie_and_slotgate_keep_the_promise_on_fresh_rows(fixed_sequence: bool) -> None:
    conf, correct = calibrated_rows(3000, seed=1)
    fresh_conf, fresh_correct = calibrated_rows(200_000, seed=2)
    scored = gm.Scored(conf, correct, fresh_conf, fresh_correct)
    mapie = gm.mapie_threshold(scored, target=0.9, delta=0.05, fixed_sequence=fixed_sequence)
    ours = gm.slotgate_threshold(scored, target=0.9, delta=0.05)
    assert mapie is not None and ours is not None
    for threshold in (mapie, ours):
        result = gm.outcome(scored, threshold, 0.9)
        assert result["accepted_accuracy"] >= 0.9 and not result["violated"]
        assert 0.0 < result["coverage"] < 1.0
    # Accepted accuracy (precision of "accept") at MAPIE's lambda, measured on the rows it saw,
    # is at least the target: the controller certified exactly that quantity.
    assert correct[conf >= mapie].mean() >= 0.9


def test_outcome_without_threshold_escalates_everything() -> None:
    conf, correct = calibrated_rows(100, seed=3)
    scored = gm.Scored(conf, correct, conf, correct)
    assert gm.outcome(scored, None, 0.9) == {"threshold": None, "coverage": 0.0,
                                             "accepted_accuracy": None, "violated": False,
                                             "tune_accepted_accuracy": None}
    missed = gm.outcome(scored, 0.0, 0.99)  # accept all: accuracy ~0.86 < 0.99
    assert missed["violated"] and missed["coverage"] == 1.0
