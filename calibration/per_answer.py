"""Accepted accuracy per answer: what a caller who receives a given answer can rely on, with a
Clopper-Pearson interval per answer, worst first (``slotgate eval`` and ``slotgate monitor``).
A policy's overall promise can hold while a few answers sit well below it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import beta

from calibration.validation import check_fraction


@dataclass(frozen=True, slots=True)
class AnswerAccuracy:
    """One answer's accepted, labelled decisions: ``n`` of them, ``correct`` right."""

    answer: str
    n: int
    correct: int
    lower: float  # Clopper-Pearson bounds at ``level``
    upper: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else float("nan")

    def as_dict(self) -> dict[str, object]:
        return {"answer": self.answer, "n": self.n, "correct": self.correct,
                "accuracy": self.accuracy, "lower": self.lower, "upper": self.upper}


class PerAnswerTally:
    """Counts per answer, fed one labelled accepted decision at a time (a streamed log), or all
    at once (``per_answer_accuracy``)."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}  # answer -> [n, correct]

    def add(self, answer: str, correct: bool) -> None:
        counts = self._counts.setdefault(answer, [0, 0])
        counts[0] += 1
        counts[1] += int(correct)

    def __len__(self) -> int:
        return len(self._counts)

    def table(self, *, level: float = 0.95) -> list[AnswerAccuracy]:
        """Worst first: lowest accuracy, then the one with more evidence (a narrower interval)
        first, then by name so equal rows keep one order."""
        answers = list(self._counts)
        n = np.array([self._counts[a][0] for a in answers], dtype=np.float64)
        k = np.array([self._counts[a][1] for a in answers], dtype=np.float64)
        lower, upper = clopper_pearson(k, n, level=level)
        rows = [AnswerAccuracy(a, int(n_i), int(k_i), float(lo), float(hi))
                for a, n_i, k_i, lo, hi in zip(answers, n, k, lower, upper, strict=True)]
        return sorted(rows, key=lambda r: (r.accuracy, -r.n, r.answer))


def clopper_pearson(k: np.ndarray[Any, np.dtype[np.float64]],
                    n: np.ndarray[Any, np.dtype[np.float64]], *, level: float = 0.95
                    ) -> tuple[np.ndarray[Any, np.dtype[np.float64]],
                               np.ndarray[Any, np.dtype[np.float64]]]:
    """The exact (Clopper-Pearson) two-sided interval of ``k`` successes in ``n``, for many
    proportions in one call: the beta quantiles scipy's ``binomtest(...).proportion_ci(
    method="exact")`` (``calibration.metrics.proportion_ci``) computes one at a time, ~20 ms
    each under load, so 77 answers cost a second there. (0, 1) where ``n`` is 0."""
    check_fraction(level, name="level", low_open=True, high_open=True)
    alpha = 1.0 - level
    with np.errstate(invalid="ignore", divide="ignore"):
        lower = np.where(k > 0, beta.ppf(alpha / 2, k, n - k + 1), 0.0)
        upper = np.where(k < n, beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    return np.nan_to_num(lower, nan=0.0), np.nan_to_num(upper, nan=1.0)


def per_answer_accuracy(answers: Sequence[str] | Iterable[str], correct: Iterable[bool], *,
                        level: float = 0.95) -> list[AnswerAccuracy]:
    """The per-answer table of accepted decisions: ``answers[i]`` what decision i answered,
    ``correct[i]`` whether it was right. Worst first."""
    tally = PerAnswerTally()
    answers, correct = list(answers), list(correct)
    if len(answers) != len(correct):
        raise ValueError(f"answers has {len(answers)} values but correct has {len(correct)}")
    for answer, ok in zip(answers, correct, strict=True):
        tally.add(str(answer), bool(ok))
    return tally.table(level=level)
