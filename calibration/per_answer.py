"""Accepted accuracy per answer: what a caller who receives a given answer can rely on, with a
Clopper-Pearson interval per answer, worst first (``slotgate eval`` and ``slotgate monitor``).
A policy's overall promise can hold while a few answers sit well below it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from calibration.metrics import proportion_ci


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
        rows = [AnswerAccuracy(answer, n, k, *proportion_ci(k, n, level))
                for answer, (n, k) in self._counts.items()]
        return sorted(rows, key=lambda r: (r.accuracy, -r.n, r.answer))


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
