"""Does the tuned threshold keep its promise on data it never saw, and how much does it accept?
Re-draws which BANKING77 rows are labelled and which are held back, and on each draw runs, on the
same rows: slotgate's split tuning, slotgate's cross-fitted tuning, the naive rule, and MAPIE
1.6's risk controller (``bench/guarantee_methods.py`` says how MAPIE is asked for the promise).

Setup: train.csv and test.csv are pooled (13,083 rows) and embedded once with wordllama (static
pretrained embeddings: no label and no draw is involved, so embedding once leaks nothing). The
fast model of every draw is logistic regression on those embeddings: the "cheaper fast model"
that makes hundreds of re-fits affordable (7 fits per draw). Each draw takes ``--labelled``
random rows as the labelled data and holds back all the others:

- split: the model fits 70% of the labelled rows; of the other 30%, half fit the calibrator
  and half choose the threshold (today's ``train --holdout 0.3`` + ``tune``);
- cross-fitted: K-fold out-of-fold reads of every labelled row, the calibrator cross-fitted on
  the same folds, threshold on all rows; the final model and calibrator fit on all rows
  (``train --cv K --oof-out`` + ``tune``);
- naive (split rows): the lowest threshold whose observed accuracy reaches the target;
- MAPIE on the split rows and on the cross-fitted rows: the same calibrated confidences, the
  threshold chosen by ``BinaryClassificationController`` (defaults, and fixed-sequence).

A draw *violates* when the accuracy of accepted held-back answers is below the target. How that
rate relates to delta (the held-back accuracy is itself an estimate; draws share one pool) is in
docs/calibration.md. When no threshold passes, the policy escalates everything: coverage 0, and
that draw cannot violate.

Usage: python -m bench.guarantee [--draws 200] [--labelled 4000] [--folds 5] [--jobs N] [--quick]
``--save-embeddings F.npz`` / ``--embeddings F.npz`` embed once here and run the draws elsewhere
(a machine with more cores and no wordllama). The last stdout line is one JSON object: per target, per method, violation rate and coverage.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import guarantee_methods as gm

ROOT = Path(__file__).resolve().parent.parent
METHODS: dict[str, tuple[str, Callable[..., float | None]]] = {
    # name: (which rows choose the threshold, chooser)
    "split": ("split", gm.slotgate_threshold),
    "cross-fitted": ("cross-fitted", gm.slotgate_threshold),
    "naive (split rows)": ("split", gm.naive_threshold),
    "cross-fitted, fold-0 model serves (diagnostic)": ("fold-0", gm.slotgate_threshold),
    "MAPIE (split rows)": ("split", gm.mapie_threshold),
    "MAPIE (cross-fitted rows)": ("cross-fitted", gm.mapie_threshold),
    "MAPIE fixed-sequence (cross-fitted rows)": (
        "cross-fitted", lambda s, **kw: gm.mapie_threshold(s, fixed_sequence=True, **kw)),
}


def default_data_dir() -> Path:
    return Path(os.environ.get("SLOTGATE_DATA_DIR", ROOT.parent / "shared/data/banking77"))


def load_pool(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, int]:
    if args.model == "tfidf":  # texts: each fit is slotgate's own TF-IDF pipeline
        saved = np.load(args.embeddings) if args.embeddings is not None else None
        texts, y = (saved["texts"], saved["y"]) if saved is not None else read_pool(args.data)
        return texts, y, int(y.max()) + 1
    if args.embeddings is not None:
        saved = np.load(args.embeddings)
        return saved["x"], saved["y"], int(saved["n_classes"])
    x, y, n_classes = embed_pool(args.data)
    if args.save_embeddings is not None:
        texts, _ = read_pool(args.data)
        np.savez_compressed(args.save_embeddings, x=x.astype(np.float32), y=y, n_classes=n_classes,
                            texts=texts)
    return x, y, n_classes


def read_pool(data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """train.csv + test.csv: texts, and labels as class indices."""
    from router.tuning.predictions import read_texts

    if not (data_dir / "train.csv").is_file():
        raise SystemExit(f"BANKING77 not found in {data_dir}: pass --data DIR (the folder holding "
                         "train.csv and test.csv) or set SLOTGATE_DATA_DIR")
    texts: list[str] = []
    labels: list[str] = []
    for name in ("train.csv", "test.csv"):
        rows = read_texts(data_dir / name, text_column="text", label_column="category",
                          require_labels=True)
        texts += rows.texts
        labels += [str(label) for label in rows.labels]
    y = np.unique(np.asarray(labels), return_inverse=True)[1]
    return np.asarray(texts), y.astype(np.int64)


def embed_pool(data_dir: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """wordllama embeddings of train.csv + test.csv, labels as class indices, class count."""
    from router.backends.embedding import load_encoder

    texts, y = read_pool(data_dir)
    features = np.asarray(load_encoder("wordllama")(list(texts)), dtype=np.float64)
    return features, y, int(y.max()) + 1


def one_draw(x: np.ndarray, y: np.ndarray, n_classes: int, *, labelled: int, n_folds: int,
             targets: list[float], delta: float, calibrator: str, seed: int
             ) -> dict[str, dict[str, Any]]:
    order = np.random.default_rng(seed).permutation(len(y))
    lab, held = order[:labelled], order[labelled:]
    crossfit, fold0 = gm.crossfit_scores(x, y, lab, held, n_classes=n_classes,
                                         calibrator=calibrator, seed=seed, n_folds=n_folds)
    scored = {
        "split": gm.split_scores(x, y, lab, held, n_classes=n_classes, calibrator=calibrator,
                                 seed=seed),
        "cross-fitted": crossfit, "fold-0": fold0,
    }
    out: dict[str, dict[str, Any]] = {}
    for target in targets:
        key = f"{target:.2f}"
        out[key] = {}
        for name, (rows, chooser) in METHODS.items():
            threshold = chooser(scored[rows], target=target, delta=delta)
            out[key][name] = gm.outcome(scored[rows], threshold, target)
    return out


def summarise(draws: list[dict[str, dict[str, Any]]], key: str) -> dict[str, Any]:
    from calibration.metrics import proportion_ci

    summary: dict[str, Any] = {}
    for name in METHODS:
        rows = [d[key][name] for d in draws]
        violations = sum(r["violated"] for r in rows)
        accuracies = [r["accepted_accuracy"] for r in rows if r["accepted_accuracy"] is not None]
        summary[name] = {
            "violation_rate": violations / len(rows),
            "violation_rate_ci": list(proportion_ci(violations, len(rows))),
            "mean_coverage": float(np.mean([r["coverage"] for r in rows])),
            "mean_accepted_accuracy": float(np.mean(accuracies)) if accuracies else None,
            "draws_without_threshold": sum(r["threshold"] is None for r in rows),
            # tuning rows' minus held-back rows' accepted accuracy at the chosen threshold, on average
            "mean_optimism": float(np.mean(
                [r["tune_accepted_accuracy"] - r["accepted_accuracy"] for r in rows
                 if r["accepted_accuracy"] is not None])) if accuracies else None,
        }
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=default_data_dir())
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--labelled", type=int, default=4000)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--targets", type=str, default="0.90,0.95,0.98")
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--calibrator", default="temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="10 draws, a smoke run")
    parser.add_argument("--model", choices=("embeddings", "tfidf"), default="embeddings",
                        help="embeddings: LR on wordllama embeddings (cheap); tfidf: the real "
                             "TF-IDF pipeline of `train --kind tfidf` (7 fits a draw)")
    parser.add_argument("--jobs", type=int, default=1, help="draws run in parallel (joblib)")
    parser.add_argument("--embeddings", type=Path, default=None)
    parser.add_argument("--save-embeddings", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/guarantee.json")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    draws_n = 10 if args.quick else args.draws
    targets = [float(t) for t in args.targets.split(",")]
    started = time.perf_counter()
    x, y, n_classes = load_pool(args)
    if not 0 < args.labelled < len(y) // 2:
        raise SystemExit(f"--labelled must be in (0, {len(y) // 2}), got {args.labelled}")
    from joblib import Parallel, delayed

    work = (delayed(one_draw)(x, y, n_classes, labelled=args.labelled, n_folds=args.folds,
                              targets=targets, delta=args.delta, calibrator=args.calibrator,
                              seed=args.seed + 1000 + draw) for draw in range(draws_n))
    draws = []
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("re-draws", total=draws_n)
        for result in Parallel(n_jobs=args.jobs, return_as="generator")(work):
            draws.append(result)
            bar.advance(task)
    summaries = {f"{t:.2f}": summarise(draws, f"{t:.2f}") for t in targets}
    held = len(y) - args.labelled
    table = Table(title=f"{draws_n} re-draws, delta {args.delta}, {args.labelled} labelled rows, "
                        f"{held} held back; {args.model} model, {args.calibrator}")
    for column in ("target", "method", "violation rate [95% CI]", "mean coverage",
                   "mean accepted acc", "no threshold"):
        table.add_column(column, justify="right")
    for key, per_method in summaries.items():
        for name, s in per_method.items():
            ci = s["violation_rate_ci"]
            acc = s["mean_accepted_accuracy"]
            table.add_row(key, name, f"{s['violation_rate']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]",
                          f"{s['mean_coverage']:.3f}", "n/a" if acc is None else f"{acc:.4f}",
                          str(s["draws_without_threshold"]))
    Console(width=140).print(table)
    elapsed_s = time.perf_counter() - started
    headline = {f"{key} {name}": f"violation {s['violation_rate']:.3f}, coverage "
                f"{s['mean_coverage']:.3f}" for key, per in summaries.items()
                for name, s in per.items() if name in ("cross-fitted", "MAPIE (cross-fitted rows)")}
    command = "python -m bench.guarantee" + (" --quick" if args.quick else
                                              f" --draws {draws_n}") + (
        f" --model {args.model}" if args.model != "embeddings" else "") + (
        f" --jobs {args.jobs}" if args.jobs != 1 else "")
    report = {"command": command, "draws": draws_n, "labelled_rows": args.labelled,
              "held_back_rows": held, "pool_rows": len(y), "folds": args.folds,
              "delta": args.delta, "calibrator": args.calibrator,
              "fast_model": "logistic regression on wordllama embeddings (cheap re-draw model)"
              if args.model == "embeddings" else "slotgate's TF-IDF pipeline (train --kind tfidf)",
              "data": "BANKING77 train.csv + test.csv", "elapsed_s": elapsed_s,
              "cpus": os.cpu_count(), "jobs": args.jobs,
              "headline": headline, "targets": summaries}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} in {elapsed_s:.0f} s")
    print(json.dumps({key: {name: {"violation_rate": s["violation_rate"],
                                   "mean_coverage": s["mean_coverage"]}
                            for name, s in per.items()} for key, per in summaries.items()}))


if __name__ == "__main__":
    main()
