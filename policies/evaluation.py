"""Evaluating a tuned policy on fresh labelled reads as the router would apply it (its
``judge``), for one tier or several: accepted accuracy (overall and per answer), coverage and
the slow model's share, each with a 95% interval; one tier adds its accuracy and ECE before and
after calibration, several add each tier's share and the mean cost of a decision."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from policies.policy import Judged, Policy

FloatArray = NDArray[np.float64]
# ``y_true`` of a row whose label is none of the options (``predict --allow-novel-labels``):
# never the answer, so always counted wrong.
NOVEL_LABEL = -2


def evaluate(policy: Policy, options: tuple[str, ...], proba: FloatArray | Sequence[FloatArray],
             y_true: NDArray[np.int64], *, n_resamples: int = 300, seed: int = 0,
             cost_blocks: tuple[float, int] | None = None) -> dict[str, Any]:
    """Apply a policy to labelled reads (``proba``: one (n_rows, n_options) array per tier, in
    its tier order; one array for a one-tier policy) and measure it, intervals Clopper-Pearson
    for proportions and bootstrap for ECE; ``per_answer`` worst first. ``cost_blocks``: a cost
    promise's share and block, measured on the rows in their order (``block_shares``)."""
    probas = [proba] if isinstance(proba, np.ndarray) else list(proba)
    judged = policy.judge(probas)
    rows = np.arange(len(y_true))
    answers = judged.answers[rows, judged.deciding]
    accepted = ~judged.escalated
    correct = answers == y_true
    n, n_accepted = len(y_true), int(accepted.sum())
    n_accepted_correct = int(correct[accepted].sum())
    metrics: dict[str, Any] = {
        "n": n,
        "n_accepted": n_accepted,
        "n_novel": int((y_true == NOVEL_LABEL).sum()),
        "accepted_accuracy": n_accepted_correct / n_accepted if n_accepted else None,
        "accepted_accuracy_ci": _interval(n_accepted_correct, n_accepted),
        "coverage": n_accepted / n,
        "coverage_ci": _interval(n_accepted, n),
        "escalation_rate": 1.0 - n_accepted / n,
        "escalation_rate_ci": _interval(n - n_accepted, n),
    }
    if len(policy.tiers_) == 1:
        metrics.update(_one_tier(probas[0], judged.calibrated[0], answers, correct, y_true,
                                 n_resamples=n_resamples, seed=seed))
    else:
        metrics.update(_tiers(policy, probas, judged, correct, y_true))
    metrics["per_answer"] = per_answer(options, answers, accepted, correct)
    if cost_blocks is not None:
        share, block = cost_blocks
        metrics["cost_promise"] = block_shares(judged.escalated, share=share, block=block)
    return metrics


def block_shares(escalated: NDArray[np.bool_], *, share: float, block: int) -> dict[str, Any]:
    """A cost promise on these rows (``policies.file.CostPromiseRecord``): the rows cut, in
    their order, into consecutive fixed blocks of ``block`` (a last, shorter one left out), each
    block's slow share, and how many exceed ``share``; ``blocks`` 0 when the rows fill none."""
    n_blocks = len(escalated) // block
    shares = escalated[:n_blocks * block].reshape(n_blocks, block).mean(axis=1)
    return {"share": share, "block": block, "blocks": n_blocks,
            "blocks_over": int((shares > share).sum()),
            "worst_block_share": float(shares.max()) if n_blocks else None,
            "slow_share": float(escalated.mean()) if len(escalated) else None}


def _interval(k: int, m: int) -> list[float]:
    from calibration.metrics import proportion_ci

    return list(proportion_ci(k, m))


def _one_tier(proba: FloatArray, calibrated: FloatArray, answers: NDArray[np.int64],
              correct: NDArray[np.bool_], y_true: NDArray[np.int64], *, n_resamples: int,
              seed: int) -> dict[str, Any]:
    """The tier's accuracy on every row and its ECE before and after calibration."""
    from calibration.metrics import bootstrap_ci, ece

    # Top-label ECE needs only whether the argmax was right: a novel row stands in as "another
    # option", so it counts wrong there too, without an index the calibration metrics refuse.
    scored = np.where(y_true == NOVEL_LABEL, (answers + 1) % proba.shape[1], y_true)
    n, n_correct = len(y_true), int(correct.sum())
    return {
        "accuracy": n_correct / n,
        "accuracy_ci": _interval(n_correct, n),
        "ece_before": ece(proba, scored),
        "ece_before_ci": list(bootstrap_ci(ece, proba, scored, n_resamples=n_resamples,
                                           seed=seed)),
        "ece_after": ece(calibrated, scored),
        "ece_after_ci": list(bootstrap_ci(ece, calibrated, scored, n_resamples=n_resamples,
                                          seed=seed)),
    }


def _tiers(policy: Policy, probas: Sequence[FloatArray], judged: Judged,
           correct: NDArray[np.bool_], y_true: NDArray[np.int64]) -> dict[str, Any]:
    """Per tier: the share it answered, the accuracy of its accepted answers and of its answers
    on every row; the slow model's cost and the mean cost of a decision (every tier read, plus
    the slow model's cost when no tier accepts)."""
    n = len(y_true)
    per_tier = []
    for k, tier in enumerate(policy.tiers_):
        mine = judged.answered == k
        n_mine, n_mine_right = int(mine.sum()), int(correct[mine].sum())
        raw_right = int((np.asarray(probas[k]).argmax(axis=1) == y_true).sum())
        per_tier.append({
            "name": tier.name, "backend_fingerprint": tier.backend_fingerprint,
            "threshold": tier.threshold, "cost": tier.cost,
            "n_read": int(judged.read[:, k].sum()) if tier.read else 0,
            "n_answered": n_mine,
            "answered_share": n_mine / n, "answered_share_ci": _interval(n_mine, n),
            "accepted_accuracy": n_mine_right / n_mine if n_mine else None,
            "accepted_accuracy_ci": _interval(n_mine_right, n_mine),
            "accuracy": raw_right / n, "accuracy_ci": _interval(raw_right, n),
        })
    return {"slow_cost": policy.slow_cost_, "expected_cost": float(judged.cost.mean()),
            "tiers": per_tier}


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
