"""bench/e2e_banking77.py at a small size: the whole loop on BANKING77 (CLI-trained models, tuned
policy, uvicorn, OpenAI SDK, litellm to the stand-in, private Redis), checked by its own figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.e2e_banking77 import main


@pytest.mark.long
def test_e2e_banking77_small(banking77_dir: Path, tmp_path: Path) -> None:
    result = main(["--n", "120", "--data", str(banking77_dir), "--work", str(tmp_path)])
    assert result["n"] == 120 and result["all_answers_valid"]
    assert result["standin_saw_exactly_escalated"]
    assert result["standin_calls"] == result["escalated"] > 0
    # Fast reads that did not time out follow the policy exactly: the share it predicts here.
    timeouts = result["fast_backend_errors"]
    assert abs(result["fast_share"] - result["expected_fast_share_on_sample"]) <= timeouts / 120
    assert result["second_pass_cache_hits"] + result["cache_errors"] >= 120
    assert result["second_pass_standin_calls"] <= result["cache_errors"]
