"""The models, policies and scored rows behind bench/watch.py, built with the `slotgate` CLI as a
user builds them (README): the cross-fitted default (train --cv 5 on all of train.csv, tune on
the out-of-fold reads), the split-tuned one (train --holdout 0.3), and a novel-class one that
never saw ``n_novel`` intents (cross-fitted on half the other intents' train.csv rows; the other
half and their test.csv rows are its unseen known traffic). Built once into ``work`` (delete a
policy .json there to re-tune it, its model and reads are kept)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from bench.drift_data import Scored


@dataclass(frozen=True)
class Built:
    name: str
    model: Path
    policy: Path


def read_csv(path: Path) -> list[tuple[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return [(row["text"], row["category"]) for row in csv.DictReader(f)]


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "category"])
        writer.writerows(rows)
    return path


def slotgate(*args: str | Path) -> None:
    """One `slotgate` command, as a user runs it (its output kept out of the bench's)."""
    cmd = [str(Path(sys.executable).with_name("slotgate")), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")


def crossfit(work: Path, name: str, data: Path, *, target: float, audit_rate: float) -> Built:
    model, oof, policy = work / f"{name}.joblib", work / f"{name}-oof.jsonl", work / f"{name}.json"
    if not oof.is_file():
        slotgate("train", "--question", "intent", "--data", data, "--label-column", "category", "--kind", "tfidf",
                 "--cv", "5", "--oof-out", oof, "--out", model, "--seed", "0")
    if not policy.is_file():
        slotgate("tune", "--preds", oof, "--model", model, "--target-accuracy", str(target),
                 "--audit-rate", str(audit_rate), "--out", policy, "--name", name)
    return Built(name, model, policy)


def split_tuned(work: Path, data: Path, *, target: float, audit_rate: float) -> Built:
    model, tune_csv = work / "split.joblib", work / "split-tune.csv"
    preds, policy = work / "split-tune.jsonl", work / "split.json"
    if not preds.is_file():
        slotgate("train", "--question", "intent", "--data", data, "--label-column", "category", "--kind", "tfidf",
                 "--holdout", "0.3", "--holdout-out", tune_csv, "--out", model, "--seed", "0")
        slotgate("predict", "--model", model, "--data", tune_csv, "--label-column", "category",
                 "--out", preds)
    if not policy.is_file():
        slotgate("tune", "--preds", preds, "--target-accuracy", str(target),
                 "--audit-rate", str(audit_rate), "--out", policy, "--name", "split")
    return Built("split", model, policy)


def novel_split(data: Path, *, n_novel: int, seed: int) -> tuple[
        list[str], list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """(novel intents, fit rows, unseen known rows, novel rows): the novel intents' rows are in
    no fit row; the known intents' train rows are halved (seeded) into fit and unseen."""
    options = [str(o) for o in json.loads((data / "categories.json").read_text())]
    rng = np.random.default_rng(seed)
    novel = sorted(str(o) for o in rng.choice(options, size=n_novel, replace=False))
    train, test = read_csv(data / "train.csv"), read_csv(data / "test.csv")
    known_train = [r for r in train if r[1] not in novel]
    fit_mask = rng.random(len(known_train)) < 0.5
    fit = [r for r, m in zip(known_train, fit_mask, strict=True) if m]
    unseen = [r for r, m in zip(known_train, fit_mask, strict=True) if not m]
    unseen += [r for r in test if r[1] not in novel]
    novel_rows = [r for r in train + test if r[1] in novel]
    return novel, fit, unseen, novel_rows


def score(built: Built, rows: list[tuple[str, str]]) -> Scored:
    """``bench.drift_data.score`` of ``rows`` (text, label) under a built model and policy."""
    from bench.drift_data import Rows
    from bench.drift_data import score as score_rows
    from policies.file import load_policy
    from router.backends.sklearn import SklearnBackend

    policy = load_policy(built.policy)
    options = list(policy.options or SklearnBackend(built.model).model.labels)
    return score_rows(built.model, policy, options,
                      Rows([t for t, _ in rows], [label for _, label in rows]))


def per_intent_accuracy(rows: Scored) -> dict[str, float]:
    """Accepted accuracy per true intent (the mix-shift scenario's pick of easy intents)."""
    out: dict[str, float] = {}
    labels = np.array(rows.labels)
    for label in sorted(set(rows.labels)):
        mask = (labels == label) & rows.accepted
        out[label] = float(rows.correct[mask].mean()) if mask.any() else 0.0
    return out


def indices(labels: list[str], wanted: set[str]) -> NDArray[np.int64]:
    return np.array([i for i, label in enumerate(labels) if label in wanted], dtype=np.int64)
