"""How ``Policy.fit`` learns, for one tier and for several: the calibrators, the guaranteed
threshold(s) and the evidence over the threshold rows, written into the policy's fitted
attributes (the ones ending in ``_``; ``policies.policy.Policy`` lists them; typed ``Any``
here, since the policy module imports this one).

One tier, two ways to keep the threshold's rows unseen by the calibrator. Without ``folds`` the
labelled rows are split with a fixed seed: one part fits the calibrator, the other chooses the
threshold (``calibration.risk.guaranteed_threshold``). With ``folds`` (out-of-fold reads, each
row read by a model that never saw it, ``slotgate train --cv``) the calibrator is cross-fitted
over the same folds, so every row both calibrates and chooses the threshold. With
``max_escalation`` the guaranteed threshold still stands; the rule becomes a ``BudgetRule``
around it. With ``per_answer_floor`` each answer also gets its own bar
(``policies.answer_floor``).

Several tiers: the rows are split with a fixed seed; one part fits each tier's calibrator and
orders the candidate threshold vectors, the other tests them (``calibration.cascade``, whose
walks give the joint guarantee: the answers every tier accepts are together at least
``target_accuracy`` accurate with probability at least 1 - delta; docs/cascade.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from calibration.block_cost import BlockCostPromise
from calibration.calibrators import make_calibrator
from calibration.risk import budget_threshold, guaranteed_threshold
from policies.answer_floor import per_answer_bars
from policies.rules import BudgetRule, Rule, ThresholdRule

if TYPE_CHECKING:
    from calibration.base import Calibrator
    from policies.options import PolicyOptions, TierCost

FloatArray = NDArray[np.float64]
__all__ = ["answer_confidence", "fit_cascade", "fit_one_tier", "split_rows"]


def fit_one_tier(policy: Any, proba: FloatArray, labels: NDArray[np.int64],
                 params: PolicyOptions, folds: NDArray[np.int64] | None) -> Rule:
    """A calibrator and its guaranteed rule (returned), fit on one tier's reads; the evidence
    over the threshold rows goes into ``policy``'s fitted attributes."""
    if folds is None:
        cal_rows, tune_rows = split_rows(len(labels), seed=params.seed,
                                         calibration_fraction=params.calibration_fraction)
        policy.calibrator_ = make_calibrator(params.calibrator).fit(proba[cal_rows],
                                                                    labels[cal_rows])
        policy.proba_before_, policy.y_true_ = proba[tune_rows], labels[tune_rows]
        policy.proba_after_ = policy.calibrator_.transform(policy.proba_before_)
        policy.n_calibration_, policy.n_folds_ = len(cal_rows), None
    else:
        from calibration.crossfit import check_folds, crossfit_calibrated

        policy.n_folds_ = check_folds(folds, n_samples=len(labels))
        policy.proba_after_ = crossfit_calibrated(proba, labels, folds,
                                                  calibrator=params.calibrator)
        # The policy keeps a calibrator fit on all rows (the one that serves).
        policy.calibrator_ = make_calibrator(params.calibrator).fit(proba, labels)
        policy.proba_before_, policy.y_true_ = proba, labels
        policy.n_calibration_ = len(labels)
    policy.n_tune_ = len(policy.y_true_)
    return _choose(policy, params)


def _choose(policy: Any, params: PolicyOptions) -> Rule:
    """The guaranteed threshold on the calibrated threshold rows, and the rule around it."""
    assert policy.options_ is not None
    options = policy.options_
    policy.answers_, policy.confidence_ = answer_confidence(policy.proba_before_,
                                                            policy.proba_after_)
    policy.correct_ = policy.answers_ == policy.y_true_
    policy.risk_ = guaranteed_threshold(policy.confidence_, policy.correct_,
                                        target_accuracy=params.target_accuracy,
                                        delta=params.delta)
    policy.answer_bars_ = None
    bars_rule = ThresholdRule(policy.risk_.threshold)
    if params.per_answer_floor is not None:
        policy.answer_bars_ = per_answer_bars(
            policy.answers_, policy.confidence_, policy.correct_, options=options,
            floor=params.per_answer_floor, delta=params.delta,
            threshold=policy.risk_.threshold)
        bars_rule = ThresholdRule(policy.risk_.threshold,
                                  {b.option: b.bar for b in policy.answer_bars_
                                   if b.bar != policy.risk_.threshold})
    rule: Rule = bars_rule
    bars = np.array([np.inf if bars_rule.bar(name) is None else bars_rule.bar(name)
                     for name in options])
    policy.accepted_ = policy.confidence_ >= bars[policy.answers_]
    policy.coverage_ = float(policy.accepted_.mean())
    policy.escalation_rate_ = 1.0 - policy.coverage_
    policy.budget_threshold_, policy.budget_exceeded_ = None, False
    if params.max_escalation is not None:
        policy.budget_threshold_ = budget_threshold(policy.confidence_,
                                                    max_escalation=params.max_escalation)
        policy.budget_exceeded_ = policy.escalation_rate_ > params.max_escalation
        rule = BudgetRule(rule, max_escalation=params.max_escalation,
                          window=params.budget_window)
    # A budget rule only turns escalations into accepts: the threshold's escalations bound it.
    hold_cost_promise(policy, params, n_escalated=int((~policy.accepted_).sum()),
                      n=len(policy.accepted_), n_tiers=1, coverage_alone=policy.coverage_)
    return rule


