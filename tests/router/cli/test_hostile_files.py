"""Files nested past Python's JSON parser: every command that reads one exits 2 with one line
naming the file, never a RecursionError traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from router.cli.app import app

OPTIONS = ["card_arrival", "card_lost", "exchange_rate"]
DEEP = "[" * 5000 + "]" * 5000


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def rows(n: int) -> str:
    return "".join(json.dumps({"id": str(i), "options": OPTIONS, "proba": [0.7, 0.2, 0.1],
                               "label": OPTIONS[i % 3]}) + "\n" for i in range(n))


def one_line_naming(result: Any, path: Path) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "nested" in lines[0], result.stderr


def test_tune_preds_with_a_deeply_nested_line(tmp_path: Path) -> None:
    preds = tmp_path / "preds.jsonl"
    preds.write_text(rows(5) + DEEP + "\n" + rows(5))
    one_line_naming(invoke("tune", "--preds", preds, "--out", tmp_path / "p.json"), preds)


@pytest.fixture
def nested_policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.json"
    path.write_text('{"format": ' + DEEP + "}")
    return path


def test_eval_with_a_deeply_nested_policy_file(tmp_path: Path, nested_policy: Path) -> None:
    preds = tmp_path / "preds.jsonl"
    preds.write_text(rows(40))
    one_line_naming(invoke("eval", "--preds", preds, "--policy", nested_policy), nested_policy)


def test_monitor_with_a_deeply_nested_policy_file(tmp_path: Path, nested_policy: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    log.write_text("")
    one_line_naming(invoke("monitor", "--log", log, "--policy", nested_policy), nested_policy)
