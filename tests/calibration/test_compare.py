"""Paired comparison: counts add up and the p-value is scipy's exact two-sided binomial test."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from calibration import paired_comparison


def test_counts_and_exact_mcnemar() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(size=500) < 0.8
    b = rng.uniform(size=500) < 0.7
    result = paired_comparison(a, b)
    assert result.n == 500
    assert result.both_correct + result.a_only + result.b_only + result.neither == 500
    assert result.a_only == int(np.sum(a & ~b)) and result.b_only == int(np.sum(b & ~a))
    assert result.agreement == pytest.approx(np.mean(a == b))
    assert result.accuracy_a == pytest.approx(a.mean())
    expected = binomtest(result.a_only, result.a_only + result.b_only, 0.5).pvalue
    assert result.p_value == pytest.approx(expected, rel=1e-12)
    assert result.p_value < 0.05  # 0.8 against 0.7 on 500 rows is a real difference


def test_symmetric_in_its_arguments() -> None:
    a = np.array([1, 1, 0, 1, 0, 1, 1, 0])
    b = np.array([1, 0, 0, 0, 1, 0, 1, 1])
    forward, backward = paired_comparison(a, b), paired_comparison(b, a)
    assert (forward.a_only, forward.b_only) == (backward.b_only, backward.a_only)
    assert forward.p_value == pytest.approx(backward.p_value)


def test_no_discordant_pairs_gives_p_one() -> None:
    result = paired_comparison([True, False, True], [True, False, True])
    assert result.p_value == 1.0 and result.agreement == 1.0


def test_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="correct_b has 2 values"):
        paired_comparison([True, False, True], [True, False])
    with pytest.raises(ValueError, match="correct_a is empty"):
        paired_comparison([], [])
