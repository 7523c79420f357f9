"""The offline half of the cascade benchmark: train the tiers with the ``slotgate`` CLI, tune one
policy per fast tier and target, and score every operating point on all of BANKING77 test.csv.

A fast tier's answer is accepted when its policy says so and is otherwise the slow tier's answer;
every figure here is computed from prediction files, none from the proxy (``cascade_live.py``).
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

FAST_KINDS = ("tfidf", "wordllama")
SLOW_KIND = "minilm"
HOLDOUT = 0.3  # share of train.csv carved out (seeded) for tuning; the fast tiers never see it


@dataclass(frozen=True)
class Tier:
    """One model's reads of test.csv: its answer per row and whether it is right."""

    kind: str
    preds_path: Path
    answers: list[str]
    correct: NDArray[np.bool_]
    fingerprint: str


def stamp(data: Path, *, seed: int) -> str:
    """What the cached artifacts depend on: the data files, the seed, the carve."""
    digest = hashlib.sha256()
    for name in ("train.csv", "test.csv"):
        digest.update((data / name).read_bytes())
    digest.update(f"seed={seed};holdout={HOLDOUT};kinds={FAST_KINDS}+{SLOW_KIND}".encode())
    return digest.hexdigest()[:16]


def build(data: Path, work: Path, *, seed: int, targets: tuple[float, ...], delta: float
          ) -> dict[str, Any]:
    """Models, predictions and policies under ``work``; each stage is reused while its stamp
    file matches (MiniLM encoding of BANKING77 alone takes about a minute on 2 cores)."""
    from bench.live import slotgate

    base = stamp(data, seed=seed)
    labelled = ("--label-column", "category")
    redone = []

    def predict(kind: str, rows: Path, out: Path) -> None:
        slotgate("predict", "--model", work / f"{kind}.joblib", "--data", rows, *labelled,
                 "--out", out)

    if stale(work / "slow.stamp", base):  # the slow tier learns from all of train.csv
        slotgate("train", "--question", "intent", "--data", data / "train.csv", *labelled, "--kind", SLOW_KIND, "--out",
                 work / f"{SLOW_KIND}.joblib", "--seed", seed)
        predict(SLOW_KIND, data / "test.csv", work / f"test-{SLOW_KIND}.jsonl")
        redone.append(mark(work / "slow.stamp", base))
    if stale(work / "fast.stamp", base):
        for kind in FAST_KINDS:  # same seed, same permutation: both carve the same tune.csv
            slotgate("train", "--question", "intent", "--data", data / "train.csv", *labelled, "--kind", kind, "--out",
                     work / f"{kind}.joblib", "--holdout", HOLDOUT, "--holdout-out",
                     work / "tune.csv", "--seed", seed)
            predict(kind, work / "tune.csv", work / f"tune-{kind}.jsonl")
            predict(kind, data / "test.csv", work / f"test-{kind}.jsonl")
        redone.append(mark(work / "fast.stamp", base))
    policies_key = f"{base};targets={targets};delta={delta}"
    if redone or stale(work / "policies.stamp", policies_key):
        for kind in FAST_KINDS:
            for target in targets:
                slotgate("tune", "--preds", work / f"tune-{kind}.jsonl", "--out",
                         policy_path(work, kind, target), "--target-accuracy", target,
                         "--delta", delta, "--name", policy_name(kind, target), "--seed", seed)
        redone.append(mark(work / "policies.stamp", policies_key))
    return {"rebuilt": redone, "n_tune": count_rows(work / "tune.csv")}


def stale(path: Path, key: str) -> bool:
    return not path.is_file() or path.read_text() != key


def mark(path: Path, key: str) -> str:
    path.write_text(key)
    return path.stem


def policy_name(kind: str, target: float) -> str:
    return f"{kind}-t{target:g}"


def policy_path(work: Path, kind: str, target: float) -> Path:
    return work / f"policy-{policy_name(kind, target)}.json"


def count_rows(path: Path) -> int:
    with path.open(newline="", encoding="utf-8") as f:
        return sum(1 for _ in csv.DictReader(f))


