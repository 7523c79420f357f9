"""`train --cv K --oof-out` and `tune` on out-of-fold reads, on a small slice of BANKING77 (8
intents x 30 messages: each fit well under a second), and the bad input they refuse: exit 2, a
message naming the field, nothing written."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from router.backends.sklearn import SklearnBackend, load_text_model
from router.cli.app import app


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


@dataclass(frozen=True)
class CrossFitted:
    data: Path
    model: Path
    oof: Path


def small_slice(banking77_dir: Path, out: Path, *, per_class: int, classes: int = 8) -> Path:
    with (banking77_dir / "train.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    kept: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        bucket = kept.setdefault(row["category"], []) if len(kept) < classes or \
            row["category"] in kept else None
        if bucket is not None and len(bucket) < per_class:
            bucket.append(row)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "category"])
        writer.writeheader()
        for bucket in kept.values():
            writer.writerows({"text": r["text"], "category": r["category"]} for r in bucket)
    return out


@pytest.fixture(scope="module")
def crossfitted(banking77_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> CrossFitted:
    work = tmp_path_factory.mktemp("cv")
    data = small_slice(banking77_dir, work / "slice.csv", per_class=30)
    result = invoke("train", "--question", "intent",
                    "--data", data, "--label-column", "category", "--cv", 3,
                    "--oof-out", work / "oof.jsonl", "--out", work / "m.joblib")
    assert result.exit_code == 0, result.stderr
    assert "3-fold out-of-fold reads" in result.stdout
    return CrossFitted(data, work / "m.joblib", work / "oof.jsonl")


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_training_row_is_read_by_a_model_that_left_it_out(crossfitted: CrossFitted) -> None:
    rows = rows_of(crossfitted.oof)
    assert len(rows) == 240 and {r["fold"] for r in rows} == {0, 1, 2}
    backend = SklearnBackend(crossfitted.model)
    assert {r["fingerprint"] for r in rows} == {backend.fingerprint}
    assert rows[0]["options"] == list(backend.model.labels)
    # The final model saw every row; the out-of-fold reads did not, so they are less sure of the
    # true label on the training rows themselves.
    final = backend.model.predict_proba([r["text"] for r in rows])
    index = {name: j for j, name in enumerate(backend.model.labels)}
    true = np.array([index[r["label"]] for r in rows])
    oof = np.array([r["proba"] for r in rows])
    assert oof[np.arange(240), true].mean() < final[np.arange(240), true].mean() - 0.05
    meta = load_text_model(crossfitted.model).meta
    assert meta["oof"]["n_folds"] == 3 and len(meta["oof"]["rows"]) == 240


def test_tune_on_out_of_fold_reads_uses_every_row(crossfitted: CrossFitted, tmp_path: Path) -> None:
    out = tmp_path / "policy.json"
    result = invoke("tune", "--question", "intent",
                    "--preds", crossfitted.oof, "--model", crossfitted.model,
                    "--target-accuracy", 0.8, "--out", out)
    assert result.exit_code == 0, result.stderr
    policy = json.loads(out.read_text())
    assert policy["tuning"] == "cross-fitted" and policy["n_folds"] == 3
    assert policy["n_tune"] == policy["n_calibration"] == 240
    # No --shadow/--no-shadow: the file leaves shadow mode to the server (policy.shadow), so
    # SLOTGATE_POLICY__SHADOW=true shadows it.
    assert policy["guarantee"] == "accuracy" and policy["shadow"] is None
    assert policy["backend_fingerprint"] == SklearnBackend(crossfitted.model).fingerprint
    pinned = tmp_path / "pinned.json"
    result = invoke("tune", "--preds", crossfitted.oof, "--model", crossfitted.model,
                    "--target-accuracy", 0.8, "--no-shadow", "--out", pinned)
    assert result.exit_code == 0, result.stderr
    assert json.loads(pinned.read_text())["shadow"] is False


@pytest.mark.parametrize(("cv", "text"), [
    (1, "--cv: must be between 2 and 30"),
    (31, "--cv: must be between 2 and 30 (the smallest class"),
])
def test_cv_outside_two_and_the_smallest_class(banking77_dir: Path, tmp_path: Path, cv: int,
                                               text: str) -> None:
    data = small_slice(banking77_dir, tmp_path / "slice.csv", per_class=30)
    result = invoke("train", "--question", "intent",
                    "--data", data, "--label-column", "category", "--cv", cv,
                    "--oof-out", tmp_path / "oof.jsonl", "--out", tmp_path / "m.joblib")
    assert result.exit_code == 2 and text in result.stderr, result.stderr
    assert not (tmp_path / "oof.jsonl").exists() and not (tmp_path / "m.joblib").exists()


def test_cv_needs_oof_out(crossfitted: CrossFitted, tmp_path: Path) -> None:
    result = invoke("train", "--question", "intent",
                    "--data", crossfitted.data, "--label-column", "category",
                    "--cv", 3, "--out", tmp_path / "m.joblib")
    assert result.exit_code == 2 and "--cv and --oof-out go together" in result.stderr
    assert not (tmp_path / "m.joblib").exists()


def edited(crossfitted: CrossFitted, tmp_path: Path, case: str) -> Path:
    rows = rows_of(crossfitted.oof)
    if case == "relabelled":
        other = next(o for o in rows[4]["options"] if o != rows[4]["label"])
        rows[4]["label"] = other
    elif case == "truncated":
        rows = rows[:-10]
    elif case == "refolded":
        rows[4]["fold"] = (rows[4]["fold"] + 1) % 3
    elif case == "fold_missing":
        del rows[4]["fold"]
    elif case == "unlabelled":
        rows[4]["label"] = None
    path = tmp_path / f"{case}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


OOF_CASES = {  # case -> text in the error (the field is named)
    "relabelled": "row 5: field 'label'",
    "truncated": "field 'id': 230 rows, but",
    "refolded": "row 5: field 'fold'",
    "fold_missing": "row 5: field 'fold': missing",
    "unlabelled": "row 5: field 'label': empty in an out-of-fold file",
}


@pytest.mark.parametrize("case", sorted(OOF_CASES))
def test_out_of_fold_rows_that_do_not_match_the_training_data(
        crossfitted: CrossFitted, tmp_path: Path, case: str) -> None:
    preds = edited(crossfitted, tmp_path, case)
    out = tmp_path / "policy.json"
    result = invoke("tune", "--question", "intent",
                    "--preds", preds, "--model", crossfitted.model, "--out", out)
    assert result.exit_code == 2 and OOF_CASES[case] in result.stderr, result.stderr
    assert not out.exists()


def test_out_of_fold_file_needs_its_model(crossfitted: CrossFitted, tmp_path: Path) -> None:
    out = tmp_path / "policy.json"
    result = invoke("tune", "--question", "intent", "--preds", crossfitted.oof, "--out", out)
    assert result.exit_code == 2 and "pass --model" in result.stderr
    other = tmp_path / "other.joblib"
    assert invoke("train", "--question", "intent",
                  "--data", crossfitted.data, "--label-column", "category",
                  "--out", other).exit_code == 0
    result = invoke("tune", "--question", "intent",
                    "--preds", crossfitted.oof, "--model", other, "--out", out)
    assert result.exit_code == 2 and "field 'fold'" in result.stderr
    assert "was not trained with --cv" in result.stderr
    assert not out.exists()
