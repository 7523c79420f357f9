"""bench/systemone_77.py on ten BANKING77 intents behind a server that takes four options a
question: the combined grouped read keeps a probability for every option, the chained read
loses the true one exactly when it picks the wrong group, and the paired figures add up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import systemone_77


def test_combined_read_covers_every_option_and_chained_loses_the_wrong_groups(
        small_banking77: Path, _results_elsewhere: Path) -> None:
    n = 100
    result = systemone_77.main(["--data", str(small_banking77), "--n", str(n),
                                "--server-cap", "4"])
    written = _results_elsewhere / "local" / "systemone_77.json"
    assert json.loads(written.read_text()) == result  # other data: never the recorded file
    assert result["n"] == n and result["server_cap"] == 4
    assert sum(result["groups"]) == 10 and max(result["groups"]) <= 4
    combined, chained = result["modes"]["combined"], result["modes"]["chained"]
    for mode in (combined, chained):
        assert mode["max_sum_error"] < 1e-9 and mode["max_alternatives_sent"] <= 4
        assert 0.0 <= mode["accuracy"] <= 1.0
    assert combined["options_covered"] == 10 and combined["true_label_zero_share"] == 0.0
    assert chained["options_covered"] <= 4
    assert chained["true_label_zero_share"] == pytest.approx(1 - chained["group_accuracy"])
    assert chained["http_requests"] == 2 * n  # a group, then an option in it
    assert combined["http_requests"] >= len(result["groups"]) * n
    # McNemar's discordant pairs are the accuracy difference.
    assert (result["combined_only_correct"] - result["chained_only_correct"]) / n == \
        pytest.approx(result["combined_accuracy"] - result["chained_accuracy"])
    assert 0.0 <= result["mcnemar_p"] <= 1.0
    assert result["combined_accuracy"] >= 0.8  # the reader is a real TF-IDF model
