"""``--policy`` means the same in `eval`, `monitor` and `alarms`: a policy file's path, or the id
or name of a policy ./slotgate.yaml loads; anything else is one error line naming the flag and
the configured policies."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from router.cli.app import app
from tests.router.routing.test_registry import FINGERPRINT, policy_file


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout as `make serve` leaves it: ./slotgate.yaml loading var/policy.json."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "var").mkdir()
    policy_file("banking77").write(tmp_path / "var" / "policy.json")
    (tmp_path / "slotgate.yaml").write_text("policy:\n  files: [var/policy.json]\n")
    return tmp_path / "var" / "policy.json"


def write_preds(path: Path, n: int = 200) -> None:
    rng = random.Random(3)
    with path.open("w") as f:
        for i in range(n):
            p = rng.uniform(0.5, 1.0)
            label = "a" if rng.random() < p else "b"
            f.write(json.dumps({"id": f"r{i}", "options": ["a", "b"], "proba": [p, 1 - p],
                                "label": label, "fingerprint": FINGERPRINT}) + "\n")


def test_eval_takes_a_file_a_policy_id_or_a_name(served: Path, tmp_path: Path) -> None:
    from policies.file import load_policy

    preds = tmp_path / "preds.jsonl"
    write_preds(preds)
    policy_id = load_policy(served).policy_id
    results = [invoke("eval", "--preds", preds, "--policy", ref, "--json")
               for ref in (served, policy_id, "banking77")]
    for result in results:
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["policy"] == policy_id
    assert results[0].stdout == results[1].stdout == results[2].stdout


def test_a_policy_that_is_neither_is_one_line_naming_the_configured_ones(served: Path,
                                                                        tmp_path: Path) -> None:
    preds = tmp_path / "preds.jsonl"
    write_preds(preds, 10)
    for args in (("eval", "--preds", preds), ("monitor", "--log", tmp_path / "d.jsonl")):
        result = invoke(*args, "--policy", "policy.json")
        assert result.exit_code == 2, result.output
        [line] = result.stderr.strip().splitlines()
        assert "--policy: 'policy.json' is neither a policy file nor" in line
        assert "banking77@" in line and "var/policy.json" in line


def test_alarms_take_the_policy_file_as_well_as_its_id(served: Path, tmp_path: Path) -> None:
    from policies.file import load_policy

    policy_id = load_policy(served).policy_id
    log = tmp_path / "var" / "decisions.jsonl"
    log.write_text(json.dumps({"type": "alarm", "policy_id": policy_id, "kind": "drift",
                               "decision": 3, "time": 1.0, "detail": "drift test"}) + "\n")
    listed = invoke("alarms", "list", "--log", log, "--policy", served, "--json")
    assert listed.exit_code == 0, listed.output
    assert [a["policy_id"] for a in json.loads(listed.stdout)["alarms"]] == [policy_id]
    cleared = invoke("alarms", "clear", "--log", log, "--policy", "var/policy.json")
    assert cleared.exit_code == 0, cleared.output
    assert f"cleared policy {policy_id} (alarms: drift)" in cleared.stdout
    assert "no alarm stands" in invoke("alarms", "list", "--log", log, "--policy",
                                       "banking77").stdout
