"""Input checks shared by the public entry points of ``calibration``: each message names the
argument at fault, so a caller several layers up still learns what to fix."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

# Probabilities read back from JSON or computed in float32 do not sum to 1 exactly; a row off by
# more than this is a different distribution, not rounding.
ROW_SUM_ATOL = 1e-3


def check_proba(proba: ArrayLike, *, name: str = "proba") -> NDArray[np.float64]:
    """``proba`` as a float array of shape (n_samples, n_options >= 2) with rows summing to 1."""
    array = np.asarray(proba, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_options), got shape {array.shape}")
    if array.shape[0] == 0:
        raise ValueError(f"{name} is empty: at least one row is needed")
    if array.shape[1] < 2:
        raise ValueError(f"{name} needs at least 2 options (columns), got {array.shape[1]}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} has non-finite values (nan or inf)")
    if np.any(array < 0.0) or np.any(array > 1.0):
        bad = array[(array < 0.0) | (array > 1.0)][0]
        raise ValueError(f"{name} has values outside [0, 1] (for example {bad!r})")
    sums = array.sum(axis=1)
    off = np.flatnonzero(np.abs(sums - 1.0) > ROW_SUM_ATOL)
    if off.size:
        raise ValueError(
            f"rows of {name} must sum to 1: row {int(off[0])} sums to {float(sums[off[0]])!r}"
        )
    return array


def check_labels(y_true: ArrayLike, *, n_samples: int, n_options: int,
                 name: str = "y_true") -> NDArray[np.int64]:
    """``y_true`` as an int array of shape (n_samples,) with labels in [0, n_options)."""
    array = np.asarray(y_true)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.shape[0] != n_samples:
        raise ValueError(f"{name} has {array.shape[0]} labels but proba has {n_samples} rows")
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise ValueError(f"{name} must hold integer option indices")
    elif array.dtype.kind not in "iub":
        raise ValueError(f"{name} must hold integer option indices, got dtype {array.dtype}")
    labels = array.astype(np.int64)
    if np.any(labels < 0) or np.any(labels >= n_options):
        bad = labels[(labels < 0) | (labels >= n_options)][0]
        raise ValueError(f"{name} has labels outside [0, n_options) = [0, {n_options}): {int(bad)}")
    return labels


def check_confidence(confidence: ArrayLike, *, name: str = "confidence") -> NDArray[np.float64]:
    """``confidence`` as a non-empty 1-D float array in [0, 1]."""
    array = np.asarray(confidence, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.shape[0] == 0:
        raise ValueError(f"{name} is empty: at least one value is needed")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} has non-finite values (nan or inf)")
    if np.any(array < 0.0) or np.any(array > 1.0):
        raise ValueError(f"{name} has values outside [0, 1]")
    return array


def check_correct(correct: ArrayLike, *, n_samples: int,
                  name: str = "correct") -> NDArray[np.bool_]:
    """``correct`` as a boolean array of shape (n_samples,); accepts bools or 0/1."""
    array = np.asarray(correct)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.shape[0] != n_samples:
        raise ValueError(f"{name} has {array.shape[0]} values but confidence has {n_samples}")
    if array.dtype != np.bool_:
        if array.size and not np.all(np.isin(array, (0, 1))):
            raise ValueError(f"{name} must hold booleans or 0/1")
        array = array.astype(bool)
    return array


def check_confidence_correct(confidence: ArrayLike, correct: ArrayLike
                             ) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Both arrays of a (confidence, correct) pair, checked against each other."""
    conf = check_confidence(confidence)
    return conf, check_correct(correct, n_samples=conf.shape[0])


def check_fraction(value: float, *, name: str, low_open: bool = False,
                   high_open: bool = False) -> float:
    """A float in [0, 1], with either end excluded on request."""
    number = float(value)
    low_ok = number > 0.0 if low_open else number >= 0.0
    high_ok = number < 1.0 if high_open else number <= 1.0
    if not (np.isfinite(number) and low_ok and high_ok):
        low = "(0" if low_open else "[0"
        high = "1)" if high_open else "1]"
        raise ValueError(f"{name} must be in {low}, {high}, got {value!r}")
    return number
