"""The data behind bench/drift.py: BANKING77 (train.csv and test.csv, distinct texts) where a few
intents are rare in everything the fast model and its policy saw, and frequent after the shift.

Rows of the common intents, plus a small share of the rare intents' rows, are shuffled together
and cut into fit / tune / stream parts, so tuning rows and the unshifted stream are exchangeable
(what the false-alarm rate needs). The remaining rows of the rare intents are the shift pool.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

RARE_MIN_FIT = 2  # rows of each rare intent kept for fitting, so the model knows every option


@dataclass(frozen=True)
class Rows:
    texts: list[str]
    labels: list[str]

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class Split:
    options: list[str]
    rare: list[str]
    fit: Rows
    tune: Rows
    stream: Rows  # unshifted: exchangeable with ``tune``
    shift: Rows  # rare intents only


@dataclass(frozen=True)
class Scored:
    """A policy's view of some rows: the fast answer, its confidence, whether it was accepted and
    whether it is right."""

    texts: list[str]
    labels: list[str]
    answers: list[str]
    confidence: NDArray[np.float64]
    accepted: NDArray[np.bool_]
    correct: NDArray[np.bool_]


def split(data: Path, *, n_rare: int, rare_keep: float, seed: int,
          fractions: tuple[float, float] = (0.45, 0.20)) -> Split:
    rows: dict[str, str] = {}
    for name in ("train.csv", "test.csv"):
        with (data / name).open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                rows.setdefault(row["text"], row["category"])
    options = [str(o) for o in json.loads((data / "categories.json").read_text())]
    rng = np.random.default_rng(seed)
    rare = sorted(str(o) for o in rng.choice(options, size=n_rare, replace=False))
    items = list(rows.items())
    normal, shift, fit_rare = [], [], []
    seen: dict[str, int] = {}
    for i in rng.permutation(len(items)):
        text, label = items[i]
        if label not in rare:
            normal.append((text, label))
            continue
        seen[label] = seen.get(label, 0) + 1
        if seen[label] <= RARE_MIN_FIT:
            fit_rare.append((text, label))
        elif rng.random() < rare_keep:
            normal.append((text, label))
        else:
            shift.append((text, label))
    a = round(len(normal) * fractions[0])
    b = a + round(len(normal) * fractions[1])

    def rows_of(pairs: list[tuple[str, str]]) -> Rows:
        return Rows([t for t, _ in pairs], [label for _, label in pairs])

    return Split(options, rare, rows_of(normal[:a] + fit_rare), rows_of(normal[a:b]),
                 rows_of(normal[b:]), rows_of(shift))


def build(work: Path, parts: Split, *, target: float, delta: float, audit_rate: float,
          seed: int) -> tuple[Path, Path]:
    """The TF-IDF fast model (fit rows) and its policy (tune rows, as ``slotgate tune`` does,
    with the tuning-rows summary and ``audit_rate``). Returns (model path, policy path)."""
    from policies.policy import Policy
    from policies.scope import Question
    from policies.types import canonical_hash
    from router.backends.sklearn import SklearnBackend, save_text_model, train_text_model

    work.mkdir(parents=True, exist_ok=True)
    model_path, policy_path = work / "fast.joblib", work / "policy.json"
    pipeline = train_text_model(parts.fit.texts, parts.fit.labels, kind="tfidf", seed=seed)
    if [str(c) for c in pipeline.classes_] != sorted(parts.options):
        raise RuntimeError("the fast model did not learn every intent")
    intent = Question.asked("intent")  # what bench.live asks: the json_schema named "intent"
    save_text_model(model_path, pipeline, kind="tfidf", n_train=len(parts.fit),
                    data_hash=canonical_hash([parts.fit.texts, parts.fit.labels]),
                    question=intent)
    backend = SklearnBackend(model_path)
    proba = _proba(backend, parts.options, parts.tune.texts)
    y_true = np.array([parts.options.index(label) for label in parts.tune.labels])
    fitted = Policy(calibrator="temperature", target_accuracy=target, delta=delta,
                              seed=seed).fit(proba, y_true, options=parts.options)
    fitted.to_file(name="banking77-drift", backend_fingerprint=backend.fingerprint,
                   question=intent,
                   data_hash=canonical_hash([parts.tune.texts, parts.tune.labels]),
                   audit_rate=audit_rate, on_alarm="escalate_all").write(policy_path)
    return model_path, policy_path


def score(model_path: Path, policy: Any, options: list[str], rows: Rows) -> Scored:
    """What the proxy's fast tier does with ``rows`` under ``policy`` (a PolicyFile): the fast
    answer (the raw argmax), its calibrated confidence, the policy's own verdict (its bars, per
    answer too) and whether it is right (a label the model never learnt is wrong)."""
    from policies.policy import Policy
    from policies.types import OptionScores
    from router.backends.sklearn import SklearnBackend

    proba = _proba(SklearnBackend(model_path), options, rows.texts)
    runtime = Policy.from_file(policy)
    answers = []
    confidence = np.empty(len(rows))
    accepted = np.empty(len(rows), dtype=bool)
    for i, p in enumerate(proba):
        scores = OptionScores(tuple(options), tuple(float(v) for v in p))
        verdict, calibrated = runtime.decide(scores)
        answers.append(options[scores.top_index])
        confidence[i], accepted[i] = calibrated[scores.top_index], verdict.accept
    correct = np.array([a == t for a, t in zip(answers, rows.labels, strict=True)])
    return Scored(rows.texts, rows.labels, answers, confidence, accepted, correct)


def _proba(backend: Any, options: list[str], texts: list[str]) -> NDArray[np.float64]:
    """The backend's probabilities in ``options`` order (what a 77-option request reads)."""
    columns = [backend.model.labels.index(o) for o in options]
    proba = backend.model.predict_proba(texts)[:, columns]
    return np.asarray(proba / proba.sum(axis=1, keepdims=True), dtype=np.float64)
