"""`slotgate monitor`: a decision log with audits and feedback replayed into a table, JSON and a
PNG; a log with no decisions, or none by the given policy, is refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from typer.testing import CliRunner

from router.tuning.cli import app
from tests.router.monitoring.conftest import OPTIONS, confident, watched_policy


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def write_log(path: Path, policy_id: str, *, n: int = 600, shift_at: int = 300) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        p = float(rng.uniform(0.9, 1.0) if i < shift_at else rng.uniform(0.4, 0.6))
        lines.append({"type": "decision", "decision_id": f"d{i}", "policy_id": policy_id,
                      "options": list(OPTIONS), "proba": list(confident(p)), "answer": "a",
                      "route": "fast", "escalated": False})
        if i % 5 == 0:  # audited; the audit of every 50th disagrees, a human overrules one
            lines.append({"type": "audit", "decision_id": f"d{i}", "label": "b" if i % 50 == 0
                          else "a", "policy_id": policy_id})
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
    assert state["labels"] == 120 and state["accuracy"] == 1 - 11 / 120  # 12 audits say "b"; the human says "a" for d0
    assert state["alarm"] == "drift" and 300 < state["alarms"][0]["decision"] < 450
    assert len(state["logged_alarms"]) == 1
    png = (tmp_path / "monitor.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    table = invoke("monitor", "--log", tmp_path / "log.jsonl", "--policy",
                   tmp_path / "policy.json")
    assert table.exit_code == 0 and "drift at decision" in table.stdout


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
