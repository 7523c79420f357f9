"""`slotgate tune` and `slotgate eval` with several --preds (a cascade of fast tiers), on small
synthetic predictions: what the policy file records, the eval figures against the policy's own
arithmetic, and the inputs refused (rows that differ between tiers, one tier's flags, bad
--tier values, the wrong number of files)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from policies.file import load_policy
from policies.policy import Policy
from router.cli.app import app

OPTIONS = ["yes", "no", "maybe"]
QUESTION = {"id": "intent"}


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def tier_rows(n: int, *, seed: int, strength: tuple[float, float], fingerprint: str,
              **extra: Any) -> list[list[dict[str, Any]]]:
    """The same labelled rows read by two tiers, the second more often right: each read puts
    ``strength`` of extra logit on the true option, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, size=n)
    files = []
    for k, signal in enumerate(strength):
        logits = rng.normal(0, 1.5, size=(n, 3))
        logits[np.arange(n), labels] += signal
        proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        files.append([{"id": f"r{i}", "text": f"text {i}", "options": OPTIONS,
                       "proba": proba[i].tolist(), "label": OPTIONS[labels[i]],
                       "fingerprint": f"{fingerprint}{k}", "question": QUESTION, **extra}
                      for i in range(n)])
    return files


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def two_files(tmp_path: Path, *, n: int = 1200, seed: int = 0, prefix: str = "",
              **extra: Any) -> tuple[Path, Path]:
    a, b = tier_rows(n, seed=seed, strength=(2.5, 4.5), fingerprint="fp", **extra)
    return (write_jsonl(tmp_path / f"{prefix}a.jsonl", a),
            write_jsonl(tmp_path / f"{prefix}b.jsonl", b))


CASCADE = ("--tier", "fast=0.2", "--tier", "embedding=1.4", "--slow-cost", 500)


def tune_cascade(tmp_path: Path, a: Path, b: Path, *extra: object) -> Any:
    return invoke("tune", "--preds", a, "--preds", b, *CASCADE, "--target-accuracy", 0.9,
                  "--out", tmp_path / "cascade.json", *extra)


def test_tune_writes_every_tier_with_its_fingerprint_and_a_hash_over_all_files(
        tmp_path: Path) -> None:
    a, b = two_files(tmp_path)
    result = tune_cascade(tmp_path, a, b)
    assert result.exit_code == 0, result.stderr
    policy = load_policy(tmp_path / "cascade.json")
    cascade = policy.cascade
    assert cascade is not None
    assert [t.name for t in cascade.tiers] == ["fast", "embedding"]
    assert [t.backend_fingerprint for t in cascade.tiers] == ["fp0", "fp1"]
    assert [t.cost for t in cascade.tiers] == [0.2, 1.4] and cascade.slow_cost == 500
    hashes = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b)]
    assert policy.data_hash == hashlib.sha256("\n".join(hashes).encode()).hexdigest()
    assert policy.question is not None and policy.question.id == "intent"
    assert policy.bound >= 0.9 and any(t.threshold is not None for t in cascade.tiers)
    assert policy.n_calibration == 600 and policy.n_tune == 600
    shown = " ".join(result.stdout.split())
    assert "tier 1 'fast' (cost 0.2)" in shown and "passed" in shown and "yes" in shown
    assert f"{cascade.expected_cost:.4g}" in shown


