"""Reliability bins of top-label confidence (equal-width or equal-mass): the shared ground of
ECE, MCE and the reliability diagram."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class ReliabilityBins:
    """Non-empty bins only: mean confidence, accuracy and row count of each, in confidence order."""

    confidence: FloatArray
    accuracy: FloatArray
    count: NDArray[np.int64]

    @property
    def gap(self) -> FloatArray:
        gap: FloatArray = np.abs(self.accuracy - self.confidence)
        return gap


def reliability_bins(confidence: FloatArray, correct: NDArray[np.bool_], *, n_bins: int = 15,
                     strategy: str = "uniform") -> ReliabilityBins:
    """Bin (confidence, correct) pairs; inputs are assumed checked by the caller.

    ``"uniform"``: ``n_bins`` equal-width bins on [0, 1] (right-closed, so 1.0 falls in the last).
    ``"quantile"``: rows sorted by confidence and cut into ``n_bins`` runs of (nearly) equal size,
    so each bin holds about n / n_bins rows; rows with equal confidence may land in adjacent bins.
    """
    if not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    if strategy == "uniform":
        bins = np.clip(np.ceil(confidence * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    elif strategy == "quantile":
        order = np.argsort(confidence, kind="stable")
        bins = np.empty(len(confidence), dtype=np.int64)
        for index, chunk in enumerate(np.array_split(order, n_bins)):
            bins[chunk] = index
    else:
        raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    count = np.bincount(bins, minlength=n_bins)
    conf_sum = np.bincount(bins, weights=confidence, minlength=n_bins)
    hit_sum = np.bincount(bins, weights=correct.astype(np.float64), minlength=n_bins)
    filled = count > 0
    return ReliabilityBins(
        confidence=conf_sum[filled] / count[filled],
        accuracy=hit_sum[filled] / count[filled],
        count=count[filled].astype(np.int64),
    )
