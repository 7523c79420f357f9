"""Tuning a policy on labelled fast-read probabilities, and evaluating one on fresh data.

Two ways to keep the threshold's rows unseen by the calibrator. ``tune`` splits the labelled rows
with a fixed seed: one part fits the calibrator, the other chooses the threshold
(``calibration.risk.guaranteed_threshold``). ``tune_crossfit`` takes out-of-fold reads (each row
read by a model that never saw it, ``slotgate train --cv``) and cross-fits the calibrator over the
same folds, so every row both calibrates and chooses the threshold. With ``max_escalation`` the guaranteed threshold still
stands; the rule becomes a ``BudgetRule`` around it (see its docstring for what happens once the
budget is used up), and ``budget_exceeded`` records that the guarantee needed more escalation on
the tuning rows than the budget allows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from calibration.base import Calibrator
from calibration.calibrators import make_calibrator
from calibration.risk import RiskControlResult, budget_threshold, guaranteed_threshold
from policies.rules import BudgetRule, Rule, ThresholdRule
from policies.tuned import TunedPolicy

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class TuneResult:
    """The fitted calibrator, the chosen rule, and the threshold rows (for reports and plots)."""

    calibrator: Calibrator
    rule: Rule
    risk: RiskControlResult
    n_calibration: int
    proba_before: FloatArray  # threshold rows, raw
    proba_after: FloatArray  # threshold rows, calibrated
    y_true: NDArray[np.int64]
    confidence: FloatArray  # calibrated probability of the raw argmax
    correct: NDArray[np.bool_]
    escalation_rate: float  # of the guaranteed threshold on the threshold rows
    budget_threshold: float | None
    budget_exceeded: bool
    n_folds: int | None = None  # set by tune_crossfit


def split_rows(n: int, *, calibration_fraction: float, seed: int
               ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """A seeded shuffle of ``range(n)`` cut into (calibration rows, threshold rows)."""
    if not 0.0 < calibration_fraction < 1.0:
        raise ValueError(f"calibration_fraction must be in (0, 1), got {calibration_fraction!r}")
    order = np.random.default_rng(seed).permutation(n)
    cut = round(n * calibration_fraction)
    if cut < 1 or cut > n - 1:
        raise ValueError(f"{n} labelled rows are too few to split for calibration and threshold")
    return order[:cut], order[cut:]


def answer_confidence(proba: FloatArray, calibrated: FloatArray) -> tuple[NDArray[np.int64], FloatArray]:
    """The raw argmax of each read and the calibrated probability of that option."""
    answers = proba.argmax(axis=1)
    return answers, calibrated[np.arange(len(answers)), answers]


def tune(proba: FloatArray, y_true: NDArray[np.int64], *, calibrator: str, target_accuracy: float,
         delta: float, calibration_fraction: float = 0.5, seed: int = 0,
         max_escalation: float | None = None, budget_window: int = 1000) -> TuneResult:
    """Fit ``calibrator`` on one part of the rows, choose the guaranteed threshold on the other."""
    cal_rows, tune_rows = split_rows(len(y_true), calibration_fraction=calibration_fraction,
                                     seed=seed)
    fitted = make_calibrator(calibrator).fit(proba[cal_rows], y_true[cal_rows])
    before, y_tune = proba[tune_rows], y_true[tune_rows]
    after = fitted.transform(before)
    return _choose(fitted, before, after, y_tune, n_calibration=len(cal_rows),
                   target_accuracy=target_accuracy, delta=delta, max_escalation=max_escalation,
                   budget_window=budget_window)


def tune_crossfit(proba: FloatArray, y_true: NDArray[np.int64], folds: NDArray[np.int64], *,
                  calibrator: str, target_accuracy: float, delta: float,
                  max_escalation: float | None = None, budget_window: int = 1000) -> TuneResult:
    """Tune on out-of-fold reads: the calibrator is cross-fitted over ``folds`` (row i calibrated
    by a calibrator fit outside i's fold), the threshold chosen on all rows, and the calibrator
    the policy keeps is fit on all rows."""
    from calibration.crossfit import check_folds, crossfit_calibrated

    n_folds = check_folds(folds, n_samples=len(y_true))
    after = crossfit_calibrated(proba, y_true, folds, calibrator=calibrator)
    fitted = make_calibrator(calibrator).fit(proba, y_true)
    result = _choose(fitted, proba, after, y_true, n_calibration=len(y_true),
                     target_accuracy=target_accuracy, delta=delta,
                     max_escalation=max_escalation, budget_window=budget_window)
    return replace(result, n_folds=n_folds)


def _choose(fitted: Calibrator, before: FloatArray, after: FloatArray, y_tune: NDArray[np.int64],
            *, n_calibration: int, target_accuracy: float, delta: float,
            max_escalation: float | None, budget_window: int) -> TuneResult:
    """The guaranteed threshold on calibrated threshold rows, and the rule around it."""
    answers, confidence = answer_confidence(before, after)
    correct = answers == y_tune
    risk = guaranteed_threshold(confidence, correct, target_accuracy=target_accuracy, delta=delta)
    rule: Rule = ThresholdRule(risk.threshold)
    escalation_rate = 1.0 - risk.coverage
    budget, exceeded = None, False
    if max_escalation is not None:
        budget = budget_threshold(confidence, max_escalation=max_escalation)
        exceeded = escalation_rate > max_escalation
        rule = BudgetRule(rule, max_escalation=max_escalation, window=budget_window)
    return TuneResult(
        calibrator=fitted, rule=rule, risk=risk, n_calibration=n_calibration,
        proba_before=before, proba_after=after, y_true=y_tune, confidence=confidence,
        correct=correct, escalation_rate=escalation_rate, budget_threshold=budget,
        budget_exceeded=exceeded,
    )


def evaluate(policy: TunedPolicy, options: tuple[str, ...], proba: FloatArray, y_true: NDArray[np.int64],
             *, n_resamples: int = 300, seed: int = 0) -> dict[str, Any]:
    """Apply a TunedPolicy row by row (as the router would) to labelled reads; metrics with 95%
    intervals (Clopper-Pearson for proportions, bootstrap for ECE)."""
    from calibration.metrics import bootstrap_ci, ece, proportion_ci
    from policies.types import OptionScores

    accepted = np.zeros(len(y_true), dtype=bool)
    calibrated = np.empty_like(proba)
    for i, row in enumerate(proba):
        verdict, calibrated[i] = policy.decide(OptionScores(options, tuple(float(p) for p in row)))
        accepted[i] = verdict.accept
    correct = proba.argmax(axis=1) == y_true
    n, n_accepted = len(y_true), int(accepted.sum())
    n_correct, n_accepted_correct = int(correct.sum()), int(correct[accepted].sum())

    def interval(k: int, m: int) -> list[float]:
        return list(proportion_ci(k, m))

    ece_before, ece_after = ece(proba, y_true), ece(calibrated, y_true)
    return {
        "n": n,
        "n_accepted": n_accepted,
        "accuracy": n_correct / n,
        "accuracy_ci": interval(n_correct, n),
        "accepted_accuracy": n_accepted_correct / n_accepted if n_accepted else None,
        "accepted_accuracy_ci": interval(n_accepted_correct, n_accepted),
        "coverage": n_accepted / n,
        "coverage_ci": interval(n_accepted, n),
        "escalation_rate": 1.0 - n_accepted / n,
        "escalation_rate_ci": interval(n - n_accepted, n),
        "ece_before": ece_before,
        "ece_before_ci": list(bootstrap_ci(ece, proba, y_true, n_resamples=n_resamples, seed=seed)),
        "ece_after": ece_after,
        "ece_after_ci": list(bootstrap_ci(ece, calibrated, y_true, n_resamples=n_resamples,
                                          seed=seed)),
    }
