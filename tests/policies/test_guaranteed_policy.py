"""The fitted policy object: fit returns self with its evidence as ``_`` attributes, the policy
file comes from it in one call, bad parameters name their field, and ``per_answer_floor`` gives
each answer a bar under which that answer's accepted accuracy stays at the floor on fresh data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray
from pydantic import ValidationError

from policies.evaluation import evaluate
from policies.file import load_policy
from policies.policy import Policy
from policies.rules import ThresholdRule
from policies.scope import Question, scope_signature
from policies.types import OptionScores

OPTIONS = ("a", "b", "c", "d", "e")


def reads(n: int, seed: int, *, weak: int | None = None
          ) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Overconfident reads; answers of option ``weak`` are right only 70% of the time whatever
    their confidence (an answer the global threshold lets through too often)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 4, size=(n, len(OPTIONS)))
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    soft = np.exp(logits / 1.5) / np.exp(logits / 1.5).sum(axis=1, keepdims=True)
    y_true = np.array([rng.choice(len(OPTIONS), p=p) for p in soft])
    if weak is not None:
        answered = proba.argmax(axis=1) == weak
        wrong = answered & (rng.random(n) < 0.3)
        y_true[answered] = weak
        y_true[wrong] = (weak + 1) % len(OPTIONS)
    return proba, y_true


def test_fit_returns_self_with_fitted_attributes_and_one_call_to_the_file(tmp_path: Path) -> None:
    proba, y_true = reads(4000, seed=0)
    policy = Policy(target_accuracy=0.9, delta=0.05)
    assert policy.fit(proba, y_true, options=OPTIONS) is policy
    assert policy.risk_.threshold is not None and policy.risk_.bound >= 0.9
    assert policy.n_calibration_ + policy.risk_.n == 4000 and policy.n_folds_ is None
    assert isinstance(policy.rule_, ThresholdRule)
    assert policy.coverage_ == pytest.approx(policy.risk_.coverage)
    question = Question.asked("intent")
    file = policy.to_file(name="intents", data_hash="0" * 64, question=question, audit_rate=0.1)
    file.write(tmp_path / "p.json")
    loaded = load_policy(tmp_path / "p.json")
    assert loaded.threshold == policy.risk_.threshold and loaded.options == list(OPTIONS)
    assert loaded.question is not None and loaded.question.question() == question
    assert loaded.signature == scope_signature(OPTIONS, question)
    assert loaded.reference is not None and loaded.reference.accept_share == policy.coverage_
    scores = OptionScores(OPTIONS, tuple(float(p) for p in proba[0]))
    assert Policy.from_file(loaded).decide(scores) == policy.decide(scores)
    assert Policy.from_file(tmp_path / "p.json").policy_id == loaded.policy_id


def test_folds_cross_fit_on_every_row() -> None:
    proba, y_true = reads(3000, seed=1)
    folds = np.arange(3000) % 5
    policy = Policy(target_accuracy=0.9).fit(proba, y_true, folds=folds)
    assert policy.n_folds_ == 5 and policy.risk_.n == 3000 and policy.n_calibration_ == 3000
    assert policy.to_file(name="cf", data_hash="0" * 64,
                          question=Question.asked("intent")).tuning == "cross-fitted"


def test_a_policy_file_is_scoped_to_exactly_one_question() -> None:
    policy = Policy().fit(*reads(1000, seed=2), options=OPTIONS)
    for scope in ({}, {"question": Question.asked("intent"), "logged_signature": "f" * 64}):
        with pytest.raises(ValueError, match="exactly one"):
            policy.to_file(name="x", data_hash="0" * 64, **scope)  # type: ignore[arg-type]
    logged = policy.to_file(name="x", data_hash="0" * 64, logged_signature="f" * 64)
    assert logged.signature == "f" * 64 and logged.question is None
    assert not logged.question_unrecorded  # one logged request's signature: an exact question


@pytest.mark.parametrize(("params", "field"), [
    ({"target_accuracy": 1.5}, "target_accuracy"), ({"delta": 0.0}, "delta"),
    ({"calibrator": "magic"}, "calibrator"), ({"max_escalation": 2.0}, "max_escalation"),
    ({"per_answer_floor": 0.0}, "per_answer_floor"), ({"budget_window": 0}, "budget_window"),
])
def test_bad_parameters_name_their_field(params: dict[str, float], field: str) -> None:
    proba, y_true = reads(400, seed=2)
    with pytest.raises(ValidationError) as info:
        Policy(**params).fit(proba, y_true)
    assert info.value.errors()[0]["loc"] == (field,)


def test_per_answer_floor_holds_each_answer_on_fresh_data() -> None:
    weak = 2
    proba, y_true = reads(8000, seed=3, weak=weak)
    plain = Policy(target_accuracy=0.75).fit(proba, y_true, options=OPTIONS)
    floored = Policy(target_accuracy=0.75, per_answer_floor=0.8).fit(
        proba, y_true, options=OPTIONS)
    assert floored.risk_.threshold == plain.risk_.threshold  # the global promise is unchanged
    assert floored.answer_bars_ is not None
    rule = floored.rule_
    assert isinstance(rule, ThresholdRule)
    assert rule.bar(OPTIONS[weak]) is None  # 70% right at any confidence: no bar reaches 0.8
    assert floored.coverage_ < plain.coverage_
    fresh, fresh_y = reads(8000, seed=4, weak=weak)
    before = evaluate(plain, OPTIONS, fresh, fresh_y, n_resamples=20)
    after = evaluate(floored, OPTIONS, fresh, fresh_y, n_resamples=20)
    worst_before = before["per_answer"][0]
    assert worst_before["answer"] == OPTIONS[weak] and worst_before["accuracy"] < 0.8
    assert all(row["accuracy"] >= 0.8 for row in after["per_answer"])
    assert OPTIONS[weak] not in {row["answer"] for row in after["per_answer"]}


def test_per_answer_table_is_worst_first_with_intervals() -> None:
    proba, y_true = reads(3000, seed=5, weak=1)
    policy = Policy(target_accuracy=0.85).fit(proba, y_true, options=OPTIONS)
    table = evaluate(policy, OPTIONS, proba, y_true, n_resamples=20)["per_answer"]
    values = [row["accuracy"] for row in table]
    assert values == sorted(values) and len(values) == len(OPTIONS)
    for row in table:
        assert row["lower"] <= row["accuracy"] <= row["upper"]
        assert row["n"] <= row["n_answered"]
