"""bench/e2e_banking77.py on ten BANKING77 intents through the OpenAI SDK, twice: the live
routes match what `slotgate eval` predicts on the same messages, the stand-in LLM saw exactly
the escalated ones, and the second pass is served from Redis."""

from __future__ import annotations

import json
from pathlib import Path

from bench import e2e_banking77


def test_live_routes_match_the_offline_prediction_and_repeat_from_the_cache(
        small_banking77: Path, tmp_path: Path, redis_url: str, cli_in_process: None) -> None:
    n = 120
    result = e2e_banking77.main(["--data", str(small_banking77), "--n", str(n), "--work",
                                 str(tmp_path / "work"), "--redis-url", redis_url,
                                 "--out", str(tmp_path / "e2e.json")])
    assert json.loads((tmp_path / "e2e.json").read_text()) == result
    assert result["n"] == n and result["all_answers_valid"]
    first = result["routes_first_pass"]
    assert set(first) <= {"fast", "slow"} and sum(first.values()) == n
    assert result["escalated"] == first.get("slow", 0) == result["standin_calls"]
    assert result["standin_saw_exactly_escalated"] and result["cache_errors"] == 0
    # The policy decides the same rows live as offline: equal shares on the same sample, but
    # for fast reads that timed out on a loaded machine (each one escalated and counted).
    timeouts = result["fast_backend_errors"]
    assert abs(result["fast_share"] - result["expected_fast_share_on_sample"]) <= timeouts / n
    assert 0.0 < result["fast_share"] < 1.0 and 0.0 < result["policy_threshold"] < 1.0
    lower, upper = result["predicted_fast_share_ci"]
    assert 0.0 <= lower <= result["predicted_fast_share"] <= upper <= 1.0
    # Accepted answers are held to the target (0.95) on data the policy never saw: some slack.
    assert result["fast_accuracy"] >= 0.85 and 0.0 <= result["accuracy"] <= 1.0
    # The second pass: every decision a cache hit, not one new slow call.
    assert result["routes_second_pass"] == {"cache": n}
    assert result["second_pass_cache_hits"] == n and result["second_pass_standin_calls"] == 0
