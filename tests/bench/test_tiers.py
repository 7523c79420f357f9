"""bench/tiers: one routing's outcome counts violations, coverage and cost as stated; the report
compares the cascade with the cheapest single tier; a run on a user's own CSV prints and writes
the same JSON, with every tier and target, and never over the committed result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import tiers
from tests.bench.test_guarantee import own_csv


def test_outcome_counts_accepted_answers_of_every_tier() -> None:
    answered = np.array([0, 0, 1, 2])  # tier 0 twice, tier 1 once, the slow model once
    correct = np.array([[True, False], [False, False], [False, True], [False, False]])
    slow_correct = np.array([False, False, False, True])
    result = tiers.outcome(answered, correct, slow_correct, np.array([1.0, 1.0, 3.0, 13.0]),
                           target=0.6)
    assert result["accepted_accuracy"] == pytest.approx(2 / 3)
    assert result["violated"] is False
    assert result["coverage_by_tier"] == [0.5, 0.25, 0.25]
    assert result["cost"] == 4.5
    assert result["accuracy"] == 0.75  # two accepted right answers and the slow model's
    assert tiers.outcome(answered, correct, slow_correct, np.zeros(4), target=0.7)["violated"]
    # Nothing accepted: nothing to violate.
    none = tiers.outcome(np.full(4, 2), correct, slow_correct, np.zeros(4), target=0.99)
    assert none["accepted_accuracy"] is None and not none["violated"]


def one(cost: float, violated: bool, coverage: list[float]) -> dict[str, object]:
    return {"violated": violated, "accepted_accuracy": 0.9, "coverage_by_tier": coverage,
            "cost": cost, "accuracy": 0.9, "passed": True}


def test_summary_compares_the_cascade_with_the_cheapest_single_tier() -> None:
    draws = [{"0.9": {"cascade": one(10.0, violated, [0.5, 0.3, 0.2]),
                      "cascade, label-free order": one(11.0, False, [0.5, 0.3, 0.2]),
                      "a": one(30.0, False, [0.8, 0.0, 0.2]),
                      "b": one(20.0, False, [0.0, 0.8, 0.2]),
                      "MAPIE a": one(40.0, False, [0.7, 0.0, 0.3])}}
             for violated in (True, False, False, False)]
    report = tiers.summary(draws, names=["a", "b", "slow"], fast=["a", "b"], delta=0.05,
                           slow_cost=100.0)["0.9"]
    assert report["violation_rate"] == 0.25
    assert report["coverage_by_tier"] == {"a": 0.5, "b": 0.3, "slow": 0.2}
    assert report["best_single_tier"] == "b" and report["best_single_tier_cost"] == 20.0
    assert report["saving_vs_best_single_tier_pct"] == 50.0
    assert report["slow_only_cost"] == 100.0 and report["redraws"] == 4
    assert report["mapie"]["a"]["expected_cost"] == 40.0
    assert "note" not in report
    # A cascade dearer than the best single tier says by how much.
    for draw in draws:
        draw["0.9"]["cascade"] = one(25.0, False, [0.5, 0.2, 0.3])
    dearer = tiers.summary(draws, names=["a", "b", "slow"], fast=["a", "b"], delta=0.05,
                           slow_cost=100.0)["0.9"]
    assert dearer["saving_vs_best_single_tier_pct"] == -25.0
    assert dearer["note"].startswith("the cascade costs 5.000 (25.0%) more than b alone: it "
                                     "answers 70.0% of decisions without the slow model "
                                     "against 80.0%")


def test_a_run_on_any_labelled_csv_prints_and_writes_the_report(
        tmp_path: Path, banking77_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = own_csv(banking77_dir, tmp_path / "mine.csv", intents=5, per_intent=120)
    out = tmp_path / "tiers.json"
    tiers.main(["--data", str(data), "--text-column", "utterance", "--label-column", "intent",
                "--fast", "tfidf,wordllama", "--slow", "wordllama", "--draws", "3",
                "--labelled", "240", "--folds", "3", "--targets", "0.9,0.95,0.98",
                "--work", str(tmp_path / "work"), "--out", str(out)])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(out.read_text())
    # Cheapest first (wordllama's default cost is below TF-IDF's), the slow model last.
    assert printed["tiers"] == ["wordllama", "tfidf", "wordllama (slow)"]
    assert list(printed["targets"]) == ["0.9", "0.95", "0.98"]
    for per in printed["targets"].values():
        assert per["redraws"] == 3 and per["delta"] == 0.05
        assert 0.0 <= per["violation_rate"] <= 1.0
        assert sum(per["coverage_by_tier"].values()) == pytest.approx(1.0, abs=1e-3)
        assert per["slow_only_cost"] == 500.0
        assert set(per) >= {"expected_cost", "best_single_tier_cost", "cost_promise"}
        paired = per["cost_promise"]["cascade"]
        assert 0.0 <= paired["claimed_rate"] <= 1.0 and paired["blocks"] == 0  # too few rows
    assert printed["cost_promise"] == {"share": 0.15, "block": 1000, "delta": 0.05}


def test_the_cost_promise_counts_fixed_blocks_of_draws_that_claimed_it() -> None:
    from calibration.block_cost import BlockCostPromise

    promise = BlockCostPromise(share=0.25, block=4, delta=0.2)
    routing = {"violated": True, "coverage_by_tier": [0.5, 0.5], "cost": 1.0}
    tuned = np.array([0] * 95 + [1] * 5)  # 5 of 100 threshold rows escalated: kept
    held = np.array([1, 1, 0, 0, 0, 0, 0, 1, 1, 1])  # blocks: 2 of 4 (over), 1 of 4; 2 left
    claimed = tiers.with_cost_promise(routing, promise, tuned=tuned, held=held, n_tiers=1,
                                      passed=True)
    assert claimed["claimed"] and (claimed["blocks"], claimed["blocks_over"]) == (2, 1)
    assert claimed["violated"]
    unclaimed = tiers.with_cost_promise(routing, promise, tuned=np.ones(100, dtype=np.int64),
                                        held=held, n_tiers=1, passed=True)
    assert not unclaimed["claimed"] and unclaimed["blocks_over"] == 0
    assert not unclaimed["violated"]  # a policy that was never tuned is never served


def test_a_local_run_never_writes_the_committed_result() -> None:
    args = tiers.parse_args(["--quick"])
    assert args.out == tiers.result_path("tiers.json", recorded=False)
    for other in (["--data", "x.csv"], ["--pool", "3000"], ["--slow", "tfidf"],
                  ["--costs", "slow=100"]):
        assert tiers.parse_args(other).out == tiers.result_path("tiers.json", recorded=False)
    assert tiers.parse_args([]).out == tiers.result_path("tiers.json", recorded=True)
    assert args.out.parent.name == "local" and tiers.parse_args([]).out.parent != args.out.parent


@pytest.mark.parametrize(("argv", "message"), [
    (["--fast", "bert"], "--fast/--slow"),
    (["--costs", "wordllama=cheap"], "--costs"),
    (["--fast", "minilm", "--slow", "tfidf"], "no cost for ['minilm']"),
    (["--draws", "0"], "--draws"),
    (["--cost-share", "1.5"], "--cost-share"),
    (["--cost-block", "0"], "--cost-block"),
])
def test_bad_arguments_are_refused_by_name(argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        tiers.parse_args(argv)
    assert message in capsys.readouterr().err
