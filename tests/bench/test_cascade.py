"""Smoke test of the cascade benchmark's arithmetic on synthetic tiers: the frontier's ends are
the fast-alone and slow-alone accuracies, operating points add up, the fixed policies route as
named, and a live summary compares against the offline expectation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.cascade_frontier import Tier, fixed_policy, frontier_curve, operating_point
from bench.cascade_live import summarize
from policies.policy import Policy
from policies.types import OptionScores


def tier(kind: str, correct: list[bool]) -> Tier:
    answers = ["a" if c else "b" for c in correct]
    return Tier(kind, Path(f"{kind}.jsonl"), answers, np.array(correct), "fp")


@pytest.fixture
def tiers() -> tuple[Tier, Tier, np.ndarray]:
    rng = np.random.default_rng(0)
    confidence = rng.uniform(size=400)
    fast = tier("fast", list(rng.uniform(size=400) < confidence))  # confident -> more often right
    slow = tier("slow", list(rng.uniform(size=400) < 0.9))
    return fast, slow, confidence


def test_curve_ends_are_fast_alone_and_slow_alone(tiers: tuple[Tier, Tier, np.ndarray]) -> None:
    fast, slow, confidence = tiers
    curve = frontier_curve(confidence, fast, slow, points=11)
    assert curve["escalation_rate"][0] == 0.0 and curve["escalation_rate"][-1] == 1.0
    assert curve["accuracy"][0] == pytest.approx(fast.correct.mean(), abs=1e-4)
    assert curve["accuracy"][-1] == pytest.approx(slow.correct.mean(), abs=1e-4)
    assert np.all(np.diff(curve["escalation_rate"]) > 0)
    assert curve["best_accuracy"] >= max(curve["accuracy"]) - 1e-9
    # Escalating the least confident half helps when confidence predicts correctness.
    assert curve["accuracy"][5] > curve["accuracy"][0]


def test_operating_point_adds_up(tiers: tuple[Tier, Tier, np.ndarray]) -> None:
    fast, slow, confidence = tiers
    accepted = confidence >= 0.7
    point = operating_point(accepted, fast, slow)
    expected = (fast.correct[accepted].sum() + slow.correct[~accepted].sum()) / 400
    assert point["accuracy"] == pytest.approx(expected, abs=1e-4)
    assert point["escalation_rate"] == pytest.approx(1 - accepted.mean(), abs=1e-4)
    assert point["slow_calls_per_1000"] == pytest.approx(1000 * (1 - accepted.mean()), abs=0.1)
    low, high = point["accuracy_ci"]
    assert low <= point["accuracy"] <= high
    assert operating_point(np.zeros(400, dtype=bool), fast, slow)["accepted_accuracy"] is None


@pytest.mark.parametrize("accept_all", [True, False])
def test_fixed_policies_accept_or_escalate_everything(tmp_path: Path, accept_all: bool) -> None:
    path = fixed_policy(tmp_path / "p.json", name="end", accept_all=accept_all, fingerprint="fp")
    runtime = Policy.from_file(path)
    for proba in ((0.999, 0.001), (0.5, 0.5), (0.02, 0.98)):
        verdict, _ = runtime.decide(OptionScores(("a", "b"), proba))
        assert verdict.accept is accept_all


def test_summary_compares_live_with_offline() -> None:
    res = [{"answer": "a", "route": "fast", "ms": 2.0}, {"answer": "b", "route": "slow", "ms": 9.0},
           {"answer": "a", "route": "fast", "ms": 3.0}, {"answer": "a", "route": "slow", "ms": 8.0}]
    expected = {"escalation_rate": 0.5, "answers": ["a", "b", "a", "b"]}
    out = summarize(res, expected, ["a", "a", "a", "a"], full_rate=0.5)
    assert out["escalation_rate"] == 0.5 and out["escalation_z_vs_full_test"] == 0.0
    assert out["answers_equal_offline"] == 0.75 and out["accuracy"] == 0.75
    assert out["routes"] == {"fast": 2, "slow": 2} and out["slow_calls_per_1000"] == 500.0
    assert out["by_route"]["slow"]["mean_ms"] == 8.5 and out["mean_ms"] == 5.5


def test_only_the_full_run_on_the_default_data_writes_the_recorded_result(
        tmp_path: Path, _results_elsewhere: Path) -> None:
    from bench.cascade import parse_args

    recorded = parse_args([])
    assert (recorded.out, recorded.png) == (_results_elsewhere / "cascade.json",
                                            _results_elsewhere / "cascade_frontier.png")
    for argv in (["--quick"], ["--data", str(tmp_path)]):
        args = parse_args(argv)
        assert (args.out, args.png) == (_results_elsewhere / "local" / "cascade.json",
                                        _results_elsewhere / "local" / "cascade_frontier.png")
    assert parse_args(["--out", str(tmp_path / "c.json")]).out == tmp_path / "c.json"