def load_tier(kind: str, preds_path: Path, labels: list[str]
              ) -> tuple[Tier, NDArray[np.float64], tuple[str, ...]]:
    """A tier's answers on test.csv (rows in file order), raw probabilities and options."""
    from router.tuning.predictions import read_predictions

    preds = read_predictions(preds_path)
    if [str(x) for x in preds.labels] != labels:
        raise SystemExit(f"{preds_path}: rows do not follow test.csv (rebuild: delete the folder)")
    answers = [preds.options[j] for j in preds.proba.argmax(axis=1)]
    correct = np.array([a == y for a, y in zip(answers, labels, strict=True)])
    fingerprint = next((f for f in preds.fingerprints if f), "unknown")
    return (Tier(kind, preds_path, answers, correct, fingerprint), preds.proba,
            tuple(preds.options))


def fixed_policy(path: Path, *, name: str, accept_all: bool, fingerprint: str,
                 options: Sequence[str] | None = None) -> Path:
    """A policy file that accepts every fast answer (fast alone) or escalates every decision
    (slow alone): the two ends of the frontier, served by the same proxy as the tuned points.
    ``options``: its scope with the question the cascade asks, the json_schema named "intent"
    (policies/scope.py); the proxy refuses a file that records no question."""
    from calibration.calibrators import IdentityCalibrator
    from policies.file import PolicyFile
    from policies.rules import ThresholdRule
    from policies.scope import Question, scope_signature

    threshold = 0.0 if accept_all else None
    intent = Question.asked("intent")
    scope = {} if options is None else {"options": list(options), "question": intent.as_dict(),
                                        "signature": scope_signature(options, intent)}
    PolicyFile(name=name, backend_fingerprint=fingerprint,
               calibrator=IdentityCalibrator().to_dict(), rule=ThresholdRule(threshold).to_dict(),
               target_accuracy=1.0, delta=0.5, bound=0.0,
               coverage=1.0 if accept_all else 0.0, n_tune=1, n_calibration=0,
               data_hash="0" * 64, **scope).write(path)
    return path


def accept_mask(policy_file: Path, proba: NDArray[np.float64], options: tuple[str, ...]
                ) -> tuple[NDArray[np.bool_], NDArray[np.float64], dict[str, Any]]:
    """Run the tuned policy row by row, as the router does: accepted?, confidence, policy facts."""
    from policies.file import load_policy
    from policies.policy import Policy
    from policies.types import OptionScores

    tuned = load_policy(policy_file)
    runtime = Policy.from_file(tuned)
    accepted = np.zeros(len(proba), dtype=bool)
    confidence = np.zeros(len(proba))
    for i, row in enumerate(proba):
        verdict, _ = runtime.decide(OptionScores(options, tuple(float(p) for p in row)))
        accepted[i], confidence[i] = verdict.accept, verdict.probability
    facts = {"policy": tuned.name, "threshold": tuned.threshold, "tune_bound": tuned.bound,
             "tune_coverage": tuned.coverage, "n_tune_threshold_rows": tuned.n_tune}
    return accepted, confidence, facts


def operating_point(accepted: NDArray[np.bool_], fast: Tier, slow: Tier) -> dict[str, Any]:
    """Overall and accepted accuracy, escalation, slow calls per 1,000 (95% Clopper-Pearson)."""
    from calibration.metrics import proportion_ci

    n, n_acc = len(accepted), int(accepted.sum())
    correct = np.where(accepted, fast.correct, slow.correct)
    k_acc = int(fast.correct[accepted].sum())
    escalated = n - n_acc
    return {
        "n": n,
        "accuracy": round(float(correct.mean()), 4),
        "accuracy_ci": [round(x, 4) for x in proportion_ci(int(correct.sum()), n)],
        "accepted_accuracy": round(k_acc / n_acc, 4) if n_acc else None,
        "accepted_accuracy_ci": [round(x, 4) for x in proportion_ci(k_acc, n_acc)],
        "escalation_rate": round(escalated / n, 4),
        "escalation_rate_ci": [round(x, 4) for x in proportion_ci(escalated, n)],
        "slow_calls_per_1000": round(1000 * escalated / n, 1),
        "share_of_slow_accuracy": round(float(correct.mean() / slow.correct.mean()), 4),
    }


