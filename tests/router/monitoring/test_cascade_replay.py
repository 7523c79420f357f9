"""`slotgate monitor` on a cascade's log: the proxy's own records replayed with each decision's
logged last-tier verdict (the log keeps the first tier's read only), per tier: decisions read,
answered, and the audited accuracy of its answers."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from policies.file import load_policy
from router.cli.app import app
from tests.router.routing.test_cascade import make, request


async def test_monitor_replays_a_cascade_log_per_tier(tmp_path: Path) -> None:
    service, log, _, _ = make(tmp_path)
    texts = ["easy 1", "easy 2", "medium 1", "medium 2", "medium 3", "hard 1"]
    decisions = await service.route([request(t) for t in texts], namespace="t")
    audits = [{"type": "audit", "decision_id": d.decision_id, "policy_id": d.policy_id,
               "label": "a" if d.tier == "fast" else "c"}  # every 'deep' answer ('b') is wrong
              for d in decisions if d.tier is not None]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in [*log.records, *audits]))
    result = CliRunner().invoke(app, ["monitor", "--log", str(path), "--policy",
                                      str(tmp_path / "intents.json"), "--json"])
    assert result.exit_code == 0, result.output
    [state] = json.loads(result.stdout)["policies"]
    assert (state["decisions"], state["accepted"], state["labels"]) == (6, 5, 5)
    assert state["tiers"] == {
        "fast": {"read": 6, "answered": 2, "labelled": 2, "correct": 2},
        "deep": {"read": 4, "answered": 3, "labelled": 3, "correct": 0}}
    table = CliRunner().invoke(app, ["monitor", "--log", str(path), "--policy",
                                     str(tmp_path / "intents.json")])
    assert "deep: labelled accuracy of its answers" in table.stdout
    assert load_policy(tmp_path / "intents.json").policy_id == state["policy_id"]