def test_eval_applies_the_cascade_row_by_row_as_its_thresholds_say(tmp_path: Path) -> None:
    a, b = two_files(tmp_path)
    assert tune_cascade(tmp_path, a, b).exit_code == 0
    test_a, test_b = two_files(tmp_path, n=400, seed=1, prefix="test-")
    result = invoke("eval", "--policy", tmp_path / "cascade.json", "--preds", test_a,
                    "--preds", test_b, "--json")
    assert result.exit_code == 0, result.stderr
    metrics = json.loads(result.stdout)
    # The same figures from the policy's calibrators and thresholds, a whole column at a time.
    policy = Policy.from_file(load_policy(tmp_path / "cascade.json"))
    reads = [np.array([json.loads(line)["proba"] for line in p.read_text().splitlines()])
             for p in (test_a, test_b)]
    labels = np.array([OPTIONS.index(json.loads(line)["label"])
                       for line in test_a.read_text().splitlines()])
    answered = np.full(len(labels), 2)
    right = np.zeros(len(labels), dtype=bool)
    cost = np.zeros(len(labels))
    for k, tier in enumerate(policy.tiers_):
        if tier.threshold is None:
            continue
        waiting = answered == 2
        cost[waiting] += tier.cost
        calibrated = tier.calibrator.transform(reads[k])
        top = calibrated.argmax(axis=1)
        accepts = waiting & (calibrated.max(axis=1) >= tier.threshold)
        answered[accepts], right[accepts] = k, top[accepts] == labels[accepts]
    cost[answered == 2] += 500
    assert metrics["n"] == 400 and metrics["expected_cost"] == pytest.approx(cost.mean())
    assert metrics["coverage"] == pytest.approx(np.mean(answered < 2))
    assert metrics["accepted_accuracy"] == pytest.approx(right[answered < 2].mean())
    for k, tier in enumerate(metrics["tiers"]):
        assert tier["answered_share"] == pytest.approx(np.mean(answered == k))
    shares = sum(t["answered_share"] for t in metrics["tiers"]) + metrics["escalation_rate"]
    assert shares == pytest.approx(1.0)
    table = invoke("eval", "--policy", tmp_path / "cascade.json", "--preds", test_a,
                   "--preds", test_b)
    assert table.exit_code == 0 and "accepted accuracy, all tiers" in table.stdout


@pytest.mark.parametrize(("field", "row", "change"), [
    ("id", 5, {"id": "other"}),
    ("label", 7, {"label": "maybe"}),
    ("text", 9, {"text": "another text"}),
])
def test_rows_that_differ_between_tiers_are_refused_naming_file_row_and_field(
        tmp_path: Path, field: str, row: int, change: dict[str, Any]) -> None:
    a, b = two_files(tmp_path, n=60)
    rows = [json.loads(line) for line in b.read_text().splitlines()]
    if rows[row - 1][field] == change[field]:  # a label that is already "maybe"
        change = {field: "yes"}
    rows[row - 1].update(change)
    write_jsonl(b, rows)
    result = tune_cascade(tmp_path, a, b)
    assert result.exit_code == 2
    assert f"{b}: row {row}: field {field!r}" in result.stderr
    assert not (tmp_path / "cascade.json").exists()


def test_files_of_different_lengths_are_refused(tmp_path: Path) -> None:
    a, b = two_files(tmp_path, n=60)
    write_jsonl(b, [json.loads(line) for line in b.read_text().splitlines()][:-1])
    result = tune_cascade(tmp_path, a, b)
    assert result.exit_code == 2 and f"{b}: field 'id': 59 rows" in result.stderr


@pytest.mark.parametrize(("flag", "value"), [
    ("--max-escalation", 0.3), ("--per-answer-floor", 0.9), ("--cv", 5),
    ("--model", "m.joblib"), ("--report", "plots"),
])
def test_one_tier_flags_are_refused_with_several_preds(tmp_path: Path, flag: str,
                                                       value: object) -> None:
    a, b = two_files(tmp_path, n=60)
    result = tune_cascade(tmp_path, a, b, flag, value)
    assert result.exit_code == 2 and f"error: {flag}: is one tier's" in result.stderr


