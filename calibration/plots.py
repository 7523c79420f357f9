"""PNG plots a person reads to judge a policy: the reliability diagram before and after
calibration, and the risk-coverage curve with the chosen threshold marked. matplotlib is imported
only inside these functions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from calibration.metrics import ece, risk_coverage_curve, top_label_bins
from calibration.validation import check_confidence_correct


def new_figure(width_in: float, height_in: float) -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window, work on a headless server
    from matplotlib.figure import Figure

    # A bare Figure (not pyplot) leaves no global figure behind to leak across calls.
    return Figure(figsize=(width_in, height_in), layout="constrained")


def save_figure(figure: Any, path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, format="png", dpi=120)
    return target


def reliability_diagram(path: str | os.PathLike[str], proba_before: ArrayLike,
                        proba_after: ArrayLike, y_true: ArrayLike, *,
                        title: str = "Reliability diagram", n_bins: int = 15) -> Path:
    """Two panels (before, after calibration): accuracy against mean top-label confidence per
    equal-width bin, marker area by row count and counts written by the points; the diagonal is
    perfect calibration; ECE in each legend. Returns the PNG path."""
    figure = new_figure(11.0, 5.0)
    axes = figure.subplots(1, 2, sharey=True)
    for ax, proba, label in ((axes[0], proba_before, "before"), (axes[1], proba_after, "after")):
        bins = top_label_bins(proba, y_true, n_bins=n_bins, strategy="uniform")
        score = ece(proba, y_true, n_bins=n_bins, strategy="uniform")
        ax.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
        ax.bar(bins.confidence, bins.accuracy, width=0.8 / n_bins, alpha=0.35, color="tab:blue")
        sizes = 20.0 + 180.0 * bins.count / bins.count.max()
        ax.scatter(bins.confidence, bins.accuracy, s=sizes, color="tab:blue", zorder=3,
                   label=f"{label} calibration: ECE {score:.3f}")
        for x, y, count in zip(bins.confidence, bins.accuracy, bins.count, strict=True):
            ax.annotate(str(int(count)), (x, y), textcoords="offset points", xytext=(0, 8),
                        ha="center", fontsize=7)
        ax.set_xlim(0.0, 1.0)
        ax.set_ylim(0.0, 1.05)
        ax.set_xlabel("mean confidence of the top option in the bin")
        ax.set_title(f"{label} calibration (n = {int(bins.count.sum())}, {n_bins} bins)")
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy in the bin (numbers: rows in the bin)")
    figure.suptitle(title)
    return save_figure(figure, path)


def risk_coverage_plot(path: str | os.PathLike[str], confidence: ArrayLike, correct: ArrayLike, *,
                       threshold: float | None, title: str = "Risk-coverage curve",
                       target_accuracy: float | None = None) -> Path:
    """Error rate among the answered rows against the share answered (most confident first), the
    point of ``threshold`` marked (or a note that none passed), the target's error as a line."""
    conf, hits = check_confidence_correct(confidence, correct)
    coverage, risk = risk_coverage_curve(conf, hits)
    figure = new_figure(7.0, 5.0)
    ax = figure.subplots()
    ax.plot(coverage, risk, color="tab:blue", label="risk among answered (most confident first)")
    if target_accuracy is not None:
        ax.axhline(1.0 - target_accuracy, color="tab:red", linestyle="--",
                   label=f"target error {1.0 - target_accuracy:.3f}")
    if threshold is None:
        ax.text(0.5, 0.9, "no threshold passed: escalate everything", transform=ax.transAxes,
                ha="center", color="tab:red")
    else:
        accepted = conf >= threshold
        point_coverage = float(np.mean(accepted))
        point_risk = float(1.0 - np.mean(hits[accepted])) if accepted.any() else 0.0
        ax.scatter([point_coverage], [point_risk], s=80, color="tab:red", zorder=3,
                   label=f"threshold {threshold:.3f}: coverage {point_coverage:.2f}, "
                         f"risk {point_risk:.3f}")
        ax.axvline(point_coverage, color="tab:red", alpha=0.3)
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel("coverage (share answered by the fast path)")
    ax.set_ylabel("risk (error rate among answered)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(figure, path)
