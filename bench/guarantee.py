"""Does the tuned threshold keep its promise on data it never saw, and how much does it accept?
Re-draws which rows of a labelled pool are labelled and which are held back, and on each draw
runs, on the same rows: slotgate's split and cross-fitted tuning (its threshold search), the
naive rule, and MAPIE 1.6's risk controller (``bench/guarantee_methods.py`` says how MAPIE is
asked for the promise).

Data: any labelled CSV or JSONL (``--data FILE ... --text-column --label-column``), or a folder
holding BANKING77's train.csv and test.csv (the default: both pooled, 13,083 rows). Fast model of
every draw: logistic regression on wordllama embeddings (``--model embeddings``: static
pretrained embeddings, so embedding the pool once leaks no label and no draw) or slotgate's own
TF-IDF pipeline (``--model tfidf``, what `train --kind tfidf` fits; 7 fits a draw). Each draw
takes ``--labelled`` random rows as the labelled data and holds back all the others:

- split: the model fits 70% of the labelled rows; of the other 30%, half fit the calibrator
  and half choose the threshold (``train --holdout 0.3`` + ``tune``);
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

Usage: python -m bench.guarantee [--data F.csv --text-column text --label-column label]
[--draws 200] [--labelled 4000] [--folds 5] [--model embeddings|tfidf] [--jobs N] [--quick]
The fits are the cost, the threshold choices are cheap: ``--save-scores F.npz`` keeps every
draw's confidences and correctness, ``--scores F.npz`` re-runs the choosers on them without a
fit. ``--save-embeddings`` / ``--embeddings`` embed once here and fit elsewhere. The last stdout
line is one JSON object: per target, per method, violation rate and coverage.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import guarantee_methods as gm
from bench.common import default_data_dir, is_default_data, result_path
from bench.guarantee_report import report_of, show


def default_data() -> list[Path]:
    return [default_data_dir()]


def read_pool(paths: list[Path], *, text_column: str, label_column: str
              ) -> tuple[np.ndarray, np.ndarray]:
    """Texts and labels (class indices) of every file; a folder stands for its train.csv and
    test.csv (BANKING77's layout)."""
    from router.tuning.predictions import PredictionsError, read_texts

    texts: list[str] = []
    labels: list[str] = []
    for path in paths:
        files = [path / "train.csv", path / "test.csv"] if path.is_dir() else [path]
        for file in files:
            try:
                rows = read_texts(file, text_column=text_column, label_column=label_column,
                                  require_labels=True)
            except PredictionsError as exc:
                raise SystemExit(f"--data: {exc} (pass --data FILE.csv --text-column T "
                                 "--label-column L, or a folder with train.csv and test.csv)"
                                 ) from exc
            texts += rows.texts
            labels += [str(label) for label in rows.labels]
    y = np.unique(np.asarray(labels), return_inverse=True)[1]
    return np.asarray(texts), y.astype(np.int64)


def load_pool(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, int]:
    """The model's inputs (texts for tfidf, embeddings otherwise), labels, class count."""
    saved = np.load(args.embeddings) if args.embeddings is not None else None
    if args.model == "tfidf":  # texts: each fit is slotgate's own TF-IDF pipeline
        texts, y = (saved["texts"], saved["y"]) if saved is not None else read_pool(
            args.data, text_column=args.text_column, label_column=args.label_column)
        return texts, y, int(y.max()) + 1
    if saved is not None:
        return saved["x"], saved["y"], int(saved["n_classes"])
    from router.backends.encoders import load_encoder

    texts, y = read_pool(args.data, text_column=args.text_column, label_column=args.label_column)
    x = np.asarray(load_encoder("wordllama")(list(texts)), dtype=np.float64)
    if args.save_embeddings is not None:
        np.savez_compressed(args.save_embeddings, x=x.astype(np.float32), y=y,
                            n_classes=int(y.max()) + 1, texts=texts)
    return x, y, int(y.max()) + 1


def one_draw(x: np.ndarray, y: np.ndarray, n_classes: int, *, labelled: int, n_folds: int,
             calibrator: str, seed: int) -> dict[str, gm.Scored]:
    """The three sets of rows one draw scores: split, cross-fitted, and fold 0's model."""
    order = np.random.default_rng(seed).permutation(len(y))
    lab, held = order[:labelled], order[labelled:]
    crossfit, fold0 = gm.crossfit_scores(x, y, lab, held, n_classes=n_classes,
                                         calibrator=calibrator, seed=seed, n_folds=n_folds)
    split = gm.split_scores(x, y, lab, held, n_classes=n_classes, calibrator=calibrator,
                            seed=seed)
    return {"split": split, "cross-fitted": crossfit, "fold-0": fold0}


def oof_draw(oof: np.ndarray, y: np.ndarray, *, labelled: int, n_folds: int, calibrator: str,
             seed: int) -> dict[str, gm.Scored]:
    order = np.random.default_rng(seed).permutation(len(y))
    return gm.oof_draw(oof, y, order[:labelled], order[labelled:], calibrator=calibrator,
                       seed=seed, n_folds=n_folds)


def fit_draws(args: argparse.Namespace, draws_n: int) -> tuple[list[dict[str, gm.Scored]],
                                                               dict[str, Any]]:
    from joblib import Parallel, delayed
    from rich.console import Console
    from rich.progress import Progress

    x, y, n_classes = load_pool(args)
    labelled = args.labelled if args.labelled is not None else min(4000, len(y) // 2 - 1)
    if not 0 < labelled < len(y) // 2:
        raise SystemExit(f"--labelled must be in (0, {len(y) // 2}), got {labelled}")
    seeds = [args.seed + 1000 + draw for draw in range(draws_n)]
    if args.fit_once:
        oof = gm.pool_oof(x, y, n_classes=n_classes, seed=args.seed, n_folds=args.folds)
        work = (delayed(oof_draw)(oof, y, labelled=labelled, n_folds=args.folds,
                                  calibrator=args.calibrator, seed=seed) for seed in seeds)
    else:
        work = (delayed(one_draw)(x, y, n_classes, labelled=labelled, n_folds=args.folds,
                                  calibrator=args.calibrator, seed=seed) for seed in seeds)
    draws = []
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("re-draws", total=draws_n)
        for result in Parallel(n_jobs=args.jobs, return_as="generator")(work):
            draws.append(result)
            bar.advance(task)
    pool = {"labelled_rows": labelled, "held_back_rows": len(y) - labelled,
            "pool_rows": len(y), "classes": n_classes, "model": args.model,
            "fit_once": args.fit_once, "folds": args.folds, "calibrator": args.calibrator,
            "data": ", ".join(str(p) for p in args.data)}
    return draws, pool


def save_scores(path: Path, draws: list[dict[str, gm.Scored]], pool: dict[str, Any]) -> None:
    """One file per set of rows (``F.split.npz``, ...), small enough to copy between machines:
    tuning confidences as float32, held-back ones as 1 - c in float16 (3 significant digits of
    the distance to 1, where thresholds sit)."""
    for rows in draws[0]:
        arrays: dict[str, Any] = {}
        for i, draw in enumerate(draws):
            scored = draw[rows]
            arrays[f"{i}/tune_confidence"] = scored.tune_confidence.astype(np.float32)
            arrays[f"{i}/tune_correct"] = scored.tune_correct
            arrays[f"{i}/held_distance"] = (1.0 - scored.held_confidence).astype(np.float16)
            arrays[f"{i}/held_correct"] = scored.held_correct
        arrays["pool"] = np.asarray(json.dumps(pool))
        np.savez_compressed(path.with_suffix(f".{rows}.npz"), **arrays)


def load_scores(path: Path) -> tuple[list[dict[str, gm.Scored]], dict[str, Any]]:
    draws: dict[int, dict[str, gm.Scored]] = {}
    pool: dict[str, Any] = {}
    for rows in ("split", "cross-fitted", "fold-0"):
        if not path.with_suffix(f".{rows}.npz").is_file():  # --fit-once saves no fold-0
            continue
        saved = np.load(path.with_suffix(f".{rows}.npz"))
        pool = json.loads(str(saved["pool"]))
        for i in sorted({int(key.split("/")[0]) for key in saved.files if key != "pool"}):
            draws.setdefault(i, {})[rows] = gm.Scored(
                saved[f"{i}/tune_confidence"].astype(np.float64), saved[f"{i}/tune_correct"],
                1.0 - saved[f"{i}/held_distance"].astype(np.float64), saved[f"{i}/held_correct"])
    return [draws[i] for i in sorted(draws)], pool


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, nargs="+", default=default_data(),
                        help="labelled CSV/JSONL files, or a folder with train.csv and test.csv")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--label-column", default="category")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--labelled", type=int, default=None,
                        help="labelled rows per draw (default 4000, at most half the pool)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--targets", type=str, default="0.90,0.95,0.98")
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--calibrator", default="temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="10 draws, a smoke run")
    parser.add_argument("--model", choices=("embeddings", "tfidf"), default="embeddings",
                        help="embeddings: LR on wordllama embeddings (cheap); tfidf: the real "
                             "TF-IDF pipeline of `train --kind tfidf` (7 fits a draw)")
    parser.add_argument("--jobs", type=int, default=1, help="draws fit in parallel (joblib)")
    parser.add_argument("--fit-once", action="store_true",
                        help="read the pool out-of-fold once and re-draw only which rows tune: "
                             "the search alone, in seconds (no final-model refit per draw)")
    parser.add_argument("--embeddings", type=Path, default=None)
    parser.add_argument("--save-embeddings", type=Path, default=None)
    parser.add_argument("--scores", type=Path, default=None,
                        help="choose thresholds on saved draws (--save-scores) without fitting")
    parser.add_argument("--save-scores", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/results/guarantee.json for a full run on the "
                             "default data, bench/results/local/guarantee.json otherwise")
    args = parser.parse_args(argv)
    out: Path = args.out or result_path(
        "guarantee.json", recorded=is_default_data(*args.data) and not args.quick
        and args.scores is None)

    started = time.perf_counter()
    targets = [float(t) for t in args.targets.split(",")]
    if args.scores is not None:
        draws, pool = load_scores(args.scores)
    else:
        draws, pool = fit_draws(args, 10 if args.quick else args.draws)
        if args.save_scores is not None:
            save_scores(args.save_scores, draws, pool)
    outcomes = [gm.choose_all(draw, targets=targets, delta=args.delta) for draw in draws]
    elapsed_s = time.perf_counter() - started
    command = " ".join(["python -m bench.guarantee", *(argv if argv is not None else
                                                       __import__("sys").argv[1:])])
    report = report_of(outcomes, targets=targets, delta=args.delta, pool=pool, args=args,
                       command=command, elapsed_s=elapsed_s)
    show(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out} in {elapsed_s:.0f} s")
    print(json.dumps({key: {name: {"violation_rate": s["violation_rate"],
                                   "mean_coverage": s["mean_coverage"]}
                            for name, s in per.items() if name != "vs MAPIE"}
                      for key, per in report["targets"].items()}))


if __name__ == "__main__":
    main()
