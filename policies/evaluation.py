"""Evaluating a tuned policy on fresh labelled reads, as the router would apply it: accuracy,
accepted accuracy (overall and per answer), coverage, ECE, each with a 95% interval."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from policies.guaranteed import GuaranteedPolicy

FloatArray = NDArray[np.float64]
# ``y_true`` of a row whose label is none of the options (``predict --allow-novel-labels``):
# never the answer, so always counted wrong.
NOVEL_LABEL = -2


def evaluate(policy: GuaranteedPolicy, options: tuple[str, ...], proba: FloatArray,
             y_true: NDArray[np.int64], *, n_resamples: int = 300, seed: int = 0
             ) -> dict[str, Any]:
    """Apply a policy row by row to labelled reads; metrics with 95% intervals
    (Clopper-Pearson for proportions, bootstrap for ECE) and ``per_answer``, worst first."""
    from calibration.metrics import bootstrap_ci, ece, proportion_ci
    from policies.types import OptionScores

    accepted = np.zeros(len(y_true), dtype=bool)
    calibrated = np.empty_like(proba)
    window = policy.escalation_window()  # the rows are a stream, as the router would see them
    for i, row in enumerate(proba):
        verdict, calibrated[i] = policy.decide(OptionScores(options, tuple(float(p) for p in row)),
                                               escalations=0 if window is None else window.escalations)
        if window is not None:
            window.record(verdict)
        accepted[i] = verdict.accept
    answers = proba.argmax(axis=1)
    correct = answers == y_true
    # Top-label ECE needs only whether the argmax was right: a novel row stands in as "another
    # option", so it counts wrong there too, without an index the calibration metrics refuse.
    scored = np.where(y_true == NOVEL_LABEL, (answers + 1) % proba.shape[1], y_true)
    n, n_accepted = len(y_true), int(accepted.sum())
    n_correct, n_accepted_correct = int(correct.sum()), int(correct[accepted].sum())

    def interval(k: int, m: int) -> list[float]:
        return list(proportion_ci(k, m))

    ece_before, ece_after = ece(proba, scored), ece(calibrated, scored)
    return {
        "n": n,
        "n_accepted": n_accepted,
        "n_novel": int((y_true == NOVEL_LABEL).sum()),
        "accuracy": n_correct / n,
        "accuracy_ci": interval(n_correct, n),
        "accepted_accuracy": n_accepted_correct / n_accepted if n_accepted else None,
        "accepted_accuracy_ci": interval(n_accepted_correct, n_accepted),
        "coverage": n_accepted / n,
        "coverage_ci": interval(n_accepted, n),
        "escalation_rate": 1.0 - n_accepted / n,
        "escalation_rate_ci": interval(n - n_accepted, n),
        "ece_before": ece_before,
        "ece_before_ci": list(bootstrap_ci(ece, proba, scored, n_resamples=n_resamples,
                                           seed=seed)),
        "ece_after": ece_after,
        "ece_after_ci": list(bootstrap_ci(ece, calibrated, scored, n_resamples=n_resamples,
                                          seed=seed)),
        "per_answer": per_answer(options, answers, accepted, correct),
    }


def per_answer(options: Sequence[str], answers: NDArray[np.int64], accepted: NDArray[np.bool_],
               correct: NDArray[np.bool_]) -> list[dict[str, Any]]:
    """Accepted accuracy of each answer a caller received, worst first, with its Clopper-Pearson
    95% interval (``calibration.per_answer``), and how often the answer was given at all
    (``n_answered``: accepted or escalated). Answers never accepted have no row."""
    from calibration.per_answer import per_answer_accuracy

    given = np.bincount(answers, minlength=len(options))
    table = per_answer_accuracy([options[k] for k in answers[accepted]], correct[accepted])
    index = {name: k for k, name in enumerate(options)}
    return [{**row.as_dict(), "n_answered": int(given[index[row.answer]])} for row in table]