def frontier_curve(confidence: NDArray[np.float64], fast: Tier, slow: Tier, *,
                   points: int = 101) -> dict[str, Any]:
    """Overall accuracy when the ``k`` most confident fast answers are accepted, on a grid of
    escalation rates 0..1: the whole frontier a threshold on this confidence can reach. Chosen
    on test.csv itself, so its best points are hindsight, not tuned policies."""
    order = np.argsort(-confidence, kind="stable")
    n = len(order)
    fast_hits = np.concatenate([[0], np.cumsum(fast.correct[order])])
    slow_hits = np.concatenate([[0], np.cumsum(slow.correct[order])])
    accuracy = (fast_hits + (slow_hits[-1] - slow_hits)) / n  # index k = k accepted
    grid = np.round(np.linspace(n, 0, points)).astype(int)
    slow_accuracy = float(slow.correct.mean())

    def escalation_for(level: float) -> float | None:
        reach = np.flatnonzero(accuracy >= level - 1e-12)
        return round(1 - int(reach.max()) / n, 4) if reach.size else None

    return {"escalation_rate": [round(1 - int(k) / n, 4) for k in grid],
            "accuracy": [round(float(accuracy[k]), 4) for k in grid],
            "best_accuracy": round(float(accuracy.max()), 4),
            "escalation_for_95pct_of_slow_accuracy": escalation_for(0.95 * slow_accuracy),
            "escalation_to_match_slow_accuracy": escalation_for(slow_accuracy)}


def sample_expectation(accepted: NDArray[np.bool_], fast: Tier, slow: Tier,
                       rows: list[int]) -> dict[str, Any]:
    """What the proxy should do on the sampled rows: escalation share and each row's answer."""
    picked = np.asarray(rows)
    return {"escalation_rate": float(1 - accepted[picked].mean()),
            "answers": [fast.answers[i] if accepted[i] else slow.answers[i] for i in rows]}


def read_labels(test_csv: Path) -> tuple[list[str], list[str]]:
    with test_csv.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [r["text"] for r in rows], [r["category"] for r in rows]


def frontier(data: Path, work: Path, *, targets: tuple[float, ...]) -> dict[str, Any]:
    """Every operating point on all of test.csv, plus each tier's whole frontier curve."""
    texts, labels = read_labels(data / "test.csv")
    slow, _, _ = load_tier(SLOW_KIND, work / f"test-{SLOW_KIND}.jsonl", labels)
    n = len(labels)
    rows: list[dict[str, Any]] = []
    curves: dict[str, Any] = {}
    accepted: dict[str, NDArray[np.bool_]] = {}
    tiers: dict[str, Tier] = {}
    options: tuple[str, ...] = ()
    for kind in FAST_KINDS:
        fast, proba, options = load_tier(kind, work / f"test-{kind}.jsonl", labels)
        tiers[kind] = fast
        confidences = []
        for target in targets:
            label = policy_name(kind, target)
            accepted[label], confidence, facts = accept_mask(policy_path(work, kind, target),
                                                             proba, options)
            confidences.append(confidence)
            rows.append({"tier": kind, "point": f"target {target:g}", "target": target,
                         "label": label, **facts, **operating_point(accepted[label], fast, slow)})
        label = f"{kind}-fast-alone"
        accepted[label] = np.ones(n, dtype=bool)
        rows.append({"tier": kind, "point": "fast alone", "target": None, "label": label,
                     "policy": label, "threshold": 0.0,
                     **operating_point(accepted[label], fast, slow)})
        # The targets share one calibrator (same seed, same split), so one confidence orders
        # the whole curve; say so if that ever stops being true.
        curves[kind] = {**frontier_curve(confidences[0], fast, slow),
                        "one_calibrator": all(np.allclose(c, confidences[0]) for c in confidences)}
    accepted["slow-alone"] = np.zeros(n, dtype=bool)
    rows.append({"tier": SLOW_KIND, "point": "slow alone", "target": None, "label": "slow-alone",
                 "policy": "slow-alone", "threshold": None,
                 **operating_point(accepted["slow-alone"], tiers[FAST_KINDS[0]], slow)})
    return {"rows": rows, "curves": curves, "accepted": accepted, "tiers": tiers, "slow": slow,
            "texts": texts, "labels": labels, "options": options, "n_test": n,
            "targets": targets, "slow_accuracy": round(float(slow.correct.mean()), 4)}
