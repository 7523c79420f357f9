"""`slotgate monitor` on a cascade's log: the proxy's own records replayed with each decision's
logged last-tier verdict (the log keeps the first tier's read only), per tier: decisions read,
answered, and the audited accuracy of its answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from policies.file import load_policy
from router.cli.app import app
from tests.router.routing.test_cascade import make, request


def replayed(tmp_path: Path, lines: list[Any]) -> dict[str, Any]:
    """`slotgate monitor --json` on a log of ``lines`` for the cascade in ``tmp_path``: the
    policy's state."""
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(app, ["monitor", "--log", str(path), "--policy",
                                      str(tmp_path / "intents.json"), "--json"])
    assert result.exit_code == 0, result.output
    [state] = json.loads(result.stdout)["policies"]
    return dict(state)


async def test_monitor_replays_a_cascade_log_per_tier(tmp_path: Path) -> None:
    service, log, _, _ = make(tmp_path)
    texts = ["easy 1", "easy 2", "medium 1", "medium 2", "medium 3", "hard 1"]
    decisions = await service.route([request(t) for t in texts], namespace="t")
    audits = [{"type": "audit", "decision_id": d.decision_id, "policy_id": d.policy_id,
               "label": "a" if d.tier == "fast" else "c"}  # every 'deep' answer ('b') is wrong
              for d in decisions if d.tier is not None]
    state = replayed(tmp_path, [*log.records, *audits])
    # audits logged without a draw probability (an older log) count as trusted labels
    assert (state["decisions"], state["accepted"], state["trusted_labels"]) == (6, 5, 5)
    assert state["labels"] == 0 and state["unweighted_audits"] == 5
    no_drift_test = {"drift": None, "drift_alarm": None, "traffic_tripped_at": None}  # the file has no tier references
    assert state["tiers"] == {
        "fast": {"read": 6, "answered": 2, "labelled": 2, "correct": 2, **no_drift_test},
        "deep": {"read": 4, "answered": 3, "labelled": 3, "correct": 0, **no_drift_test}}
    table = CliRunner().invoke(app, ["monitor", "--log", str(tmp_path / "log.jsonl"),
                                     "--policy", str(tmp_path / "intents.json")])
    assert "deep: labelled accuracy of its answers" in table.stdout
    assert load_policy(tmp_path / "intents.json").policy_id == state["policy_id"]


async def test_a_tier_whose_reads_drift_from_its_reference_is_shown_passing(
        tmp_path: Path) -> None:
    """Each tier's own watch, on its reads against its reference: the deep tier was tuned on
    confident reads and now only sees unsure ones, which it never accepts (the drift test, on
    accepted answers, has nothing to rank; the traffic test on all reads trips)."""
    sure = {"n": 200, "accept_share": 0.9,
            "confidence": sorted(0.8 + 0.2 * i / 199 for i in range(200))}
    service, log, _, _ = make(tmp_path, references={"deep": sure})
    decisions = await service.route([request(f"hard {i}") for i in range(150)], namespace="t")
    assert all(d.route == "slow" for d in decisions)
    state = replayed(tmp_path, log.records)
    deep, fast = state["tiers"]["deep"], state["tiers"]["fast"]
    assert deep["read"] == 150 and deep["traffic_tripped_at"] is not None
    assert deep["drift_alarm"] is None
    assert fast["traffic_tripped_at"] is None and fast["drift"] is None  # no reference


async def test_a_tier_whose_accepted_reads_drift_below_its_reference_alarms_in_the_replay(
        tmp_path: Path) -> None:
    """The deep tier was tuned on answers it accepted at 0.95 to 1.0; it now accepts at 0.9."""
    surer = {"n": 200, "accept_share": 1.0,
             "confidence": sorted(0.95 + 0.05 * i / 199 for i in range(200))}
    service, log, _, _ = make(tmp_path, references={"deep": surer})
    decisions = await service.route([request(f"medium {i}") for i in range(150)], namespace="t")
    assert all(d.tier == "deep" for d in decisions)
    deep = replayed(tmp_path, log.records)["tiers"]["deep"]
    assert deep["drift_alarm"] is not None and deep["drift"] > 0


async def test_a_cascade_log_is_judged_again_from_every_tiers_logged_read(
        tmp_path: Path) -> None:
    """The proxy logs each tier's read (``tier_proba``), so the replay climbs the tiers again
    with the policy's own steps and gets the served verdicts; a log written without those reads
    replays its logged verdicts instead, and says how many."""
    service, log, _, _ = make(tmp_path)
    texts = ["easy 1", "medium 1", "medium 2", "hard 1"]
    decisions = await service.route([request(t) for t in texts], namespace="t")
    reads = [record["tier_proba"] for record in log.records]
    assert [sorted(r) for r in reads] == [["fast"], ["deep", "fast"], ["deep", "fast"],
                                          ["deep", "fast"]]
    judged = replayed(tmp_path, log.records)
    assert judged["logged_verdicts"] == 0
    assert judged["accepted"] == sum(d.route == "fast" for d in decisions) == 3
    old = [{key: value for key, value in record.items() if key != "tier_proba"}
           for record in log.records]
    replayed_old = replayed(tmp_path, old)
    assert replayed_old["logged_verdicts"] == 4
    assert replayed_old["accepted"] == judged["accepted"]
