"""`slotgate alarms list|clear` on a decision log alone (no Redis): list shows the alarms a
restart would re-arm, clear writes the record that wins over them, a bad --log is refused."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from router.cli.app import app


def alarm(policy_id: str, kind: str, at: float) -> str:
    return json.dumps({"type": "alarm", "policy_id": policy_id, "kind": kind, "decision": 3,
                       "time": at, "detail": f"{kind} test"}) + "\n"


def test_list_then_clear_then_list(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    log.write_text(alarm("p@1", "drift", 1.0) + alarm("p@1", "accuracy", 2.0)
                   + alarm("q@2", "drift", 3.0) + "{damaged\n")
    runner = CliRunner()
    listed = runner.invoke(app, ["alarms", "list", "--log", str(log), "--json"])
    assert listed.exit_code == 0, listed.output
    held = {(r["policy_id"], r["kind"]) for r in json.loads(listed.output)["alarms"]}
    assert held == {("p@1", "drift"), ("p@1", "accuracy"), ("q@2", "drift")}
    cleared = runner.invoke(app, ["alarms", "clear", "--policy", "p@1", "--log", str(log)])
    assert cleared.exit_code == 0, cleared.output
    assert "cleared policy p@1 (alarms: accuracy, drift)" in cleared.output
    assert "clear when restarted" in cleared.output
    last = json.loads(log.read_text().splitlines()[-1])
    assert (last["kind"], last["policy_id"]) == ("clear", "p@1")
    listed = runner.invoke(app, ["alarms", "list", "--log", str(log), "--policy", "p@1"])
    assert listed.exit_code == 0 and "no alarm stands for policy p@1" in listed.output
    with log.open("a") as f:  # an alarm raised after the clear stands again
        f.write(alarm("p@1", "drift", last["time"] + 1.0))
    listed = runner.invoke(app, ["alarms", "list", "--log", str(log), "--json"])
    assert {(r["policy_id"], r["kind"]) for r in json.loads(listed.output)["alarms"]} == {
        ("p@1", "drift"), ("q@2", "drift")}


def test_clear_refuses_a_log_folder_that_does_not_exist(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["alarms", "clear", "--policy", "p",
                                      "--log", str(tmp_path / "nowhere" / "d.jsonl")])
    assert result.exit_code == 2 and "--log: no folder" in result.output