@pytest.mark.parametrize(("args", "flag"), [
    (("--tier", "fast=0.2"), "--tier"),
    (("--tier", "fast=0.2", "--tier", "fast=1.4", "--slow-cost", 5), "--tier"),
    (("--tier", "fast", "--tier", "embedding=1.4", "--slow-cost", 5), "--tier"),
    (("--tier", "fast=-1", "--tier", "embedding=1.4", "--slow-cost", 5), "--tier"),
    (("--tier", "=1", "--tier", "embedding=1.4", "--slow-cost", 5), "--tier"),
    (("--tier", "fast=0.2", "--tier", "embedding=1.4"), "--slow-cost"),
    (("--tier", "fast=0.2", "--tier", "embedding=1.4", "--slow-cost", "inf"), "--slow-cost"),
    (CASCADE + ("--max-slow-share", 1.5), "--max-slow-share"),
])
def test_bad_cascade_flags_exit_2_naming_the_flag(tmp_path: Path, args: tuple[object, ...],
                                                  flag: str) -> None:
    a, b = two_files(tmp_path, n=60)
    result = invoke("tune", "--preds", a, "--preds", b, *args, "--out", tmp_path / "x.json")
    assert result.exit_code == 2 and f"error: {flag}:" in result.stderr
    assert not (tmp_path / "x.json").exists()


def test_cascade_flags_with_one_preds_are_refused(tmp_path: Path) -> None:
    a, _ = two_files(tmp_path, n=60)
    result = invoke("tune", "--preds", a, "--tier", "fast=1", "--out", tmp_path / "x.json")
    assert result.exit_code == 2 and "error: --tier: is a cascade's" in result.stderr


def test_out_of_fold_files_are_split_without_a_model(tmp_path: Path) -> None:
    folded = [[{**row, "fold": i % 5} for i, row in enumerate(rows)]
              for rows in tier_rows(1200, seed=0, strength=(2.5, 4.5), fingerprint="fp")]
    a = write_jsonl(tmp_path / "a.oof.jsonl", folded[0])
    b = write_jsonl(tmp_path / "b.oof.jsonl", folded[1])
    result = tune_cascade(tmp_path, a, b)
    assert result.exit_code == 0, result.stderr
    assert load_policy(tmp_path / "cascade.json").tuning == "split"


def test_eval_needs_one_preds_per_tier_and_the_tiers_own_backends(tmp_path: Path) -> None:
    a, b = two_files(tmp_path)
    assert tune_cascade(tmp_path, a, b).exit_code == 0
    policy = tmp_path / "cascade.json"
    result = invoke("eval", "--policy", policy, "--preds", a)
    assert result.exit_code == 2
    assert "is a cascade of 2 tiers (fast, embedding)" in result.stderr
    swapped = invoke("eval", "--policy", policy, "--preds", b, "--preds", a, "--json")
    assert swapped.exit_code == 2 and f"{b} has backend fingerprint fp1" in swapped.stderr
    allowed = invoke("eval", "--policy", policy, "--preds", b, "--preds", a, "--json",
                     "--allow-mismatch")
    assert allowed.exit_code == 0 and json.loads(allowed.stdout)["n"] == 1200


def test_a_one_tier_policy_takes_one_preds(tmp_path: Path) -> None:
    a, b = two_files(tmp_path, n=600)
    assert invoke("tune", "--preds", a, "--out", tmp_path / "one.json").exit_code == 0
    result = invoke("eval", "--policy", tmp_path / "one.json", "--preds", a, "--preds", b)
    assert result.exit_code == 2 and "has one fast tier: pass one --preds" in result.stderr
    assert invoke("eval", "--policy", tmp_path / "one.json", "--preds", a).exit_code == 0


def test_labels_from_the_slow_model_make_the_promise_agreement_and_leave_shadow(
        tmp_path: Path) -> None:
    a, b = two_files(tmp_path, reference="slow")
    assert tune_cascade(tmp_path, a, b, "--max-slow-share", 0.5).exit_code == 0
    policy = load_policy(tmp_path / "cascade.json")
    assert policy.guarantee == "agreement_with_slow" and policy.shadow is False
    assert policy.cascade is not None and policy.cascade.max_slow_share == 0.5
    assert policy.cascade.slow_share_bound is not None


def test_files_of_different_questions_are_refused(tmp_path: Path) -> None:
    a, b = two_files(tmp_path, n=60)
    rows = [{**json.loads(line), "question": {"id": "topic"}}
            for line in b.read_text().splitlines()]
    write_jsonl(b, rows)
    result = tune_cascade(tmp_path, a, b)
    assert result.exit_code == 2 and "the files answer different questions" in result.stderr
