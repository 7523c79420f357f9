"""Out-of-fold reads for ``slotgate train --cv K --oof-out FILE``, and the check ``slotgate tune``
makes that such a file still matches the training rows its model recorded.

Each training row is read by the model of the fold that left it out, so tuning can use every
labelled row instead of a held-out slice. The model saved for serving is fit on all rows; the
artifact records the out-of-fold rows (id, label, fold) under "oof" so a file that was cut,
re-ordered into other folds, relabelled or paired with another model is refused by ``tune``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router.tuning.predictions import Predictions, PredictionsError


@dataclass(frozen=True)
class OutOfFold:
    """Out-of-fold probabilities (columns in ``classes`` order) and each row's fold."""

    proba: NDArray[np.float64]
    folds: NDArray[np.int64]
    classes: tuple[str, ...]

    def record(self, ids: Sequence[str], labels: Sequence[str]) -> dict[str, Any]:
        """What the model artifact keeps to check an out-of-fold file against later."""
        return {"n_folds": int(self.folds.max()) + 1,
                "rows": [[i, label, int(k)] for i, label, k in zip(ids, labels, self.folds,
                                                                  strict=True)]}


def out_of_fold(texts: Sequence[str], labels: Sequence[str], *, kind: str, n_folds: int,
                seed: int, on_fold: Callable[[int], None] | None = None) -> OutOfFold:
    """Stratified K-fold reads: fold k is read by a model of ``kind`` fit on the other folds.
    ``n_folds`` must be in [2, smallest class count] (ValueError naming it otherwise)."""
    from calibration.crossfit import stratified_folds
    from router.backends.sklearn import train_text_model

    folds = stratified_folds(labels, n_folds=n_folds, seed=seed)
    classes = tuple(sorted(set(labels)))  # scikit-learn's classes_ order (np.unique)
    column = {name: j for j, name in enumerate(classes)}
    proba = np.zeros((len(texts), len(classes)), dtype=np.float64)
    for k in range(n_folds):
        inside = np.flatnonzero(folds == k).tolist()
        outside = np.flatnonzero(folds != k).tolist()
        model = train_text_model([texts[i] for i in outside], [labels[i] for i in outside],
                                 kind=kind, seed=seed)
        columns = [column[str(name)] for name in model.classes_]
        proba[np.ix_(inside, columns)] = model.predict_proba([texts[i] for i in inside])
        if on_fold is not None:
            on_fold(k)
    return OutOfFold(proba=proba, folds=folds, classes=classes)


def check_crossfit_rows(preds: Predictions) -> NDArray[np.int64] | None:
    """The folds of an out-of-fold file (None when no row has a fold: not cross-fitted). Every
    row must then carry a fold and a label: an out-of-fold file is the training data, read."""
    present = [k is not None for k in preds.folds]
    if not any(present):
        return None
    if not all(present):
        row = present.index(False) + 1
        raise PredictionsError(preds.path, row, "fold", "missing, while other rows carry one "
                               "(an out-of-fold file has a fold on every row)")
    unlabelled = np.flatnonzero(~preds.labelled)
    if unlabelled.size:
        raise PredictionsError(preds.path, int(unlabelled[0]) + 1, "label",
                               "empty in an out-of-fold file (every training row has a label)")
    folds = np.asarray(preds.folds, dtype=np.int64)
    present_folds = np.unique(folds)
    if present_folds.size < 2 or present_folds[-1] != present_folds.size - 1:
        raise PredictionsError(preds.path, None, "fold", "folds must be numbered 0 .. K-1 "
                               f"(K >= 2) with none empty; found {present_folds.tolist()[:10]}")
    return folds


def check_matches_model(preds: Predictions, model_meta: Mapping[str, Any], *, model_name: str,
                        model_fingerprint: str) -> None:
    """Refuse an out-of-fold file whose rows are not the training rows ``model_meta`` recorded
    (same ids, labels and folds; any order) or whose reads came with another model."""
    record = model_meta.get("oof")
    if not isinstance(record, Mapping):
        raise PredictionsError(preds.path, None, "fold", f"model {model_name} was not trained "
                               "with --cv, so no out-of-fold rows belong to it")
    expected = {str(i): (label, fold) for i, label, fold in record["rows"]}
    if len(preds.ids) != len(expected):
        raise PredictionsError(preds.path, None, "id", f"{len(preds.ids)} rows, but {model_name} "
                               f"was trained on {len(expected)} (not its out-of-fold file)")
    for row, (row_id, label, fold) in enumerate(zip(preds.ids, preds.labels, preds.folds,
                                                    strict=True), start=1):
        if row_id not in expected:
            raise PredictionsError(preds.path, row, "id", f"{row_id!r} is not a training row of "
                                   f"{model_name}")
        want_label, want_fold = expected[row_id]
        if label != want_label:
            raise PredictionsError(preds.path, row, "label", f"{label!r}, but {model_name} was "
                                   f"trained with {want_label!r} for id {row_id!r}")
        if fold != want_fold:
            raise PredictionsError(preds.path, row, "fold", f"{fold!r}, but {model_name} left id "
                                   f"{row_id!r} out in fold {want_fold}")
    for row, fingerprint in enumerate(preds.fingerprints, start=1):
        if fingerprint != model_fingerprint:
            raise PredictionsError(preds.path, row, "fingerprint", f"{fingerprint!r}, but "
                                   f"{model_name} has fingerprint {model_fingerprint!r}")
