"""Scores of probabilistic predictions and of confidence as an accept signal: accuracy, ECE, MCE,
Brier, NLL, AUROC of confidence, the risk-coverage curve and AURC, and confidence intervals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import binomtest
from sklearn.metrics import accuracy_score, brier_score_loss, log_loss, roc_auc_score

from calibration.reliability import ReliabilityBins, reliability_bins
from calibration.validation import (
    check_confidence_correct,
    check_fraction,
    check_labels,
    check_proba,
)

FloatArray = NDArray[np.float64]


def _checked(proba: ArrayLike, y_true: ArrayLike) -> tuple[FloatArray, NDArray[np.int64]]:
    array = check_proba(proba)
    labels = check_labels(y_true, n_samples=array.shape[0], n_options=array.shape[1])
    return array / array.sum(axis=1, keepdims=True), labels


def top_label_bins(proba: ArrayLike, y_true: ArrayLike, *, n_bins: int = 15,
                   strategy: str = "uniform") -> ReliabilityBins:
    """Reliability bins of the top probability against whether the top option is right."""
    array, labels = _checked(proba, y_true)
    top = np.argmax(array, axis=1)
    confidence = array[np.arange(len(top)), top]
    return reliability_bins(confidence, top == labels, n_bins=n_bins, strategy=strategy)


def accuracy(proba: ArrayLike, y_true: ArrayLike) -> float:
    """Share of rows whose top option is the label."""
    array, labels = _checked(proba, y_true)
    return float(accuracy_score(labels, np.argmax(array, axis=1)))


def ece(proba: ArrayLike, y_true: ArrayLike, *, n_bins: int = 15,
        strategy: str = "uniform") -> float:
    """Expected calibration error of the top label: sum over bins of (share of rows) x
    |accuracy - mean confidence|; ``strategy`` "uniform" (equal width), "quantile" (equal mass)."""
    bins = top_label_bins(proba, y_true, n_bins=n_bins, strategy=strategy)
    return float(np.sum(bins.count * bins.gap) / np.sum(bins.count))


def mce(proba: ArrayLike, y_true: ArrayLike, *, n_bins: int = 15,
        strategy: str = "uniform") -> float:
    """Maximum calibration error: the largest |accuracy - mean confidence| over non-empty bins."""
    return float(np.max(top_label_bins(proba, y_true, n_bins=n_bins, strategy=strategy).gap))


def brier(proba: ArrayLike, y_true: ArrayLike) -> float:
    """Multi-class Brier score: mean over rows of sum over options of (p - one-hot)^2, in [0, 2]."""
    array, labels = _checked(proba, y_true)
    options = np.arange(array.shape[1])
    return float(brier_score_loss(labels, array, labels=options, scale_by_half=False))


def nll(proba: ArrayLike, y_true: ArrayLike) -> float:
    """Mean negative log-likelihood of the labels (natural log; probabilities clipped at eps)."""
    array, labels = _checked(proba, y_true)
    return float(log_loss(labels, array, labels=np.arange(array.shape[1])))


def confidence_auroc(confidence: ArrayLike, correct: ArrayLike) -> float:
    """AUROC of confidence as a detector of correct answers; nan when all rows are right or all
    wrong (the ranking has nothing to separate)."""
    conf, hits = check_confidence_correct(confidence, correct)
    if hits.all() or not hits.any():
        return float("nan")
    return float(roc_auc_score(hits, conf))


def risk_coverage_curve(confidence: ArrayLike, correct: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Answer the k most confident rows, k = 1..n: coverage k/n and risk (error rate among them).

    Rows are sorted by confidence descending (stable, so ties keep input order)."""
    conf, hits = check_confidence_correct(confidence, correct)
    order = np.argsort(-conf, kind="stable")
    answered = np.arange(1, len(conf) + 1)
    errors = np.cumsum(~hits[order])
    return answered / len(conf), errors / answered


def aurc(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Area under the risk-coverage curve: the mean risk over k = 1..n (lower is better)."""
    return float(np.mean(risk_coverage_curve(confidence, correct)[1]))


def accuracy_at_coverage(confidence: ArrayLike, correct: ArrayLike, coverage: float) -> float:
    """Accuracy among the ceil(coverage * n) most confident rows; ``coverage`` in (0, 1]."""
    share = check_fraction(coverage, name="coverage", low_open=True)
    coverages, risks = risk_coverage_curve(confidence, correct)
    k = max(1, int(np.ceil(share * len(coverages) - 1e-9)))
    return float(1.0 - risks[k - 1])


def proportion_ci(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson (exact) two-sided interval for a proportion of ``k`` in ``n``;
    (0, 1) when ``n`` is 0 (no evidence)."""
    check_fraction(level, name="level", low_open=True, high_open=True)
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"k and n must satisfy 0 <= k <= n, got k={k!r}, n={n!r}")
    if n == 0:
        return 0.0, 1.0
    interval = binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return float(interval.low), float(interval.high)


def bootstrap_ci(metric_fn: Callable[..., float], *arrays: ArrayLike, n_resamples: int = 1000,
                 level: float = 0.95, seed: int = 0, **kwargs: Any) -> tuple[float, float]:
    """Bootstrap interval of ``metric_fn(*arrays, **kwargs)``, resampling rows of all ``arrays``
    together (they share the first axis), e.g. ``bootstrap_ci(ece, proba, y_true)``.

    The *basic* (reverse-percentile) interval from ``scipy.stats.bootstrap``: binned calibration
    errors are biased upward on resamples (duplicated rows fill bins more unevenly), so a plain
    percentile interval can miss the estimate itself; the basic interval reflects that bias back.
    Bounds are clipped at 0, the floor of every error metric this is used for."""
    from scipy.stats import bootstrap

    check_fraction(level, name="level", low_open=True, high_open=True)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples!r}")
    columns = [np.asarray(array) for array in arrays]
    if not columns or len({len(column) for column in columns}) != 1 or len(columns[0]) == 0:
        raise ValueError("arrays must be one or more non-empty arrays with the same number of rows")

    def on_rows(rows: np.ndarray) -> float:
        return metric_fn(*(column[rows] for column in columns), **kwargs)

    result = bootstrap((np.arange(len(columns[0])),), on_rows, vectorized=False,
                       n_resamples=n_resamples, confidence_level=level, method="basic",
                       rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return max(float(low), 0.0), max(float(high), 0.0)
