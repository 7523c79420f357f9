"""Tuning on synthetic reads: the split is fixed by the seed, the threshold rows are disjoint
from the calibration rows, the guarantee holds on fresh data, the budget is recorded."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from policies.evaluation import evaluate
from policies.fitting import split_rows
from policies.policy import Policy
from policies.rules import BudgetRule, ThresholdRule


def overconfident_reads(n: int, seed: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Reads whose labels are drawn from a softened version of themselves: overconfident."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 4, size=(n, 5))
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    soft = np.exp(logits / 1.5) / np.exp(logits / 1.5).sum(axis=1, keepdims=True)
    y_true = np.array([rng.choice(5, p=p) for p in soft])
    return proba, y_true


def test_split_is_seeded_and_disjoint() -> None:
    a, b = split_rows(100, calibration_fraction=0.3, seed=1)
    assert len(a) == 30 and len(b) == 70 and not set(a) & set(b)
    again = split_rows(100, calibration_fraction=0.3, seed=1)
    assert (again[0] == a).all()
    with pytest.raises(ValueError, match="too few"):
        split_rows(1, calibration_fraction=0.5, seed=0)


def test_tuned_threshold_meets_its_target_on_fresh_data() -> None:
    proba, y_true = overconfident_reads(4000, seed=0)
    result = Policy(calibrator="temperature", target_accuracy=0.9,
                              delta=0.05).fit(proba, y_true)
    assert isinstance(result.rule_, ThresholdRule) and result.risk_.threshold is not None
    assert result.risk_.bound >= 0.9
    assert result.n_calibration_ + result.risk_.n == 4000
    fresh, y_fresh = overconfident_reads(20000, seed=1)
    metrics = evaluate(result, tuple("abcde"), fresh, y_fresh, n_resamples=20)
    assert metrics["accepted_accuracy"] >= 0.9
    assert metrics["ece_after"] < metrics["ece_before"]
    assert 0 < metrics["coverage"] < 1
    assert metrics["escalation_rate"] == pytest.approx(1 - metrics["coverage"])


def test_unreachable_target_escalates_everything() -> None:
    proba, y_true = overconfident_reads(300, seed=2)
    result = Policy(calibrator="none", target_accuracy=1.0,
                              delta=0.05).fit(proba, y_true)
    assert result.risk_.threshold is None and result.risk_.coverage == 0.0
    assert result.rule_.verdict(("a", "b"), [1.0, 0.0], 0).accept is False


def test_budget_wraps_the_guaranteed_threshold_and_flags_a_conflict() -> None:
    proba, y_true = overconfident_reads(4000, seed=3)
    # 0.90: at 0.95 only the top 5% of these reads pass, which the three-walk search (each at
    # delta / 3, calibration/risk.py) no longer certifies; the budget conflict is the same.
    result = Policy(calibrator="temperature", target_accuracy=0.9, delta=0.05,
                              max_escalation=0.05, budget_window=200).fit(proba, y_true)
    assert isinstance(result.rule_, BudgetRule)
    assert result.rule_.base.to_dict()["threshold"] == result.risk_.threshold
    assert result.escalation_rate_ > 0.05 and result.budget_exceeded_
    assert result.budget_threshold_ is not None
    assert result.risk_.threshold is not None and result.budget_threshold_ < result.risk_.threshold
