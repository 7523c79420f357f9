"""Top-label calibrators: they learn P(correct | top probability) and set the raw top option's
probability to it, rescaling the other options to share the rest in their original proportions."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from sklearn.isotonic import IsotonicRegression

from calibration.base import Calibrator, FloatArray


class IsotonicCalibrator(Calibrator):
    """Isotonic regression of correctness on the top probability (monotone, non-parametric).

    The fitted step function is kept as its knots (``x_thresholds_``, ``y_thresholds_``) and
    applied with linear interpolation clipped at the ends, which is what
    ``IsotonicRegression(out_of_bounds="clip").predict`` does; keeping the knots rather than the
    sklearn object is what lets the JSON form reproduce ``transform`` exactly.
    """

    kind = "isotonic"
    state_names = ("x_thresholds_", "y_thresholds_")

    def _fit(self, proba: FloatArray, y_true: NDArray[np.int64]) -> None:
        top, confidence = top_label(proba)
        regression = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
        regression.fit(confidence, (top == y_true).astype(np.float64))
        self.x_thresholds_ = np.asarray(regression.X_thresholds_, dtype=np.float64)
        self.y_thresholds_ = np.asarray(regression.y_thresholds_, dtype=np.float64)

    def _transform(self, proba: FloatArray) -> FloatArray:
        top, confidence = top_label(proba)
        calibrated = np.interp(confidence, self.x_thresholds_, self.y_thresholds_)
        return replace_top(proba, top, calibrated)


class HistogramBinning(Calibrator):
    """Histogram binning of the top probability: each bin maps to the accuracy seen in it.

    ``strategy="quantile"`` (default) puts about the same number of fitting rows in each bin, so
    no bin's accuracy rests on a handful of rows; ``"uniform"`` uses equal-width bins. A bin left
    empty by the fitting data maps to its midpoint (no evidence: leave confidence roughly as is).
    """

    kind = "histogram"
    option_names = ("n_bins", "strategy")
    state_names = ("bin_edges_", "bin_values_")

    def __init__(self, *, n_bins: int = 15, strategy: str = "quantile") -> None:
        self.n_bins = n_bins
        self.strategy = strategy

    def _fit(self, proba: FloatArray, y_true: NDArray[np.int64]) -> None:
        if not isinstance(self.n_bins, int) or self.n_bins < 1:
            raise ValueError(f"n_bins must be a positive integer, got {self.n_bins!r}")
        top, confidence = top_label(proba)
        if self.strategy == "quantile":
            inner = np.quantile(confidence, np.linspace(0.0, 1.0, self.n_bins + 1)[1:-1])
        elif self.strategy == "uniform":
            inner = np.linspace(0.0, 1.0, self.n_bins + 1)[1:-1]
        else:
            raise ValueError(f"strategy must be 'quantile' or 'uniform', got {self.strategy!r}")
        # Ties in confidence give repeated quantiles; a zero-width bin would hold nothing.
        inner = np.unique(inner[(inner > 0.0) & (inner < 1.0)])
        edges = np.concatenate(([0.0], inner, [1.0]))
        bins = np.searchsorted(inner, confidence, side="right")
        correct = (top == y_true).astype(np.float64)
        counts = np.bincount(bins, minlength=len(edges) - 1)
        hits = np.bincount(bins, weights=correct, minlength=len(edges) - 1)
        midpoints = (edges[:-1] + edges[1:]) / 2.0
        self.bin_edges_ = edges
        self.bin_values_ = np.where(counts > 0, hits / np.maximum(counts, 1), midpoints)

    def _transform(self, proba: FloatArray) -> FloatArray:
        top, confidence = top_label(proba)
        bins = np.searchsorted(self.bin_edges_[1:-1], confidence, side="right")
        return replace_top(proba, top, self.bin_values_[bins])


def top_label(proba: FloatArray) -> tuple[NDArray[np.int64], FloatArray]:
    """Index and probability of the raw top option of each row (first on ties)."""
    top = np.argmax(proba, axis=1).astype(np.int64)
    confidence: FloatArray = proba[np.arange(len(top)), top]
    return top, confidence


def replace_top(proba: FloatArray, top: NDArray[np.int64], calibrated: FloatArray) -> FloatArray:
    """Set ``proba[i, top[i]]`` to ``calibrated[i]`` and scale the other options to sum to
    ``1 - calibrated[i]``; when they held nothing, share the rest equally among them."""
    rows = np.arange(len(top))
    rest_before = proba.sum(axis=1) - proba[rows, top]
    rest_after = 1.0 - calibrated
    has_rest = rest_before > 0.0
    scale = np.divide(rest_after, rest_before, out=np.zeros_like(rest_after), where=has_rest)
    out = proba * scale[:, None]
    n_others = proba.shape[1] - 1
    out[~has_rest] = (rest_after[~has_rest] / n_others)[:, None]
    out[rows, top] = calibrated
    result: FloatArray = out
    return result
