"""A stand-in slow model that disagrees with the fast tier where a larger model would: another
model kind (word 1-2-gram TF-IDF, logistic regression fit by stochastic gradient descent) fit on
one seeded half of a labelled CSV, so its errors are its own and not the fast tier's.

The demo's fast tier (``make serve``) is TF-IDF over words *and* characters with exact logistic
regression on all of train.csv: on BANKING77's test.csv this model agrees with it on about 0.89
of the messages and is right on 0.86 (the fast tier: 0.91), scikit-learn only, about 10 s to fit.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def half_of(rows: Sequence[dict[str, str]], *, label_column: str, seed: int) -> list[dict[str, str]]:
    """Half of each label's rows (rounded down, at least one), drawn with ``seed``: the rows
    the model is fit on; the other half it never sees."""
    by_label: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_label.setdefault(row[label_column], []).append(row)
    rng = random.Random(seed)
    picked = []
    for label in sorted(by_label):
        group = list(by_label[label])
        rng.shuffle(group)
        picked.extend(group[:max(1, len(group) // 2)])
    return picked


def train_slow_model(csv_path: Path, *, text_column: str = "text",
                     label_column: str = "category", seed: int = 0) -> Any:
    """The fitted pipeline (``predict_proba``, ``classes_`` over the labels)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import SGDClassifier
    from sklearn.pipeline import make_pipeline

    with csv_path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    missing = {text_column, label_column} - set(rows[0] if rows else {})
    if missing:
        raise ValueError(f"{csv_path}: no column {sorted(missing)} (columns: "
                         f"{sorted(rows[0]) if rows else 'none, the file is empty'})")
    half = half_of(rows, label_column=label_column, seed=seed)
    pipeline = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
        SGDClassifier(loss="log_loss", alpha=1e-5, max_iter=30, tol=None, random_state=seed))
    return pipeline.fit([r[text_column] for r in half], [r[label_column] for r in half])
