"""What ``slotgate tune`` and ``slotgate eval`` need for a cascade of fast tiers: one predictions
file per tier over the same rows (checked row by row), a data hash over all of them, and the
metrics of a cascade policy on labelled reads of every tier, applied row by row as the router
applies it (the first tier read, then the next while none accepts, then the slow model)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from router.tuning.predictions import Predictions, PredictionsError

if TYPE_CHECKING:
    from policies.cascade import CascadePolicy

__all__ = ["check_same_rows", "data_hash_of", "evaluate_cascade"]


def check_same_rows(files: Sequence[Predictions]) -> None:
    """Every file holds the first file's rows in its order: the same ids, the same labels, the
    same texts (where both rows carry one) and the same options. A difference raises
    ``PredictionsError`` naming the later file, its row and the field."""
    first = files[0]
    for other in files[1:]:
        if len(other.ids) != len(first.ids):
            raise PredictionsError(other.path, None, "id", f"{len(other.ids)} rows, but "
                                   f"{first.path} has {len(first.ids)}: each tier's file reads "
                                   "the same rows in the same order")
        for row, (a, b) in enumerate(zip(first.ids, other.ids, strict=True), start=1):
            if a != b:
                raise PredictionsError(other.path, row, "id", f"{b!r}, but row {row} of "
                                       f"{first.path} is {a!r}: each tier's file reads the same "
                                       "rows in the same order")
        for row, (text, other_text) in enumerate(zip(first.texts, other.texts, strict=True),
                                                 start=1):
            if text is not None and other_text is not None and text != other_text:
                raise PredictionsError(other.path, row, "text", f"differs from row {row} of "
                                       f"{first.path} (id {first.ids[row - 1]!r})")
        for row, (label, other_label) in enumerate(zip(first.labels, other.labels, strict=True),
                                                   start=1):
            if label != other_label:
                raise PredictionsError(other.path, row, "label", f"{other_label!r}, but row "
                                       f"{row} of {first.path} is labelled {label!r}")
        if other.options != first.options:
            raise PredictionsError(other.path, 1, "options", f"differ from {first.path}'s "
                                   "(every tier reads the same options in the same order)")


def data_hash_of(files: Sequence[Predictions]) -> str:
    """The policy file's ``data_hash``: one file's own sha256, or for several the sha256 of
    their hashes in tier order (a different file, or order, gives a different hash)."""
    if len(files) == 1:
        return files[0].data_hash
    return hashlib.sha256("\n".join(f.data_hash for f in files).encode()).hexdigest()


def evaluate_cascade(policy: CascadePolicy, options: tuple[str, ...],
                     probas: Sequence[NDArray[np.float64]], y_true: NDArray[np.int64]
                     ) -> dict[str, Any]:
    """Apply a cascade row by row to labelled reads of every tier (``probas``: one
    (n_rows, n_options) array per tier, in the policy's tier order). Returns the whole
    cascade's coverage and accepted accuracy, the slow model's share, the mean cost of a
    decision (every tier read, plus the slow model's cost when it escalates) and, per tier,
    the share it answered, the accuracy of its accepted answers and of its answers on every row
    (``accuracy``), each proportion with its 95% Clopper-Pearson interval. A row labelled with
    none of the options (``NOVEL_LABEL``) is never right."""
    from calibration.metrics import proportion_ci
    from policies.evaluation import NOVEL_LABEL
    from policies.types import OptionScores

    tiers = policy.tiers_
    n = len(y_true)
    slow = len(tiers)
    answered = np.full(n, slow, dtype=np.int64)
    answer = np.full(n, -1, dtype=np.int64)
    cost = np.zeros(n)
    n_read = np.zeros(len(tiers), dtype=np.int64)
    for i in range(n):
        k = policy.next_tier(-1)
        while k is not None:
            n_read[k] += 1
            cost[i] += tiers[k].cost
            verdict, _ = policy.decide_tier(
                k, OptionScores(options, tuple(float(p) for p in probas[k][i])))
            if verdict.accept:
                answered[i], answer[i] = k, verdict.index
                break
            k = policy.next_tier(k)
        else:
            cost[i] += policy.slow_cost_
    right = answer == y_true
    accepted = answered < slow

    def interval(k: int, m: int) -> list[float]:
        return list(proportion_ci(k, m))

    per_tier = []
    for k, tier in enumerate(tiers):
        mine = answered == k
        n_mine, n_mine_right = int(mine.sum()), int(right[mine].sum())
        raw_right = int((probas[k].argmax(axis=1) == y_true).sum())
        per_tier.append({
            "name": tier.name, "backend_fingerprint": tier.backend_fingerprint,
            "threshold": tier.threshold, "cost": tier.cost, "n_read": int(n_read[k]),
            "n_answered": n_mine,
            "answered_share": n_mine / n, "answered_share_ci": interval(n_mine, n),
            "accepted_accuracy": n_mine_right / n_mine if n_mine else None,
            "accepted_accuracy_ci": interval(n_mine_right, n_mine),
            "accuracy": raw_right / n, "accuracy_ci": interval(raw_right, n),
        })
    n_accepted, n_right = int(accepted.sum()), int(right[accepted].sum())
    return {
        "n": n,
        "n_accepted": n_accepted,
        "n_novel": int((y_true == NOVEL_LABEL).sum()),
        "accepted_accuracy": n_right / n_accepted if n_accepted else None,
        "accepted_accuracy_ci": interval(n_right, n_accepted),
        "coverage": n_accepted / n,
        "coverage_ci": interval(n_accepted, n),
        "escalation_rate": 1.0 - n_accepted / n,
        "escalation_rate_ci": interval(n - n_accepted, n),
        "slow_cost": policy.slow_cost_,
        "expected_cost": float(cost.mean()),
        "tiers": per_tier,
    }
