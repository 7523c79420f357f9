"""`slotgate tune` and `compare` on synthetic predictions: what the policy file records, the
fixed-seed split, and the cases where the rows do not belong together."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from typer.testing import CliRunner

from router.cli.app import app

OPTIONS = ["yes", "no", "maybe"]


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def synthetic_rows(n: int, *, seed: int = 0, **extra: Any) -> list[dict[str, Any]]:
    """Overconfident reads: labels drawn from a softened copy of each read."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        logits = rng.normal(0, 4, size=3)
        proba = np.exp(logits) / np.exp(logits).sum()
        soft = np.exp(logits / 1.5) / np.exp(logits / 1.5).sum()
        rows.append({"id": f"r{i}", "options": OPTIONS, "proba": proba.tolist(),
                     "label": OPTIONS[rng.choice(3, p=soft)], **extra})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_policy_records_signature_fingerprint_and_data_hash(tmp_path: Path) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl",
                        synthetic_rows(2000, signature="sig1", fingerprint="fp1"))
    out = tmp_path / "policy.json"
    # Rows of one logged question (export-log): the policy answers exactly that question.
    result = invoke("tune", "--preds", preds, "--target-accuracy", 0.9, "--out", out,
                    "--name", "yesno")
    assert result.exit_code == 0, result.stderr
    policy = json.loads(out.read_text())
    assert policy["name"] == "yesno" and policy["signature"] == "sig1"
    assert policy["question"] is None
    assert policy["backend_fingerprint"] == "fp1"
    assert policy["data_hash"] == hashlib.sha256(preds.read_bytes()).hexdigest()
    assert policy["n_calibration"] == 1000 and policy["n_tune"] == 1000
    assert policy["rule"]["threshold"] is not None and policy["bound"] >= 0.9


def test_same_seed_same_policy_other_seed_other_split(tmp_path: Path) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", synthetic_rows(2000))
    thresholds = []
    for i, seed in enumerate((0, 0, 1)):
        out = tmp_path / f"p{i}.json"
        assert invoke("tune", "--question", "intent",
                      "--preds", preds, "--seed", seed, "--out", out).exit_code == 0
        thresholds.append(json.loads(out.read_text())["rule"]["threshold"])
    assert thresholds[0] == thresholds[1] != thresholds[2]


def test_rows_of_different_backends_are_refused(tmp_path: Path) -> None:
    rows = synthetic_rows(100, fingerprint="fp1")
    rows[7]["fingerprint"] = "fp2"
    preds = write_jsonl(tmp_path / "p.jsonl", rows)
    result = invoke("tune", "--question", "intent", "--preds", preds, "--out", tmp_path / "x.json")
    assert result.exit_code == 2 and f"{preds}: field 'fingerprint'" in result.stderr
    assert not (tmp_path / "x.json").exists()


def test_compare_refuses_files_without_shared_ids_or_with_other_labels(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", synthetic_rows(50))
    shifted = [{**r, "id": "x" + r["id"]} for r in synthetic_rows(50)]
    b = write_jsonl(tmp_path / "b.jsonl", shifted)
    result = invoke("compare", a, b)
    assert result.exit_code == 2 and "field 'id'" in result.stderr
    relabelled = synthetic_rows(50)
    relabelled[4]["label"] = "maybe" if relabelled[4]["label"] != "maybe" else "yes"
    c = write_jsonl(tmp_path / "c.jsonl", relabelled)
    result = invoke("compare", a, c)
    assert result.exit_code == 2 and f"{c}: row 5: field 'label'" in result.stderr


def test_eval_on_another_backend_needs_the_override_and_keeps_stdout_json(tmp_path: Path) -> None:
    tune_preds = write_jsonl(tmp_path / "t.jsonl", synthetic_rows(2000, fingerprint="fp1"))
    policy = tmp_path / "policy.json"
    assert invoke("tune", "--question", "intent",
                  "--preds", tune_preds, "--out", policy).exit_code == 0
    other = write_jsonl(tmp_path / "o.jsonl", synthetic_rows(500, seed=1, fingerprint="fp2"))
    assert invoke("eval", "--preds", other, "--policy", policy, "--json").exit_code == 2
    result = invoke("eval", "--preds", other, "--policy", policy, "--json", "--allow-mismatch")
    assert result.exit_code == 0, result.stderr
    assert "fingerprint fp2" in result.stderr and "tuned for fp1" in result.stderr
    assert json.loads(result.stdout)["n"] == 500
