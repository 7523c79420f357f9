"""The CLI's additions around the fitted policy: `tune --per-answer-floor`, `eval`'s per-answer
table, `predict --allow-novel-labels`, the monitoring flags taking the policy file's defaults,
`--seed` help, and the layering (router.tuning is a library: no CLI, HTTP or monitoring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from policies.file import PolicyFile, load_policy
from router.cli.app import app
from tests.router.cli.test_bad_input import small_model  # noqa: F401 (fixture)
from tests.router.cli.test_tune_command import synthetic_rows, write_jsonl


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def weak_maybe_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Synthetic reads where answers "maybe" are right only 70% of the time at any confidence."""
    rows = synthetic_rows(n, seed=seed)
    for i, row in enumerate(rows):
        if row["proba"].index(max(row["proba"])) == 2:
            row["label"] = "maybe" if i % 10 < 7 else "yes"
    return rows


def test_per_answer_floor_closes_the_weak_answer_and_eval_shows_it_worst_first(
        tmp_path: Path) -> None:
    preds = write_jsonl(tmp_path / "tune.jsonl", weak_maybe_rows(4000, seed=0))
    fresh = write_jsonl(tmp_path / "test.jsonl", weak_maybe_rows(4000, seed=1))
    plain, floored = tmp_path / "plain.json", tmp_path / "floored.json"
    assert invoke("tune", "--question", "intent",
                  "--preds", preds, "--target-accuracy", 0.75, "--out", plain
                  ).exit_code == 0
    result = invoke("tune", "--question", "intent",
                    "--preds", preds, "--target-accuracy", 0.75, "--out", floored,
                    "--per-answer-floor", 0.8)
    assert result.exit_code == 0, result.stderr
    assert "per-answer floor 0.8" in result.stdout and "1 always escalated" in result.stdout
    policy = load_policy(floored)
    assert policy.per_answer_floor == 0.8 and policy.threshold == load_policy(plain).threshold
    assert policy.rule.kind == "threshold" and policy.rule.per_option["maybe"] is None
    assert policy.coverage < load_policy(plain).coverage

    before = json.loads(invoke("eval", "--preds", fresh, "--policy", plain, "--json").stdout)
    after = json.loads(invoke("eval", "--preds", fresh, "--policy", floored, "--json").stdout)
    assert before["per_answer"][0]["answer"] == "maybe"
    assert before["per_answer"][0]["accuracy"] < 0.8
    assert all(row["accuracy"] >= 0.8 for row in after["per_answer"])
    assert "maybe" not in {row["answer"] for row in after["per_answer"]}

    shown = invoke("eval", "--preds", fresh, "--policy", plain)
    assert shown.exit_code == 0
    table = shown.stdout[shown.stdout.index("per answer, worst first"):]
    assert table.index("maybe") < min(table.index(" yes "), table.index(" no "))


def test_novel_labels_are_refused_unless_allowed_then_counted_wrong(
        tmp_path: Path, small_model: Path) -> None:  # noqa: F811
    data = tmp_path / "in.csv"
    data.write_text("text,category\r\ni lost my card,card_lost\r\nhello atm,atm_support\r\n"
                    "where is my new card,card_arrival\r\n")
    out = tmp_path / "preds.jsonl"
    refused = invoke("predict", "--model", small_model, "--data", data, "--label-column",
                     "category", "--out", out)
    assert refused.exit_code == 2 and "--allow-novel-labels" in refused.stderr
    result = invoke("predict", "--model", small_model, "--data", data, "--label-column",
                    "category", "--out", out, "--allow-novel-labels")
    assert result.exit_code == 0, result.stderr
    assert "1 rows labelled outside the options" in result.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row.get("novel", False) for row in rows] == [False, True, False]

    oof = tmp_path / "known.jsonl"
    write_jsonl(oof, [{**row, "id": f"k{i}"} for i, row in enumerate(
        [rows[0], rows[2]] * 30)])
    policy = tmp_path / "p.json"
    assert invoke("tune", "--question", "intent",
                  "--preds", oof, "--target-accuracy", 0.5, "--out", policy,
                  "--calibrator", "none").exit_code == 0
    metrics = json.loads(invoke("eval", "--preds", out, "--policy", policy, "--json").stdout)
    assert metrics["n"] == 3 and metrics["n_novel"] == 1
    assert metrics["accuracy"] <= 2 / 3  # the novel row can never be right
    refused_tune = invoke("tune", "--question", "intent",
                          "--preds", out, "--out", tmp_path / "q.json")
    assert refused_tune.exit_code == 2 and "novel" in refused_tune.stderr


def test_monitoring_flags_default_to_the_policy_file_and_are_checked_by_its_fields(
        tmp_path: Path) -> None:
    preds = write_jsonl(tmp_path / "p.jsonl", synthetic_rows(2000))
    out = tmp_path / "policy.json"
    assert invoke("tune", "--question", "intent", "--preds", preds, "--target-accuracy", 0.9,
                  "--out", out).exit_code == 0
    policy = load_policy(out)
    assert policy.on_alarm == PolicyFile.model_fields["on_alarm"].default
    named = tmp_path / "named.json"
    assert invoke("tune", "--question", "intent", "--preds", preds, "--target-accuracy", 0.9,
                  "--out", named, "--on-alarm", "alert_only").exit_code == 0
    assert load_policy(named).on_alarm == "alert_only"
    bad = invoke("tune", "--question", "intent", "--preds", preds, "--out", tmp_path / "x.json",
                 "--on-alarm", "panic")
    assert bad.exit_code == 2 and "--on-alarm" in bad.stderr and "'panic'" in bad.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("command", ["train", "tune"])
def test_seed_has_help(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    line = next(line for line in result.stdout.splitlines() if "--seed" in line)
    assert "Seed of the" in line


def test_the_tuning_library_imports_no_cli_http_or_monitoring() -> None:
    code = ("import sys, pkgutil, importlib, router.tuning as t\n"
            "for m in pkgutil.iter_modules(t.__path__): importlib.import_module('router.tuning.' + m.name)\n"
            "bad = sorted(n for n in sys.modules if n.startswith(('router.http', 'router.monitoring',"
            " 'router.cli', 'typer')))\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
