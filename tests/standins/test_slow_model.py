"""The disagreeing stand-in slow model (standins/slow_model.py): fit on one seeded half of each
intent's rows, never the other; on held-out messages it is a usable classifier whose answers are
not the fast tier's."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from router.backends.sklearn import build_tfidf_pipeline
from standins.llm import estimator_chooser
from standins.slow_model import half_of, train_slow_model
from tests.test_doc_blocks import sample_csv


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_half_of_takes_half_of_every_label_and_is_seeded() -> None:
    rows = [{"text": f"{label} {i}", "category": label} for label in "abc" for i in range(9)]
    half = half_of(rows, label_column="category", seed=0)
    assert sorted(r["category"] for r in half) == ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    assert half == half_of(rows, label_column="category", seed=0)
    assert half != half_of(rows, label_column="category", seed=1)


def test_it_disagrees_with_the_fast_tier_on_messages_neither_saw(
        tmp_path: Path, banking77_dir: Path) -> None:
    sample_csv(banking77_dir / "train.csv", tmp_path / "train.csv", 20, seed=0)
    sample_csv(banking77_dir / "test.csv", tmp_path / "test.csv", 4, seed=1)
    train, test = read(tmp_path / "train.csv"), read(tmp_path / "test.csv")
    fast = build_tfidf_pipeline().fit([r["text"] for r in train], [r["category"] for r in train])
    slow = train_slow_model(tmp_path / "train.csv")
    texts, truth = [r["text"] for r in test], np.array([r["category"] for r in test])
    fast_answers, slow_answers = fast.predict(texts), slow.predict(texts)
    agreement = float(np.mean(fast_answers == slow_answers))
    assert 0.5 < agreement < 0.97, agreement
    assert float(np.mean(slow_answers == truth)) > 0.5
    # Served as the stand-in serves it: its choice among the request's options.
    choose = estimator_chooser(slow)
    intents = sorted(set(truth))
    assert [choose(t, intents) for t in texts[:20]] == list(slow_answers[:20])
