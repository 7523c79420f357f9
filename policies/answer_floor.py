"""Per-answer bars (``slotgate tune --per-answer-floor F``): each answer gets its own threshold so
that the accuracy of the accepted answers *of that option* is at least F, for every option at once,
with probability at least 1 - delta over the draw of the threshold rows.

Method: for each option k, the rows whose answer (raw argmax) is k are a sample of "answers k";
the same fixed-sequence search the global threshold uses (``guaranteed_threshold``) runs on them
at target F and level delta / K, where K is the number of options answered at least once on the
threshold rows (Bonferroni over the options: the chance that any one of the K claims is false is
at most K * delta / K = delta). K depends on the answers only, never on whether they were right,
so given the answers it is fixed before the tests look at correctness. An option never answered on
the threshold rows has no evidence: its answers escalate. The bar applied is the larger of the
global guaranteed threshold and the option's own (None, escalate, when either is None), so the
global promise's accepted set only loses rows. What it costs in coverage on BANKING77 is in
docs/calibration.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from calibration.risk import RiskControlResult, guaranteed_threshold


@dataclass(frozen=True)
class AnswerBar:
    """One option's bar: ``bar`` is what the rule applies (None: escalate this answer), ``own``
    the option's own threshold test (None: the option was never answered on the rows)."""

    option: str
    bar: float | None
    own: RiskControlResult | None


def per_answer_bars(answers: NDArray[np.int64], confidence: NDArray[np.float64],
                    correct: NDArray[np.bool_], *, options: Sequence[str], floor: float,
                    delta: float, threshold: float | None) -> list[AnswerBar]:
    """The bar of every option, in ``options`` order (see the module docstring for the method)."""
    answered = np.unique(answers)
    level = delta / max(1, len(answered))
    bars = []
    for k, name in enumerate(options):
        rows = answers == k
        if not rows.any():
            bars.append(AnswerBar(name, None, None))
            continue
        # min_accepted=1: an answer has a few hundred rows at most; the search still starts
        # where an all-correct sample could pass (its own rule), so no test is wasted.
        own = guaranteed_threshold(confidence[rows], correct[rows], target_accuracy=floor,
                                   delta=level, min_accepted=1)
        bar = None if threshold is None or own.threshold is None else max(threshold, own.threshold)
        bars.append(AnswerBar(name, bar, own))
    return bars
