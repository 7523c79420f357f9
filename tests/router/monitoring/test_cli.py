"""`slotgate monitor`: a decision log with audits and feedback replayed into a table, JSON and a
PNG; a log with no decisions, or none by the given policy, is refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from router.cli.app import app
from tests.router.monitoring.conftest import OPTIONS, confident, watched_policy


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def write_log(path: Path, policy_id: str, *, n: int = 600, shift_at: int = 300,
              probability: float | None = None) -> None:
    """Every fifth decision audited; ``probability``: the draw probability its audit records
    (None: none, as an older slotgate wrote)."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        p = float(rng.uniform(0.9, 1.0) if i < shift_at else rng.uniform(0.86, 0.88))
        lines.append({"type": "decision", "decision_id": f"d{i}", "policy_id": policy_id,
                      "options": list(OPTIONS), "proba": list(confident(p)), "answer": "a",
                      "route": "fast", "escalated": False})
        if i % 5 == 0:  # audited; the audit of every 50th disagrees, a human overrules one
            lines.append({"type": "audit", "decision_id": f"d{i}", "label": "b" if i % 50 == 0
                          else "a", "policy_id": policy_id, "probability": probability})
    lines.append({"type": "feedback", "decision_id": "d0", "label": "a"})
    lines.append({"type": "alarm", "policy_id": policy_id, "kind": "drift", "decision": 320,
                  "time": 0.0, "detail": "logged by the proxy"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_monitor_replays_the_log_into_json_and_a_png(tmp_path: Path) -> None:
    policy = watched_policy()
    policy.write(tmp_path / "policy.json")
    write_log(tmp_path / "log.jsonl", policy.policy_id)
    result = invoke("monitor", "--log", tmp_path / "log.jsonl", "--policy",
                    tmp_path / "policy.json", "--plot", tmp_path / "monitor.png", "--json")
    assert result.exit_code == 0, result.stderr
    [state] = json.loads(result.stdout)["policies"]
    assert state["policy_id"] == policy.policy_id and state["decisions"] == 600
    # Audits logged without a draw probability are trusted labels: 12 say "b"; the human says "a" for d0
    assert state["trusted_labels"] == 120 and state["trusted_accuracy"] == 1 - 11 / 120
    assert state["labels"] == 0 and state["unweighted_audits"] == 119
    assert state["alarm"] == "drift" and 300 < state["alarms"][0]["decision"] < 450
    assert len(state["logged_alarms"]) == 1
    png = (tmp_path / "monitor.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    table = invoke("monitor", "--log", tmp_path / "log.jsonl", "--policy",
                   tmp_path / "policy.json")
    assert table.exit_code == 0 and "drift at decision" in table.stdout


def test_audits_logged_with_their_draw_probability_feed_the_weighted_estimate(
        tmp_path: Path) -> None:
    policy = watched_policy(audit_rate=0.2)
    log = tmp_path / "log.jsonl"
    write_log(log, policy.policy_id, probability=0.2)
    state = monitor_json(tmp_path, log, policy)
    audited = state["labels"]
    assert 0 < audited <= 120 and state["unweighted_audits"] == 0
    assert state["trusted_labels"] == 0  # d0's human label meets an audit drawn by risk
    # Every accepted decision is bet on; the estimate is 1 - mean(Z), inside its interval.
    assert state["accuracy_lower"] <= state["accuracy"] <= state["accuracy_upper"]
    assert state["accuracy_upper"] - state["accuracy_lower"] < 1.0


def test_monitor_refuses_a_log_without_decisions_or_without_the_policy(tmp_path: Path) -> None:
    policy = watched_policy()
    policy.write(tmp_path / "policy.json")
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"type": "feedback", "decision_id": "x", "label": "a"}) + "\n")
    result = invoke("monitor", "--log", empty, "--policy", tmp_path / "policy.json")
    assert result.exit_code == 2 and "no decisions" in result.stderr and "'type'" in result.stderr
    other = tmp_path / "other.jsonl"
    write_log(other, "someone-else@123")
    result = invoke("monitor", "--log", other, "--policy", tmp_path / "policy.json")
    assert result.exit_code == 2 and "someone-else@123" in result.stderr
    result = invoke("monitor", "--log", tmp_path / "missing.jsonl", "--policy",
                    tmp_path / "policy.json")
    assert result.exit_code == 2 and "not found" in result.stderr
    (tmp_path / "bad.json").write_text("{}")
    result = invoke("monitor", "--log", other, "--policy", tmp_path / "bad.json")
    assert result.exit_code == 2 and "--policy" in result.stderr and "'format'" in result.stderr


def monitor_json(tmp_path: Path, log: Path, policy: Any) -> Any:
    policy.write(tmp_path / "policy.json")
    result = invoke("monitor", "--log", log, "--policy", tmp_path / "policy.json", "--json")
    assert result.exit_code == 0, result.output
    [state] = json.loads(result.stdout)["policies"]
    return state


