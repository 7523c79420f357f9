"""Does the tuned threshold keep its promise on data it never saw? Repeats tune-then-evaluate over
many random splits of labelled BANKING77 predictions and counts violations, beside the naive rule.

Setup: TF-IDF + logistic regression trained on a fixed half of train.csv (seed 0); the other half
of train.csv plus test.csv are predicted once, giving a labelled pool (~8,000 rows). Each split
draws ``--tune-size`` rows from the pool to tune on (half fit temperature scaling, half choose
the threshold, exactly as ``slotgate tune`` does) and evaluates on all the other rows (the
held-back part, ~6,000 rows). A split *violates* when the accuracy of accepted held-back answers
is below the target. The naive rule uses the same calibrated confidences but takes the lowest
threshold whose accuracy on the threshold rows reaches the target, with no bound.

How the measured violation rate relates to delta: the guarantee says that, over the draw of the
tuning rows, the *true* accuracy of accepted answers (on the distribution the rows come from,
here the pool) is below the target with probability at most delta. The held-back accuracy is an
estimate of that true accuracy with its own sampling error (about sqrt(0.05 * 0.95 / 5000) ~ 0.003
at target 0.95 with ~5,000 accepted rows), so a threshold whose true accuracy sits just above the
target can still measure below it; with a large held-back part that effect is small, and the
Clopper-Pearson bound is conservative, so the measured rate should sit at or below delta. The
splits reuse one pool, so they are not independent: the interval printed for the violation rate
(Clopper-Pearson over splits) is a guide, not an exact test. When no threshold passes at a target
the policy escalates everything: coverage 0, and that split cannot violate.

Usage: .venv/bin/python -m bench.guarantee [--data DIR] [--splits 200] [--out FILE]
The last stdout line is one JSON object keyed by target.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def default_data_dir() -> Path:
    return Path(os.environ.get("SLOTGATE_DATA_DIR", ROOT.parent / "shared/data/banking77"))


def build_pool(data_dir: Path, *, train_fraction: float, seed: int) -> dict[str, Any]:
    """Train on a fixed part of train.csv; predict the rest of train.csv and test.csv."""
    from router.backends.sklearn import train_text_model
    from router.tuning.predictions import read_texts

    if not (data_dir / "train.csv").is_file():
        raise SystemExit(f"BANKING77 not found in {data_dir}: pass --data DIR (the folder holding "
                         "train.csv and test.csv) or set SLOTGATE_DATA_DIR")
    train = read_texts(data_dir / "train.csv", text_column="text", label_column="category",
                       require_labels=True)
    test = read_texts(data_dir / "test.csv", text_column="text", label_column="category",
                      require_labels=True)
    order = np.random.default_rng(seed).permutation(len(train.texts))
    cut = round(train_fraction * len(order))
    fit_rows, rest_rows = order[:cut], order[cut:]
    started = time.perf_counter()
    model = train_text_model([train.texts[i] for i in fit_rows],
                             [str(train.labels[i]) for i in fit_rows], kind="tfidf", seed=seed)
    train_s = time.perf_counter() - started
    texts = [train.texts[i] for i in rest_rows] + test.texts
    labels = [str(train.labels[i]) for i in rest_rows] + [str(x) for x in test.labels]
    proba = np.asarray(model.predict_proba(texts), dtype=np.float64)
    index = {label: j for j, label in enumerate(model.classes_)}
    y_true = np.array([index[label] for label in labels], dtype=np.int64)
    return {"proba": proba, "y_true": y_true, "n_fit": len(fit_rows), "train_s": train_s}


def one_split(proba: np.ndarray, y_true: np.ndarray, *, tune_size: int, target: float,
              delta: float, calibrator: str, seed: int) -> dict[str, Any]:
    """Tune on ``tune_size`` random rows, evaluate the guaranteed and naive thresholds on the rest."""
    from calibration.risk import naive_threshold
    from policies.tuning import answer_confidence, tune

    order = np.random.default_rng(seed).permutation(len(y_true))
    tune_rows, held_rows = order[:tune_size], order[tune_size:]
    result = tune(proba[tune_rows], y_true[tune_rows], calibrator=calibrator,
                  target_accuracy=target, delta=delta, seed=seed)
    naive = naive_threshold(result.confidence, result.correct, target_accuracy=target)
    held = proba[held_rows]
    answers, confidence = answer_confidence(held, result.calibrator.transform(held))
    correct = answers == y_true[held_rows]
    out: dict[str, Any] = {"held": len(held_rows)}
    for name, threshold in (("guaranteed", result.risk.threshold), ("naive", naive)):
        accepted = confidence >= threshold if threshold is not None else np.zeros(len(held), bool)
        accuracy = float(correct[accepted].mean()) if accepted.any() else None
        out[name] = {"threshold": threshold, "coverage": float(accepted.mean()),
                     "accepted_accuracy": accuracy,
                     "violated": accuracy is not None and accuracy < target}
    return out


def summarise(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    from calibration.metrics import proportion_ci

    summary: dict[str, Any] = {"splits": len(runs), "target": target}
    for name in ("guaranteed", "naive"):
        rows = [r[name] for r in runs]
        violations = sum(r["violated"] for r in rows)
        accuracies = [r["accepted_accuracy"] for r in rows if r["accepted_accuracy"] is not None]
        summary[name] = {
            "violation_rate": violations / len(rows),
            "violation_rate_ci": list(proportion_ci(violations, len(rows))),
            "mean_coverage": float(np.mean([r["coverage"] for r in rows])),
            "mean_accepted_accuracy": float(np.mean(accuracies)) if accuracies else None,
            "splits_without_threshold": sum(r["threshold"] is None for r in rows),
        }
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=default_data_dir())
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--tune-size", type=int, default=2000)
    parser.add_argument("--train-fraction", type=float, default=0.5)
    parser.add_argument("--targets", type=str, default="0.90,0.95,0.98")
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--calibrator", default="temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/guarantee.json")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    targets = [float(t) for t in args.targets.split(",")]
    started = time.perf_counter()
    pool = build_pool(args.data, train_fraction=args.train_fraction, seed=args.seed)
    proba, y_true = pool["proba"], pool["y_true"]
    if not 0 < args.tune_size < len(y_true) // 2:
        raise SystemExit(f"--tune-size must be in (0, {len(y_true) // 2}), got {args.tune_size}")
    runs: dict[float, list[dict[str, Any]]] = {t: [] for t in targets}
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("tune-then-evaluate splits", total=args.splits * len(targets))
        for split in range(args.splits):
            for target in targets:
                runs[target].append(one_split(proba, y_true, tune_size=args.tune_size,
                                              target=target, delta=args.delta,
                                              calibrator=args.calibrator,
                                              seed=args.seed + 1000 + split))
                bar.advance(task)
    summaries = {f"{t:.2f}": summarise(runs[t], t) for t in targets}
    held = len(y_true) - args.tune_size
    accuracy = float((proba.argmax(axis=1) == y_true).mean())
    console = Console(width=130)
    table = Table(title=f"guarantee check: {args.splits} splits, delta {args.delta}, tune "
                        f"{args.tune_size} rows, held-back {held} rows (pool {len(y_true)}, "
                        f"model accuracy {accuracy:.3f})")
    for column in ("target", "violation rate [95% CI]", "mean coverage", "mean accepted acc",
                   "no threshold", "naive violation rate", "naive mean coverage"):
        table.add_column(column, justify="right")
    for key, s in summaries.items():
        g, n = s["guaranteed"], s["naive"]
        ci = g["violation_rate_ci"]
        table.add_row(key, f"{g['violation_rate']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]",
                      f"{g['mean_coverage']:.3f}",
                      "n/a" if g["mean_accepted_accuracy"] is None
                      else f"{g['mean_accepted_accuracy']:.4f}",
                      str(g["splits_without_threshold"]), f"{n['violation_rate']:.3f}",
                      f"{n['mean_coverage']:.3f}")
    console.print(table)
    elapsed_s = time.perf_counter() - started
    report = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "pool_rows": len(y_true), "held_back_rows": held, "tune_rows": args.tune_size,
              "model_fit_rows": pool["n_fit"], "model_accuracy_on_pool": accuracy,
              "train_s": pool["train_s"], "elapsed_s": elapsed_s, "targets": summaries}
    report["config"]["data"] = "BANKING77 train.csv + test.csv"  # no machine paths in results
    report["config"].pop("out", None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"held-back part: {held} rows per split; wrote {args.out} in {elapsed_s:.0f} s")
    print(json.dumps({key: {"violation_rate": s["guaranteed"]["violation_rate"],
                            "naive_violation_rate": s["naive"]["violation_rate"],
                            "mean_coverage": s["guaranteed"]["mean_coverage"],
                            "splits": s["splits"]} for key, s in summaries.items()}))


if __name__ == "__main__":
    main()
