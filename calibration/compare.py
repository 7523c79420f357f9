"""Paired comparison of two predictors on the same rows: agreement, the discordant pairs and the
exact McNemar test (a two-sided binomial test on who won the discordant pairs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import binomtest

from calibration.validation import check_correct


@dataclass(frozen=True)
class PairedComparison:
    """Counts over the ``n`` shared rows; ``agreement`` is the share where A and B are both right
    or both wrong; ``p_value`` is exact McNemar (1.0 when there are no discordant pairs)."""

    n: int
    agreement: float
    both_correct: int
    a_only: int
    b_only: int
    neither: int
    p_value: float

    @property
    def accuracy_a(self) -> float:
        return (self.both_correct + self.a_only) / self.n

    @property
    def accuracy_b(self) -> float:
        return (self.both_correct + self.b_only) / self.n

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "accuracy_a": self.accuracy_a, "accuracy_b": self.accuracy_b}


def paired_comparison(correct_a: ArrayLike, correct_b: ArrayLike) -> PairedComparison:
    """Compare per-row correctness of A and B (booleans or 0/1, same rows in the same order)."""
    a = check_correct(correct_a, n_samples=len(np.asarray(correct_a)), name="correct_a")
    if a.shape[0] == 0:
        raise ValueError("correct_a is empty: at least one row is needed")
    b = check_correct(correct_b, n_samples=a.shape[0], name="correct_b")
    a_only = int(np.sum(a & ~b))
    b_only = int(np.sum(~a & b))
    discordant = a_only + b_only
    # Under H0 (equal accuracy) each discordant pair is a fair coin; concordant pairs say nothing.
    p_value = 1.0 if discordant == 0 else float(binomtest(a_only, discordant, 0.5).pvalue)
    return PairedComparison(
        n=int(a.shape[0]),
        agreement=float(np.mean(a == b)),
        both_correct=int(np.sum(a & b)),
        a_only=a_only,
        b_only=b_only,
        neither=int(np.sum(~a & ~b)),
        p_value=p_value,
    )
