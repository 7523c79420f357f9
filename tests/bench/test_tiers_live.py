"""bench/tiers_live.py on ten BANKING77 intents: the proxy routes every message through the
three tiers exactly as `slotgate eval` applies the cascade to the same rows, the stand-in LLM
sees exactly the escalated messages, and every reply names its tiers."""

from __future__ import annotations

import json
from pathlib import Path

from bench import tiers_live


def test_the_proxy_routes_each_message_to_the_tier_eval_predicts(
        small_banking77: Path, tmp_path: Path, cli_in_process: None) -> None:
    n = 80
    result = tiers_live.main(["--data", str(small_banking77), "--n", str(n), "--work",
                              str(tmp_path / "work"), "--slow-kind", "tfidf",
                              "--out", str(tmp_path / "tiers.json")])
    assert json.loads((tmp_path / "tiers.json").read_text()) == result
    tiers, slow = result["tiers"], result["slow"]
    assert sum(t["answered"] for t in tiers.values()) + slow["answered"] == n
    assert all(t["answered"] == t["answered_by_eval"] for t in tiers.values())
    assert slow["answered"] == slow["answered_by_eval"] and result["routed_as_eval"]
    assert result["standin_saw_exactly_escalated"] and result["every_reply_names_its_tiers"]
    # The first tier reads every message; the second only what the first turned down.
    assert tiers["embedding"]["read"] == n
    assert tiers["tfidf"]["read"] == n - tiers["embedding"]["answered"]
    assert result["expected_cost"] == result["expected_cost_by_eval"]
