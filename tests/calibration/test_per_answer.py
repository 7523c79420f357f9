"""Accepted accuracy per answer: worst first, each with the exact (Clopper-Pearson) interval,
the vectorised one equal to scipy's one-at-a-time ``binomtest`` interval."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.metrics import proportion_ci
from calibration.per_answer import clopper_pearson, per_answer_accuracy


def test_the_vectorised_interval_is_scipys_exact_interval() -> None:
    rng = np.random.default_rng(0)
    n = rng.integers(0, 300, size=60).astype(np.float64)
    k = np.floor(rng.uniform(0, 1, size=60) * (n + 1)).clip(max=n)
    for level in (0.9, 0.95):
        lower, upper = clopper_pearson(k, n, level=level)
        expected = np.array([proportion_ci(int(a), int(b), level) for a, b in zip(k, n)])
        np.testing.assert_allclose(lower, expected[:, 0], atol=1e-9)
        np.testing.assert_allclose(upper, expected[:, 1], atol=1e-9)
    with pytest.raises(ValueError, match="level"):
        clopper_pearson(k, n, level=1.0)


def test_per_answer_table_is_worst_first_with_intervals() -> None:
    answers = ["a"] * 50 + ["b"] * 40 + ["c"] * 10
    correct = [True] * 50 + [True] * 30 + [False] * 10 + [True] * 9 + [False]
    table = per_answer_accuracy(answers, correct)
    assert [(r.answer, r.n, r.correct) for r in table] == [("b", 40, 30), ("c", 10, 9),
                                                           ("a", 50, 50)]
    assert all(r.lower <= r.accuracy <= r.upper for r in table)
    assert table[2].upper == 1.0 and table[0].as_dict()["accuracy"] == 0.75
    with pytest.raises(ValueError, match="answers has 2 values"):
        per_answer_accuracy(["a", "b"], [True])
