"""`export-log --reference slow`: a shadow-mode log becomes predictions labelled by the slow
model's answers (a /v1/feedback label wins; the counts are printed), and `tune` on them writes a
policy whose promise is agreement with the slow model. A log with no reference label is refused
naming the field, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from typer.testing import CliRunner

from router.cli.app import app
from router.tuning.predictions import read_predictions

OPTIONS = ["card_arrival", "card_lost", "exchange_rate"]


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def shadow_log(path: Path, n: int, *, escalated: bool = True) -> Path:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        proba = rng.dirichlet(np.ones(3) * 0.3)
        # The slow model agrees with the fast read's argmax four times in five.
        slow = OPTIONS[int(proba.argmax())] if i % 5 else OPTIONS[(int(proba.argmax()) + 1) % 3]
        lines.append({"decision_id": f"d{i}", "options": OPTIONS, "proba": proba.tolist(),
                      "answer": slow, "route": "slow" if escalated else "fast",
                      "escalated": escalated, "shadow": escalated, "signature": "s",
                      "fingerprint": "fp", "text": f"message {i}", "time": float(i)})
    lines.append({"type": "feedback", "decision_id": "d3", "label": "exchange_rate", "time": 9e9})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def test_reference_slow_labels_by_the_slow_answer_and_a_human_label_wins(tmp_path: Path) -> None:
    log = shadow_log(tmp_path / "decisions.jsonl", 600)
    out = tmp_path / "shadow.jsonl"
    result = invoke("export-log", "--log", log, "--out", out, "--reference", "slow")
    assert result.exit_code == 0, result.stderr
    assert "labels 1 human (/v1/feedback), 599 the slow model's, 0 none" in result.stdout
    preds = read_predictions(out)
    assert preds.labelled.all()
    by_id = dict(zip(preds.ids, zip(preds.labels, preds.references, strict=True), strict=True))
    assert by_id["d3"] == ("exchange_rate", "human") and by_id["d1"][1] == "slow"
    policy = tmp_path / "policy.json"
    result = invoke("tune", "--preds", out, "--target-accuracy", 0.7, "--out", policy)
    assert result.exit_code == 0, result.stderr
    written = json.loads(policy.read_text())
    assert written["guarantee"] == "agreement_with_slow" and written["shadow"] is False
    assert "599 of 600 labels are the slow model's answers" in result.stdout


def test_human_reference_keeps_the_old_export(tmp_path: Path) -> None:
    log = shadow_log(tmp_path / "decisions.jsonl", 50)
    out = tmp_path / "human.jsonl"
    assert invoke("export-log", "--log", log, "--out", out).exit_code == 0
    preds = read_predictions(out)
    assert int(preds.labelled.sum()) == 1 and set(preds.references) == {None}


def test_a_log_with_no_reference_label_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    rows = [json.loads(line) for line in shadow_log(log, 20, escalated=False).read_text()
            .splitlines() if "feedback" not in line]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "shadow.jsonl"
    result = invoke("export-log", "--log", log, "--out", out, "--reference", "slow")
    assert result.exit_code == 2
    assert "field 'label'" in result.stderr and "none of the 20 decisions" in result.stderr
    assert not out.exists()
    result = invoke("export-log", "--log", log, "--out", out, "--reference", "llm")
    assert result.exit_code == 2 and "--reference must be human or slow" in result.stderr
