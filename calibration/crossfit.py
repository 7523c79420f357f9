"""Cross-fitting: every labelled row gets a fast read (and a calibrated confidence) from a pipeline
that never saw that row, so all rows can be spent on the guarantee instead of a held-out slice.

The rows are cut into K folds (stratified by label); for each fold, a model (or calibrator) is fit
on the other K - 1 folds and applied to that fold. What the guarantee then assumes is spelled out
in docs/calibration.md ("Cross-fitted tuning"): the out-of-fold pipelines differ from the final
one, which is fit on all rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from calibration.base import FloatArray
from calibration.calibrators import make_calibrator
from calibration.validation import check_labels, check_proba


def check_n_folds(n_folds: int, labels: Sequence[Hashable]) -> int:
    """``n_folds`` if it is between 2 and the smallest class count (every fold must hold every
    class once, so that each out-of-fold model has seen each class); else ValueError naming it."""
    counts = Counter(labels)
    if not counts:
        raise ValueError("labels is empty: cross-fitting needs labelled rows")
    smallest_label, smallest = min(counts.items(), key=lambda item: (item[1], str(item[0])))
    if not 2 <= n_folds <= smallest:
        raise ValueError(
            f"n_folds must be between 2 and {smallest} (the smallest class, {smallest_label!r}, "
            f"has {smallest} rows), got {n_folds}")
    return n_folds


def stratified_folds(labels: Sequence[Hashable], *, n_folds: int, seed: int
                     ) -> NDArray[np.int64]:
    """The fold (0 .. n_folds - 1) of each row: scikit-learn's shuffled StratifiedKFold."""
    from sklearn.model_selection import StratifiedKFold

    check_n_folds(n_folds, labels)
    codes = np.unique(np.asarray([str(label) for label in labels]), return_inverse=True)[1]
    folds = np.empty(len(labels), dtype=np.int64)
    splitter = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    for k, (_, rows) in enumerate(splitter.split(np.zeros(len(labels)), codes)):
        folds[rows] = k
    return folds


def random_folds(n_samples: int, *, n_folds: int, seed: int) -> NDArray[np.int64]:
    """The fold of each row: scikit-learn's shuffled KFold. For cross-fitting a calibrator over
    reads of a model that saw none of the rows, where classes need not all reach every fold."""
    from sklearn.model_selection import KFold

    if not 2 <= n_folds <= n_samples:
        raise ValueError(f"n_folds must be between 2 and {n_samples} (the rows), got {n_folds}")
    folds = np.empty(n_samples, dtype=np.int64)
    splitter = KFold(n_splits=n_folds, shuffle=True, random_state=seed)
    for k, (_, rows) in enumerate(splitter.split(np.zeros(n_samples))):
        folds[rows] = k
    return folds


def check_folds(folds: ArrayLike, *, n_samples: int, name: str = "folds") -> int:
    """The number of folds K, if ``folds`` holds n_samples integers covering 0 .. K - 1 (K >= 2)."""
    array = np.asarray(folds)
    if array.shape != (n_samples,) or array.dtype.kind not in "iu":
        raise ValueError(f"{name} must be {n_samples} integers, got shape {array.shape}, "
                         f"dtype {array.dtype}")
    present = np.unique(array)
    if present.size < 2 or present[0] != 0 or present[-1] != present.size - 1:
        raise ValueError(f"{name} must number the folds 0 .. K-1 with K >= 2, every fold used; "
                         f"got {present.tolist()[:10]}")
    return int(present.size)


def crossfit_calibrated(proba: ArrayLike, y_true: ArrayLike, folds: ArrayLike, *,
                        calibrator: str) -> FloatArray:
    """Calibrated probabilities where row i's calibrator was fit on the rows outside i's fold."""
    array = check_proba(proba)
    labels = check_labels(y_true, n_samples=len(array), n_options=array.shape[1])
    fold_of = np.asarray(folds, dtype=np.int64)
    n_folds = check_folds(fold_of, n_samples=len(array))
    out = np.empty_like(array)
    for k in range(n_folds):
        inside = fold_of == k
        fitted = make_calibrator(calibrator).fit(array[~inside], labels[~inside])
        out[inside] = fitted.transform(array[inside])
    return out
