"""bench.guarantee's summary: per target and method, the violation rate with its interval,
coverage, and slotgate's coverage against MAPIE's on the same draws; printed as a table."""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from bench.guarantee_methods import METHODS

# slotgate's method against MAPIE's, both on the same cross-fitted rows.
OURS, THEIRS = "cross-fitted", "MAPIE (cross-fitted rows)"


def summarise(outcomes: list[dict[str, dict[str, Any]]], key: str) -> dict[str, Any]:
    from calibration.metrics import proportion_ci

    summary: dict[str, Any] = {}
    for name in METHODS:
        rows = [d[key][name] for d in outcomes if name in d[key]]
        if not rows:  # --fit-once has no fold-0 model
            continue
        violations = sum(r["violated"] for r in rows)
        accuracies = [r["accepted_accuracy"] for r in rows if r["accepted_accuracy"] is not None]
        summary[name] = {
            "violation_rate": violations / len(rows),
            "violation_rate_ci": list(proportion_ci(violations, len(rows))),
            "mean_coverage": float(np.mean([r["coverage"] for r in rows])),
            "mean_accepted_accuracy": float(np.mean(accuracies)) if accuracies else None,
            "draws_without_threshold": sum(r["threshold"] is None for r in rows),
            # tuning rows' minus held-back rows' accepted accuracy at the chosen threshold
            "mean_optimism": float(np.mean(
                [r["tune_accepted_accuracy"] - r["accepted_accuracy"] for r in rows
                 if r["accepted_accuracy"] is not None])) if accuracies else None,
        }
    ours = np.array([d[key][OURS]["coverage"] for d in outcomes])
    theirs = np.array([d[key][THEIRS]["coverage"] for d in outcomes])
    summary["vs MAPIE"] = {
        "methods": [OURS, THEIRS],
        "mean_coverage_difference": float(np.mean(ours - theirs)),
        "draws_at_least_mapie": int(np.sum(ours >= theirs - 1e-12)),
        "draws": len(outcomes),
    }
    return summary


def report_of(outcomes: list[dict[str, dict[str, Any]]], *, targets: list[float], delta: float,
              pool: dict[str, Any], args: argparse.Namespace, command: str,
              elapsed_s: float) -> dict[str, Any]:
    import sklearn

    summaries = {f"{t:.2f}": summarise(outcomes, f"{t:.2f}") for t in targets}
    headline = {f"{key} {name}": f"violation {s['violation_rate']:.3f}, coverage "
                f"{s['mean_coverage']:.3f}" for key, per in summaries.items()
                for name, s in per.items() if name in (OURS, THEIRS)}
    # How the draws were fit: from the saved scores' record when re-run with --scores.
    model, fit_once = pool.get("model", args.model), pool.get("fit_once", args.fit_once)
    return {
        "command": command, "draws": len(outcomes), "folds": args.folds,
        "calibrator": args.calibrator, "data": ", ".join(str(p) for p in args.data), **pool,
        "delta": delta,
        "fast_model": "logistic regression on wordllama embeddings (cheap re-draw model)"
        if model == "embeddings" else "slotgate's TF-IDF pipeline (train --kind tfidf)",
        "fits": "once: the pool read out-of-fold, draws re-draw the tuning rows (--fit-once)"
        if fit_once else "every draw: 7 fits (split, 5 folds, final)",
        "elapsed_s": elapsed_s, "cpus": os.cpu_count(), "jobs": args.jobs,
        "scikit_learn": sklearn.__version__, "headline": headline, "targets": summaries,
    }


def show(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report['draws']} re-draws, delta {report['delta']}, "
                        f"{report['labelled_rows']} labelled rows, {report['held_back_rows']} "
                        f"held back; {report['fast_model']}, {report['calibrator']}")
    for column in ("target", "method", "violation rate [95% CI]", "mean coverage",
                   "mean accepted acc", "no threshold"):
        table.add_column(column, justify="right")
    for key, per_method in report["targets"].items():
        for name, s in per_method.items():
            if name == "vs MAPIE":
                table.add_row(key, f"{OURS} - MAPIE", "", f"{s['mean_coverage_difference']:+.3f}",
                              f">= MAPIE in {s['draws_at_least_mapie']}/{s['draws']}", "")
                continue
            ci = s["violation_rate_ci"]
            acc = s["mean_accepted_accuracy"]
            table.add_row(key, name, f"{s['violation_rate']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]",
                          f"{s['mean_coverage']:.3f}", "n/a" if acc is None else f"{acc:.4f}",
                          str(s["draws_without_threshold"]))
    Console(width=150).print(table)
