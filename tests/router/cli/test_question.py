"""The question travels with the data: ``train --question`` records it in the model, its
out-of-fold reads and ``predict`` rows carry it, ``tune`` scopes the policy to it; a tune with no
question is refused, and flags that disagree with the rows are bad input naming the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from policies.file import load_policy
from policies.scope import Question, scope_signature
from router.backends.sklearn import load_text_model
from router.cli.app import app
from tests.router.cli.test_tune_command import OPTIONS, synthetic_rows, write_jsonl


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def test_tune_without_a_question_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", synthetic_rows(600))
    out = tmp_path / "policy.json"
    result = invoke("tune", "--preds", preds, "--out", out)
    assert result.exit_code == 2 and "--question" in result.stderr
    assert "records no question" in result.stderr and not out.exists()
    orphan = invoke("tune", "--preds", preds, "--out", out, "--instructions", "Which one?")
    assert orphan.exit_code == 2 and "--instructions" in orphan.stderr
    bad_kind = invoke("tune", "--preds", preds, "--out", out, "--question", "q",
                      "--question-kind", "essay")
    assert bad_kind.exit_code == 2 and "--question-kind" in bad_kind.stderr
    bad_id = invoke("tune", "--preds", preds, "--out", out, "--question", "a:b")
    assert bad_id.exit_code == 2 and "--question" in bad_id.stderr and not out.exists()


def test_tune_records_the_named_question_readably_and_in_the_signature(tmp_path: Path) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", synthetic_rows(600))
    out = tmp_path / "policy.json"
    result = invoke("tune", "--preds", preds, "--out", out, "--target-accuracy", 0.8,
                    "--question", "queue", "--instructions", "Which team handles it?",
                    "--context", "You route support tickets.")
    assert result.exit_code == 0, result.stderr
    assert "'queue' (choice: 'Which team handles it?')" in result.stdout
    policy = load_policy(out)
    asked = Question.asked("queue", instructions="Which team handles it?",
                           context="You route support tickets.")
    assert policy.question is not None and policy.question.question() == asked
    assert policy.signature == scope_signature(OPTIONS, asked)
    stored = json.loads(out.read_text())["question"]
    assert stored == {"id": "queue", "instructions": "Which team handles it?",
                      "context": "You route support tickets.", "kind": "choice"}


def test_the_question_travels_from_train_to_predict_to_tune(tmp_path: Path) -> None:
    data = tmp_path / "train.csv"
    rows = [("where is my card", "card_arrival"), ("my card has not come", "card_arrival"),
            ("card still not here", "card_arrival"), ("i lost my card", "lost_card"),
            ("my card was stolen", "lost_card"), ("someone took my card", "lost_card")] * 10
    data.write_text("text,category\n" + "".join(f"{t} {i},{c}\n"
                                                for i, (t, c) in enumerate(rows)))
    model = tmp_path / "m.joblib"
    refused = invoke("train", "--data", data, "--label-column", "category", "--out", model)
    assert refused.exit_code == 2 and "--question" in refused.stderr and not model.exists()
    assert invoke("train", "--data", data, "--label-column", "category", "--out", model,
                  "--question", "intent").exit_code == 0
    assert load_text_model(model).question == Question.asked("intent")
    preds = tmp_path / "preds.jsonl"
    assert invoke("predict", "--model", model, "--data", data, "--label-column", "category",
                  "--out", preds).exit_code == 0
    first = json.loads(preds.read_text().splitlines()[0])
    assert first["question"] == Question.asked("intent").as_dict()
    other = invoke("predict", "--model", model, "--data", data, "--out", tmp_path / "o.jsonl",
                   "--question", "is_french")
    assert other.exit_code == 2 and "reads no other" in other.stderr
    policy = tmp_path / "policy.json"
    mismatch = invoke("tune", "--preds", preds, "--out", policy, "--question", "is_french")
    assert mismatch.exit_code == 2 and "answers question 'intent'" in mismatch.stderr
    result = invoke("tune", "--preds", preds, "--out", policy, "--target-accuracy", 0.6)
    assert result.exit_code == 0, result.stderr
    tuned = load_policy(policy)
    assert tuned.question is not None and tuned.question.question() == Question.asked("intent")


def test_rows_of_two_questions_are_one_file_too_many(tmp_path: Path) -> None:
    rows = synthetic_rows(20)
    for i, row in enumerate(rows):
        row["question"] = {"id": "intent" if i < 10 else "is_french"}
    result = invoke("tune", "--preds", write_jsonl(tmp_path / "p.jsonl", rows),
                    "--out", tmp_path / "policy.json")
    assert result.exit_code == 2
    assert "row 11" in result.stderr and "field 'question'" in result.stderr
