"""Bad input fails clearly: exit code 2, a message naming the file, row and field, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from router.cli.app import app

OPTIONS = ["card_arrival", "card_lost", "exchange_rate"]


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def good_row(i: int) -> dict[str, Any]:
    return {"id": str(i), "options": OPTIONS, "proba": [0.7, 0.2, 0.1],
            "label": OPTIONS[i % 3]}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bad_preds(case: str) -> list[dict[str, Any]]:
    rows = [good_row(i) for i in range(1, 41)]
    third = rows[2]
    if case == "proba_out_of_range":
        third["proba"] = [1.2, -0.1, -0.1]
    elif case == "proba_sum":
        third["proba"] = [0.5, 0.2, 0.1]
    elif case == "label_not_option":
        third["label"] = "atm_support"
    elif case == "options_differ":
        third["options"] = ["card_arrival", "card_lost", "top_up"]
    elif case == "missing_field":
        del third["proba"]
    return rows


CASES = {  # case -> (field named in the message, extra text expected)
    "proba_out_of_range": ("proba", "outside [0, 1]"),
    "proba_sum": ("proba", "sums to 0.800000"),
    "label_not_option": ("label", "'atm_support' is not among the options"),
    "options_differ": ("options", "differ from row 1"),
    "missing_field": ("proba", "missing field"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["tune", "eval"])
def test_bad_predictions_exit_2_naming_file_row_field(tmp_path: Path, case: str,
                                                      command: str) -> None:
    preds = write_jsonl(tmp_path / "preds.jsonl", bad_preds(case))
    out, report = tmp_path / "policy.json", tmp_path / "report"
    if command == "tune":
        result = invoke("tune", "--question", "intent",
                        "--preds", preds, "--out", out, "--report", report)
    else:
        policy = tmp_path / "given.json"
        good = write_jsonl(tmp_path / "good.jsonl", [good_row(i) for i in range(1, 401)])
        assert invoke("tune", "--question", "intent",
                      "--preds", good, "--out", policy).exit_code == 0
        result = invoke("eval", "--preds", preds, "--policy", policy, "--report", report)
    field, text = CASES[case]
    assert result.exit_code == 2
    assert f"{preds}: row 3: field '{field}'" in result.stderr and text in result.stderr
    assert not out.exists() and not report.exists()
    assert result.stdout == ""


def test_empty_predictions_file(tmp_path: Path) -> None:
    preds = tmp_path / "empty.jsonl"
    preds.write_text("")
    result = invoke("tune", "--question", "intent", "--preds", preds, "--out", tmp_path / "p.json")
    assert result.exit_code == 2 and f"{preds}: file is empty" in result.stderr
    assert not (tmp_path / "p.json").exists()


def test_unlabelled_predictions_cannot_be_tuned(tmp_path: Path) -> None:
    rows = [{**good_row(i), "label": None} for i in range(1, 20)]
    preds = write_jsonl(tmp_path / "p.jsonl", rows)
    result = invoke("tune", "--question", "intent", "--preds", preds, "--out", tmp_path / "p.json")
    assert result.exit_code == 2 and "field 'label': no row is labelled" in result.stderr


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TF-IDF model on a toy 3-intent set (trains in well under a second)."""
    work = tmp_path_factory.mktemp("small")
    texts = {"card_arrival": "where is my new card it has not arrived",
             "card_lost": "i lost my card please block it",
             "exchange_rate": "what exchange rate do you use for euros"}
    lines = ["text,category"] + [f"{t} {i},{label}" for label, t in texts.items()
                                 for i in range(12)]
    data = work / "toy.csv"
    data.write_text("\r\n".join(lines) + "\r\n")
    model = work / "toy.joblib"
    result = invoke("train", "--question", "intent",
                    "--data", data, "--label-column", "category", "--out", model)
    assert result.exit_code == 0, result.stderr
    return model


def test_predict_label_not_among_model_options(tmp_path: Path, small_model: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("text,category\r\nmy card is lost,card_lost\r\nhello,atm_support\r\n")
    out = tmp_path / "preds.jsonl"
    result = invoke("predict", "--model", small_model, "--data", data,
                    "--label-column", "category", "--out", out)
    assert result.exit_code == 2
    assert f"{data}: row 2: field 'category'" in result.stderr and "atm_support" in result.stderr
    assert not out.exists()


def test_predict_writes_unlabelled_rows(tmp_path: Path, small_model: Path) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", [{"id": "q1", "message": "I lost my card"}])
    out = tmp_path / "preds.jsonl"
    result = invoke("predict", "--model", small_model, "--data", data,
                    "--text-column", "message", "--out", out)
    assert result.exit_code == 0, result.stderr
    row = json.loads(out.read_text())
    assert row["id"] == "q1" and row["label"] is None and row["options"] == sorted(OPTIONS)
    assert row["options"][max(range(3), key=row["proba"].__getitem__)] == "card_lost"


@pytest.mark.parametrize(("command", "column"), [("train", "text"), ("train", "category"),
                                                 ("predict", "text")])
def test_missing_column(tmp_path: Path, small_model: Path, command: str, column: str) -> None:
    data = tmp_path / "in.csv"
    header = "message,category" if column == "text" else "text,intent"
    data.write_text(f"{header}\r\nmy card is lost,card_lost\r\n")
    out = tmp_path / "out.bin"
    if command == "train":
        result = invoke("train", "--question", "intent",
                        "--data", data, "--label-column", "category", "--out", out)
    else:
        result = invoke("predict", "--model", small_model, "--data", data, "--out", out)
    assert result.exit_code == 2
    assert f"{data}: field '{column}': missing column" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("content", ["", "text,category\r\n"])
def test_empty_input_file(tmp_path: Path, content: str) -> None:
    data = tmp_path / "in.csv"
    data.write_text(content)
    out = tmp_path / "m.joblib"
    result = invoke("train", "--question", "intent",
                    "--data", data, "--label-column", "category", "--out", out)
    assert result.exit_code == 2 and f"{data}: file is empty" in result.stderr
    assert not out.exists()


def test_train_empty_label_names_the_row(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("text,category\r\na,x\r\nb,\r\n")
    result = invoke("train", "--question", "intent", "--data", data, "--label-column", "category",
                    "--out", tmp_path / "m.joblib")
    assert result.exit_code == 2 and f"{data}: row 2: field 'category'" in result.stderr


def test_bad_policy_file_is_named(tmp_path: Path) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", [good_row(i) for i in range(1, 401)])
    policy = tmp_path / "policy.json"
    assert invoke("tune", "--question", "intent", "--preds", preds, "--out", policy).exit_code == 0
    data = json.loads(policy.read_text())
    data["version"] = 9
    policy.write_text(json.dumps(data))
    result = invoke("eval", "--preds", preds, "--policy", policy, "--json")
    assert result.exit_code == 2 and f"{policy}: field 'version'" in result.stderr


@pytest.mark.parametrize(("flag", "value"), [("--target-accuracy", "1.5"), ("--delta", "0"),
                                             ("--calibrator", "magic"),
                                             ("--max-escalation", "2"),
                                             ("--audit-rate", "1.5"), ("--on-alarm", "panic"),
                                             ("--alarm-alpha", "0"), ("--alarm-alpha", "1")])
def test_bad_tune_options(tmp_path: Path, flag: str, value: str) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", [good_row(i) for i in range(1, 41)])
    result = invoke("tune", "--question", "intent",
                    "--preds", preds, "--out", tmp_path / "x.json", flag, value)
    assert result.exit_code == 2 and flag in result.stderr
    assert not (tmp_path / "x.json").exists()