def test_a_log_appended_twice_counts_each_decision_once(tmp_path: Path) -> None:
    policy = watched_policy()
    once, twice = tmp_path / "once.jsonl", tmp_path / "twice.jsonl"
    write_log(once, policy.policy_id)
    twice.write_text(once.read_text() * 2)
    single, doubled = monitor_json(tmp_path, once, policy), monitor_json(tmp_path, twice, policy)
    assert doubled["decisions"] == single["decisions"] == 600
    assert doubled["trusted_labels"] == single["trusted_labels"] == 120
    assert doubled["per_answer"] == single["per_answer"]
    for log in (once, twice):  # export-log agrees: each decision once
        out = tmp_path / f"{log.stem}.preds.jsonl"
        assert invoke("export-log", "--log", log, "--out", out).exit_code == 0
        assert len(out.read_text().splitlines()) == 600


def test_damaged_lines_are_skipped_and_counted_never_a_traceback(tmp_path: Path) -> None:
    policy = watched_policy()
    log = tmp_path / "log.jsonl"
    write_log(log, policy.policy_id)
    with log.open("a") as f:  # a line of 100,000 '[' and an alarm missing its 'decision'
        f.write("[" * 100_000 + "\n")
        f.write(json.dumps({"type": "alarm", "policy_id": policy.policy_id, "kind": "drift",
                            "time": 0.0, "detail": "torn"}) + "\n")
    state = monitor_json(tmp_path, log, policy)
    assert state["decisions"] == 600 and state["damaged_lines"] == 2
    assert len(state["logged_alarms"]) == 1  # the valid one
    out = tmp_path / "preds.jsonl"
    result = invoke("export-log", "--log", log, "--out", out)
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 600


def test_a_log_of_several_option_counts_replays(tmp_path: Path) -> None:
    """A 2-option and a 77-option decision logged under one policy (the default policy once
    routed any question): no numpy "inhomogeneous shape", each decision judged on its own."""
    policy = watched_policy()
    log = tmp_path / "log.jsonl"
    write_log(log, policy.policy_id, n=50)
    many = [f"intent_{k}" for k in range(77)]
    with log.open("a") as f:
        for i, options in enumerate((["yes", "no"], many)):
            proba = [0.9] + [0.1 / (len(options) - 1)] * (len(options) - 1)
            f.write(json.dumps({"type": "decision", "decision_id": f"m{i}", "options": options,
                                "proba": proba, "policy_id": policy.policy_id,
                                "answer": options[0], "route": "fast"}) + "\n")
    state = monitor_json(tmp_path, log, policy)
    assert state["decisions"] + state["unfit_decisions"] == 52


def test_the_replay_asks_the_policys_own_rule(tmp_path: Path) -> None:
    """Per-option bars and the escalation budget hold in a replay, not ``c >= threshold``."""
    from policies.rules import BudgetRule, ThresholdRule

    strict_a = watched_policy(rule=ThresholdRule(0.8, {"a": 1.0}).to_dict())
    log = tmp_path / "strict.jsonl"
    write_log(log, strict_a.policy_id, n=300, shift_at=300)  # every read confident on "a"
    assert monitor_json(tmp_path, log, strict_a)["accepted"] == 0
    plain = watched_policy()
    write_log(log, plain.policy_id, n=300, shift_at=300)
    assert monitor_json(tmp_path, log, plain)["accepted"] > 250
    budget = watched_policy(rule=BudgetRule(ThresholdRule(1.0), max_escalation=0.2,
                                            window=100).to_dict(), threshold=1.0)
    write_log(log, budget.policy_id, n=300, shift_at=300)
    accepted = monitor_json(tmp_path, log, budget)["accepted"]
    assert 0.75 * 300 <= accepted <= 0.85 * 300  # the budget accepts what it may not escalate


def test_monitor_shows_accepted_accuracy_per_answer_worst_first(tmp_path: Path) -> None:
    policy = watched_policy()
    log = tmp_path / "log.jsonl"
    lines = []
    for i in range(200):  # answer "a": 100 labelled, 99 right; "b": 100 labelled, 80 right
        answer = "a" if i % 2 == 0 else "b"
        proba = [0.98, 0.01, 0.01] if answer == "a" else [0.01, 0.98, 0.01]
        lines.append({"type": "decision", "decision_id": f"d{i}", "policy_id": policy.policy_id,
                      "options": list(OPTIONS), "proba": proba, "answer": answer,
                      "route": "fast"})
        wrong = (answer == "a" and i == 0) or (answer == "b" and i % 10 == 1)
        lines.append({"type": "feedback", "decision_id": f"d{i}",
                      "label": "c" if wrong else answer, "time": float(i)})
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = monitor_json(tmp_path, log, policy)["per_answer"]
    assert [(r["answer"], r["n"], r["correct"]) for r in rows] == [("b", 100, 80),
                                                                   ("a", 100, 99)]
    assert rows[0]["lower"] < 0.8 < rows[0]["upper"] < rows[1]["upper"]
    assert rows[0]["lower"] == pytest.approx(0.7082, abs=1e-3)  # Clopper-Pearson 95%: 80/100
    table = invoke("monitor", "--log", log, "--policy", tmp_path / "policy.json")
    assert table.exit_code == 0 and "per answer, worst first" in table.stdout
    assert table.stdout.index("0.8000 [") < table.stdout.index("0.9900 [")
