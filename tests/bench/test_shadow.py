"""bench/shadow.py end to end on ten BANKING77 intents: shadow mode through the live proxy, the
log exported with the slow model's answers, a policy tuned on them and reloaded without a
restart; the figures it reports add up and keep the promise it was tuned for."""

from __future__ import annotations

import json
from pathlib import Path

from bench import shadow


def test_cold_start_tunes_on_the_slow_model_and_keeps_its_promise(
        small_banking77: Path, tmp_path: Path, _results_elsewhere: Path,
        cli_in_process: None) -> None:
    result = shadow.main(["--data", str(small_banking77), "--n", "400", "--work",
                          str(tmp_path / "work")])
    assert (result["n"], result["n_shadow"], result["n_after"]) == (400, 200, 200)
    # Shadow mode: every decision answered by the slow model, one call each.
    assert result["shadow_all_served_by_slow"] and result["slow_calls_shadow"] == 200
    assert result["export_labels"].startswith("0 human (/v1/feedback), 200 the slow model's")
    policy = result["policy"]
    assert policy["guarantee"] == "agreement_with_slow" and policy["shadow"] is False
    assert policy["threshold"] is not None and 0.0 < policy["threshold"] < 1.0
    assert policy["bound"] >= 0.95 and 0.0 < policy["coverage"] <= 1.0
    assert result["guarantee_after"] == ["agreement_with_slow"]
    assert result["guarantee_escalated"] in ([], ["None"])  # the slow model's: no guarantee
    # After the switch: what was not accepted went to the slow model, and nothing else did.
    accepted = round(result["fast_share_after"] * 200)
    assert 0 < accepted <= 200 and result["slow_calls_after"] == 200 - accepted
    assert result["agreement_after"] >= 0.9  # tuned for 0.95 at delta 0.05, on 200 rows
    assert 0.0 <= result["accuracy_after_vs_human_labels"] <= 1.0
    # A run on other data than BANKING77's default folder leaves bench/results/ alone.
    written = _results_elsewhere / "local" / "shadow.json"
    assert json.loads(written.read_text())["policy"] == policy
    assert not (_results_elsewhere / "shadow.json").exists()
