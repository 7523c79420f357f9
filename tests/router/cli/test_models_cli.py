"""`slotgate train` and `predict` as a person runs them: --question is a required option of
`train` (help and refusal say so), and off a terminal, where no progress bar draws, each step
of the work is one line on stderr."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from router.cli.app import app


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def toy_csv(path: Path) -> Path:
    rows = [("where is my card", "card_arrival"), ("my card has not come", "card_arrival"),
            ("card still not here", "card_arrival"), ("i lost my card", "lost_card"),
            ("my card was stolen", "lost_card"), ("someone took my card", "lost_card")] * 10
    path.write_text("text,category\n" + "".join(f"{t} {i},{c}\n"
                                                for i, (t, c) in enumerate(rows)))
    return path


def test_train_marks_question_required_and_refuses_to_run_without_it(tmp_path: Path) -> None:
    shown = invoke("train", "--help")
    [entry] = re.findall(r"^  --question <.*?(?=^  --)", shown.stdout, flags=re.MULTILINE | re.DOTALL)
    assert "[required]" in entry
    model = tmp_path / "m.joblib"
    refused = invoke("train", "--data", toy_csv(tmp_path / "t.csv"), "--label-column",
                     "category", "--out", model)
    assert refused.exit_code == 2 and "Missing option '--question'" in refused.stderr
    assert not model.exists()


def test_train_off_a_terminal_prints_a_line_per_step(tmp_path: Path) -> None:
    data = toy_csv(tmp_path / "t.csv")
    result = invoke("train", "--question", "intent", "--data", data, "--label-column",
                    "category", "--cv", 3, "--oof-out", tmp_path / "oof.jsonl",
                    "--out", tmp_path / "m.joblib")
    assert result.exit_code == 0, result.stderr
    steps = re.findall(r"^training tfidf on 60 rows \(3 out-of-fold models first\): (\d)/4 "
                       r"\(\d+\.\d s\)$", result.stderr, flags=re.MULTILINE)
    assert steps == ["0", "1", "2", "3", "4"]  # the start, three fold models, the saved model
    assert "trained tfidf on 60 rows" in result.stdout and "/4" not in result.stdout

    predicted = invoke("predict", "--model", tmp_path / "m.joblib", "--data", data,
                       "--label-column", "category", "--batch-size", 25,
                       "--out", tmp_path / "p.jsonl")
    assert predicted.exit_code == 0, predicted.stderr
    assert re.findall(r"^predicting t\.csv: (\d+)/60 ", predicted.stderr,
                      flags=re.MULTILINE) == ["0", "25", "50", "60"]
