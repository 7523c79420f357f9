"""Tuning with a cost promise, one tier and a cascade alike: the chosen rule's bound is kept and
recorded in the file with the coverage the accuracy promise alone gives; a pair no rule keeps
fails naming ``cost_share``; a file without a promise keeps its digest and id."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

from policies.file import load_policy
from policies.options import TierCost
from policies.policy import Policy
from policies.scope import Question
from tests.policies.test_tuning import overconfident_reads

QUESTION = Question.asked("q")


def test_one_tier_keeps_the_promise_on_fresh_blocks() -> None:
    proba, y_true = overconfident_reads(4000, seed=0)
    policy = Policy(target_accuracy=0.8, cost_share=0.4, cost_block=200,
                    cost_delta=0.05).fit(proba, y_true)
    bound = policy.cost_bound_
    assert bound.kept and bound.block_bound <= 0.05
    assert bound.n_escalated == int((~policy.accepted_).sum())
    assert policy.coverage_alone_ == policy.coverage_  # one tier: the promise never moves it
    fresh, _ = overconfident_reads(20000, seed=1)
    escalated = policy.judge([fresh]).escalated
    blocks = escalated[: len(escalated) // 200 * 200].reshape(-1, 200).mean(axis=1)
    assert (blocks > 0.4).mean() <= 0.05
    assert escalated.mean() <= bound.escalation_upper


def test_a_pair_no_rule_keeps_names_cost_share() -> None:
    proba, y_true = overconfident_reads(2000, seed=2)
    with pytest.raises(ValueError, match=r"cost_share \(--cost-share\).*cost_delta 0.05"):
        Policy(target_accuracy=0.95, cost_share=0.05).fit(proba, y_true)


def test_per_answer_bars_are_refused_with_a_cost_promise() -> None:
    proba, y_true = overconfident_reads(500, seed=3)
    with pytest.raises(ValueError, match="cost_share: .*per_answer_floor"):
        Policy(cost_share=0.5, per_answer_floor=0.8).fit(proba, y_true)


def test_a_block_without_a_share_names_the_field() -> None:
    proba, y_true = overconfident_reads(500, seed=3)
    with pytest.raises(ValueError, match="cost_block: belongs to a cost promise"):
        Policy(cost_block=500).fit(proba, y_true)


def _two_tiers(n: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    proba, y_true = overconfident_reads(n, seed=seed)
    noisy = np.clip(proba + np.random.default_rng(seed).normal(0, 0.1, proba.shape), 1e-3, None)
    return [noisy / noisy.sum(axis=1, keepdims=True), proba], y_true


def test_cascade_records_both_promises_in_its_file(tmp_path: Path) -> None:
    reads, y_true = _two_tiers(3000, seed=4)
    tiers = [TierCost("small", 1.0), TierCost("large", 4.0)]
    policy = Policy(target_accuracy=0.8, cost_share=0.5, cost_block=500).fit(
        reads, y_true, tiers=tiers, slow_cost=30.0)
    file = policy.to_file(name="c", data_hash="0" * 64, question=QUESTION)
    cost = file.cost_promise
    assert cost is not None and cost.block_bound <= cost.delta == 0.05
    assert cost.n_escalated == round(file.cascade.slow_coverage * cost.n)  # type: ignore[union-attr]
    assert binom.sf(250, 500, cost.live_cap) == pytest.approx(0.05, abs=1e-6)
    assert file.coverage == pytest.approx(1 - file.cascade.slow_coverage)  # type: ignore[union-attr]
    path = tmp_path / "c.json"
    file.write(path)
    again = load_policy(path)
    assert again.cost_promise == cost and again.integrity_problem() is None
    assert Policy.from_file(again).params_.cost_share == 0.5


def test_a_cascade_no_vector_of_which_keeps_both_names_cost_share() -> None:
    reads, y_true = _two_tiers(3000, seed=4)
    with pytest.raises(ValueError, match=r"cost_share \(--cost-share\): no threshold vector"):
        Policy(target_accuracy=0.9, cost_share=0.3).fit(
            reads, y_true, tiers=[TierCost("small", 1.0), TierCost("large", 4.0)],
            slow_cost=30.0)


def test_a_file_without_a_promise_keeps_its_digest_and_id(tmp_path: Path) -> None:
    proba, y_true = overconfident_reads(1000, seed=5)
    file = Policy(target_accuracy=0.8).fit(proba, y_true).to_file(
        name="p", data_hash="0" * 64, question=QUESTION).sealed()
    data = json.loads(file.model_dump_json())
    del data["cost_promise"], data["on_cost_alarm"]  # as a file written before they existed
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = load_policy(path)
    assert old.integrity_problem() is None and old.policy_id == file.policy_id


def test_a_record_past_its_delta_is_refused(tmp_path: Path) -> None:
    proba, y_true = overconfident_reads(2000, seed=6)
    file = Policy(target_accuracy=0.85, cost_share=0.6).fit(proba, y_true).to_file(
        name="p", data_hash="0" * 64, question=QUESTION)
    data = json.loads(file.model_dump_json())
    data["cost_promise"]["block_bound"] = 0.2
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="cost_promise.*block_bound"):
        load_policy(path)