def cost_promise_of(params: PolicyOptions) -> BlockCostPromise | None:
    """The cost promise the options ask for (None: none)."""
    if params.cost_share is None:
        return None
    return BlockCostPromise(share=params.cost_share, block=params.cost_block,
                            delta=params.cost_delta)


def hold_cost_promise(policy: Any, params: PolicyOptions, *, n_escalated: int, n: int,
                      n_tiers: int, coverage_alone: float) -> None:
    """The cost promise's bound at the chosen rule into ``policy.cost_bound_`` (None: no
    promise asked); a ValueError naming ``cost_share`` when the rule breaks it."""
    policy.cost_bound_, policy.coverage_alone_ = None, coverage_alone
    promise = cost_promise_of(params)
    if promise is None:
        return
    bound = promise.bound(n_escalated, n, n_tiers=n_tiers)
    if not bound.kept:
        raise ValueError(
            f"cost_share (--cost-share): the accuracy promise (target {params.target_accuracy}, "
            f"delta {params.delta}) needs a rule that escalates {bound.n_escalated} of {n} "
            f"threshold rows ({bound.escalation_rate:.4f}, upper bound "
            f"{bound.escalation_upper:.4f}); a block of {promise.block} decisions then has more "
            f"than {promise.allowed} escalations (share {promise.share}) with probability up to "
            f"{bound.block_bound:.4f} > cost_delta {promise.delta}: raise --cost-share or "
            "--cost-delta, or lower --target-accuracy")
    policy.cost_bound_ = bound


def fit_cascade(policy: Any, reads: Sequence[FloatArray], labels: NDArray[np.int64],
                params: PolicyOptions, tiers: Sequence[TierCost], slow_cost: float
                ) -> tuple[list[Calibrator], list[float | None]]:
    """Each tier's calibrator and the jointly chosen thresholds (returned, in tier order); the
    evidence goes into ``policy``'s fitted attributes."""
    from calibration.cascade import CascadeThresholds

    cal, tune = split_rows(len(labels), seed=params.seed,
                           calibration_fraction=params.calibration_fraction)
    calibrators = [make_calibrator(params.calibrator).fit(read[cal], labels[cal])
                   for read in reads]
    conf_cal, hits_cal = tier_confidence(reads, calibrators, labels, cal)
    conf, hits = tier_confidence(reads, calibrators, labels, tune)
    promise = cost_promise_of(params)

    def search(cost_cap: float | None) -> CascadeThresholds:
        return CascadeThresholds(
            target_accuracy=params.target_accuracy, delta=params.delta,
            tier_costs=[t.cost for t in tiers], slow_cost=slow_cost,
            max_slow_share=params.max_slow_share, cost_cap=cost_cap,
            cost_level=None if promise is None else promise.level,
        ).fit(conf, hits, order_confidence=conf_cal, order_correct=hits_cal)

    policy.thresholds_ = search(None if promise is None else
                                promise.max_escalation(promise.delta - promise.level))
    if promise is not None and not policy.thresholds_.passed_:
        raise ValueError(f"cost_share (--cost-share): no threshold vector keeps both promises "
                         f"(accuracy {params.target_accuracy} at delta {params.delta}, slow "
                         f"share <= {promise.share} of each block of {promise.block} at "
                         f"cost_delta {promise.delta}): raise --cost-share or --cost-delta, or "
                         "lower --target-accuracy")
    thresholds = list(policy.thresholds_.thresholds_)
    policy.n_calibration_, policy.n_tune_ = len(cal), len(tune)
    policy.n_folds_ = None
    policy.tier_confidence_, policy.answered_ = conf, policy.thresholds_.route(conf)
    policy.confidence_ = _deciding(conf, policy.answered_, [t is not None for t in thresholds])
    policy.coverage_ = 1.0 - policy.thresholds_.coverage_by_tier_[-1]
    policy.escalation_rate_ = 1.0 - policy.coverage_
    alone = policy.coverage_ if promise is None else 1.0 - search(None).coverage_by_tier_[-1]
    hold_cost_promise(policy, params, n_escalated=int((policy.answered_ == len(tiers)).sum()),
                      n=len(tune), n_tiers=len(tiers), coverage_alone=alone)
    return calibrators, thresholds


def tier_confidence(reads: Sequence[FloatArray], calibrators: Sequence[Calibrator],
                    labels: NDArray[np.int64], rows: NDArray[np.int64]
                    ) -> tuple[FloatArray, NDArray[np.bool_]]:
    """(n_rows, n_tiers) calibrated top probability of each tier's answer, and its hits."""
    conf = np.empty((len(rows), len(reads)))
    hits = np.empty(conf.shape, dtype=bool)
    for k, (read, calibrator) in enumerate(zip(reads, calibrators, strict=True)):
        answers, conf[:, k] = answer_confidence(read[rows], calibrator.transform(read[rows]))
        hits[:, k] = answers == labels[rows]
    return conf, hits


def _deciding(conf: FloatArray, answered: NDArray[np.int64], read: Sequence[bool]) -> FloatArray:
    """The confidence that decided each row: the answering tier's, or, for a row no tier
    accepted, the last tier read (every tier's last when none is read)."""
    last = max((k for k, r in enumerate(read) if r), default=len(read) - 1)
    column = np.where(answered < len(read), answered, last)
    return conf[np.arange(len(conf)), column]


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


def answer_confidence(proba: FloatArray, calibrated: FloatArray
                      ) -> tuple[NDArray[np.int64], FloatArray]:
    """The raw argmax of each read and the calibrated probability of that option."""
    answers = proba.argmax(axis=1)
    return answers, calibrated[np.arange(len(answers)), answers]
