"""The CLI end to end on real BANKING77: train on part of train.csv, predict the held-out part
and test.csv, tune at (0.95, 0.05), evaluate on test.csv; compare; PNG reports."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from scipy.stats import binomtest
from typer.testing import CliRunner

from policies.file import load_policy
from router.backends.sklearn import SklearnBackend
from router.cli.app import app


@dataclass(frozen=True)
class Trained:
    model: Path
    tune_preds: Path
    test_preds: Path
    policy: Path
    tune_stderr: str


def invoke(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="session")
def trained(banking77_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Trained once per session (TF-IDF on 70% of train.csv: ~15 s on 2 cores)."""
    work = tmp_path_factory.mktemp("cli")
    columns = ("--text-column", "text", "--label-column", "category")
    code, _, err = invoke("train", "--question", "intent",
                          "--data", banking77_dir / "train.csv", *columns,
                            "--kind", "tfidf", "--out", work / "model.joblib",
                            "--holdout", 0.3, "--holdout-out", work / "tune.csv")
    assert code == 0, err
    for name, data in (("tune", work / "tune.csv"), ("test", banking77_dir / "test.csv")):
        code, _, err = invoke("predict", "--model", work / "model.joblib", "--data", data,
                                *columns, "--out", work / f"{name}.jsonl")
        assert code == 0, err
    code, _, err = invoke("tune", "--question", "intent",
                          "--preds", work / "tune.jsonl", "--target-accuracy", 0.95,
                            "--delta", 0.05, "--calibrator", "temperature",
                            "--out", work / "policy.json", "--report", work / "tune_report")
    assert code == 0, err
    return Trained(work / "model.joblib", work / "tune.jsonl", work / "test.jsonl",
                   work / "policy.json", err)


def test_train_holds_out_the_tuning_rows(trained: Trained, banking77_dir: Path) -> None:
    tune_rows = trained.tune_preds.read_text().splitlines()
    assert len(tune_rows) == round(0.3 * 10003)
    row = json.loads(tune_rows[0])
    assert len(row["options"]) == 77 and row["label"] in row["options"]
    assert row["fingerprint"] == SklearnBackend(trained.model).fingerprint


def test_eval_on_test_meets_the_target_and_calibration_helps(trained: Trained) -> None:
    code, out, err = invoke("eval", "--preds", trained.test_preds, "--policy", trained.policy,
                            "--json")
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics["n"] == 3080
    assert metrics["accepted_accuracy"] >= 0.95
    assert 0.5 < metrics["coverage"] < 1.0
    assert metrics["escalation_rate"] == pytest.approx(1.0 - metrics["coverage"])
    assert metrics["ece_after"] < metrics["ece_before"]
    for key in ("accuracy", "accepted_accuracy", "coverage", "ece_before", "ece_after"):
        low, high = metrics[f"{key}_ci"]
        assert low <= metrics[key] <= high


def test_eval_table_shows_the_figures(trained: Trained, tmp_path: Path) -> None:
    code, out, err = invoke("eval", "--preds", trained.test_preds, "--policy", trained.policy,
                            "--report", tmp_path / "report")
    assert code == 0, err
    for text in ("accepted accuracy", "coverage", "escalation rate", "ECE after calibration"):
        assert text in out
    assert is_png(tmp_path / "report" / "reliability.png")
    assert is_png(tmp_path / "report" / "risk_coverage.png")


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_tune_report_writes_pngs_and_the_policy_records_its_evidence(trained: Trained) -> None:
    report = trained.policy.parent / "tune_report"
    assert is_png(report / "reliability.png") and is_png(report / "risk_coverage.png")
    policy = json.loads(trained.policy.read_text())
    assert policy["target_accuracy"] == 0.95 and policy["delta"] == 0.05
    assert policy["bound"] >= 0.95 and policy["rule"]["threshold"] is not None
    assert "threshold" not in policy  # stored once, in the rule (version 2)
    assert policy["n_tune"] + policy["n_calibration"] == round(0.3 * 10003)
    assert policy["backend_fingerprint"] == SklearnBackend(trained.model).fingerprint
    assert policy["calibrator"]["kind"] == "temperature"
    assert len(policy["data_hash"]) == 64
    # the threshold rows' summary for drift monitoring: their confidences and accept share
    reference = policy["reference"]
    assert reference["n"] == policy["n_tune"] == len(reference["confidence"])
    assert reference["accept_share"] == pytest.approx(policy["coverage"])
    assert (policy["audit_rate"], policy["on_alarm"]) == (0.0, "audit_then_escalate")


def test_alarm_alpha_is_written_to_the_policy(trained: Trained, tmp_path: Path) -> None:
    """With N replicas sharing alarms the fleet's false-alarm bound is N x alpha (docs)."""
    out_path = tmp_path / "fleet.json"
    code, _, err = invoke("tune", "--question", "intent",
                          "--preds", trained.tune_preds, "--alarm-alpha", 0.0125,
                          "--out", out_path)
    assert code == 0, err
    assert json.loads(out_path.read_text())["alarm_alpha"] == 0.0125


def test_max_escalation_keeps_the_guarantee_and_warns(trained: Trained, tmp_path: Path) -> None:
    out_path = tmp_path / "budget.json"
    code, _, err = invoke("tune", "--question", "intent",
                          "--preds", trained.tune_preds, "--max-escalation", 0.02,
                            "--out", out_path)
    assert code == 0, err
    policy = json.loads(out_path.read_text())
    assert policy["rule"]["kind"] == "budget"
    assert policy["rule"]["base"]["threshold"] == load_policy(out_path).threshold is not None
    assert policy["budget_exceeded"] is True and "outside the guarantee" in err


def test_compare_counts_discordant_pairs(trained: Trained, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in trained.test_preds.read_text().splitlines()]
    broken = 0
    for row in rows[:200]:  # B answers these rows wrong on purpose
        wrong = next(j for j, name in enumerate(row["options"]) if name != row["label"])
        right = row["options"].index(row["label"])
        if max(range(77), key=row["proba"].__getitem__) == right:
            broken += 1
        row["proba"] = [1.0 if j == wrong else 0.0 for j in range(77)]
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))  # order must not matter
    code, out, err = invoke("compare", trained.test_preds, b, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["n"] == 3080 and result["b_only"] == 0 and result["a_only"] == broken
    assert result["p_value"] == pytest.approx(binomtest(broken, broken, 0.5).pvalue)
    code, out, err = invoke("compare", trained.test_preds, b)
    assert code == 0 and "McNemar" in out and f"{broken} / 0" in out
