"""The one policy object for one to n tiers: ``step`` (one tier's read -> accept, climb or
escalate) and ``judge`` (the same over labelled rows at once) agree row by row, a cascade and a
one-tier policy are the same class in the same file format, and the deprecated names still
import, warning."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from numpy.typing import NDArray

from policies.evaluation import evaluate
from policies.policy import Policy, TierCost
from policies.types import OptionScores

OPTIONS = ("a", "b", "c", "d", "e")


def reads(n: int, seed: int, *, sharpness: float) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(OPTIONS), size=n)
    logits = rng.normal(0, 1, size=(n, len(OPTIONS)))
    logits[np.arange(n), labels] += sharpness
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return proba, labels


def two_tiers(n: int = 3000) -> tuple[list[NDArray[np.float64]], NDArray[np.int64]]:
    cheap, labels = reads(n, 1, sharpness=2.5)
    # The richer tier reads the same rows: same labels, its own noise.
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1, size=(n, len(OPTIONS)))
    logits[np.arange(n), labels] += 4.0
    rich = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return [cheap, rich], labels


def stepped(policy: Policy, probas: list[NDArray[np.float64]]) -> list[int]:
    """Each row's answering tier by ``step``, one read at a time (len(tiers): slow)."""
    answered = []
    window = policy.escalation_window()
    for i in range(len(probas[0])):
        k = policy.next_tier(-1)
        tier = len(policy.tiers_)
        while k is not None:
            step = policy.step(k, OptionScores(OPTIONS, tuple(probas[k][i])),
                               escalations=0 if window is None or k else window.escalations)
            if window is not None and k == 0:
                window.record(step.verdict)
            if step.verdict.accept:
                tier = k
                break
            k = step.climb
        answered.append(tier)
    return answered


def test_a_cascade_steps_and_judges_alike_and_holds_its_target_on_fresh_rows() -> None:
    probas, labels = two_tiers()
    policy = Policy(target_accuracy=0.9, delta=0.1).fit(
        probas, labels, tiers=[TierCost("cheap", 1.0), TierCost("rich", 10.0)], slow_cost=100,
        options=OPTIONS)
    assert [t.name for t in policy.tiers_] == ["cheap", "rich"]
    fresh, fresh_labels = two_tiers(2000)
    judged = policy.judge(fresh)
    assert judged.answered.tolist() == stepped(policy, fresh)
    metrics = evaluate(policy, OPTIONS, fresh, fresh_labels)
    assert metrics["accepted_accuracy"] >= 0.88 and 0 < metrics["coverage"] < 1
    assert metrics["tiers"][0]["n_read"] == len(fresh_labels)
    # Every row either reached the rich tier or was answered by the cheap one.
    assert metrics["tiers"][1]["n_read"] == int((judged.answered != 0).sum())


def test_a_one_tier_policy_with_a_budget_judges_as_a_stream() -> None:
    proba, labels = reads(3000, 4, sharpness=2.0)
    policy = Policy(target_accuracy=0.9, max_escalation=0.1, budget_window=50).fit(
        proba, labels, options=OPTIONS)
    fresh, _ = reads(1000, 5, sharpness=2.0)
    judged = policy.judge([fresh])
    assert judged.answered.tolist() == stepped(policy, [fresh])
    # The budget binds: more accepted than the bare threshold would.
    bare = policy.tiers_[0].rule.base  # type: ignore[attr-defined]
    confidence = judged.confidence[:, 0]
    assert (~judged.escalated).sum() > (confidence >= bare.threshold).sum()


def test_one_file_format_for_one_and_several_tiers(tmp_path: object) -> None:
    from policies.scope import Question

    question = Question("intent")
    probas, labels = two_tiers(1500)
    cascade = Policy().fit(probas, labels, tiers=[TierCost("cheap", 1), TierCost("rich", 5)],
                           slow_cost=50, options=OPTIONS, fingerprints=["fp1", "fp2"])
    one = Policy().fit(probas[0], labels, options=OPTIONS)
    for fitted, n_tiers in ((cascade, 2), (one, 1)):
        file = fitted.to_file(name="p", data_hash="0" * 64, question=question,
                              backend_fingerprint="fp1")
        again = Policy.from_file(file)
        assert type(again) is Policy and len(again.tiers_) == n_tiers
        assert [t.threshold for t in again.tiers_] == [t.threshold for t in fitted.tiers_]
        assert (again.judge(probas[:n_tiers]).answered
                == fitted.judge(probas[:n_tiers]).answered).all()
    assert (cascade.to_file(name="p", data_hash="0" * 64, question=question).cascade
            is not None)


def test_options_of_the_other_shape_are_refused_naming_the_field() -> None:
    probas, labels = two_tiers(600)
    with pytest.raises(ValueError, match="max_escalation"):
        Policy(max_escalation=0.2).fit(probas, labels, tiers=[TierCost("a", 1),
                                                              TierCost("b", 2)], slow_cost=9)
    with pytest.raises(ValueError, match="max_slow_share"):
        Policy(max_slow_share=0.3).fit(probas[0], labels)
    with pytest.raises(ValueError, match="slow_cost"):
        Policy().fit(probas, labels, tiers=[TierCost("a", 1), TierCost("b", 2)])


@pytest.mark.parametrize(("module", "name"), [("policies.guaranteed", "GuaranteedPolicy"),
                                              ("policies.cascade", "CascadePolicy")])
def test_the_old_names_import_as_deprecated_aliases(module: str, name: str) -> None:
    with pytest.warns(DeprecationWarning, match="policies.policy.Policy"):
        alias = getattr(importlib.import_module(module), name)
    assert alias is Policy
