"""Acceptance rules: thresholds (global, per option, none), margin, budget, and their dict form."""

from __future__ import annotations

import pytest

from policies.rules import BudgetRule, EscalationWindow, MarginRule, ThresholdRule
from policies.specs import rule_from_dict
from policies.types import Verdict

OPTIONS = ("a", "b", "c")


def test_threshold_accepts_at_or_above_the_bar() -> None:
    rule = ThresholdRule(0.6)
    assert rule.verdict(OPTIONS, [0.6, 0.3, 0.1], 0).accept
    below = rule.verdict(OPTIONS, [0.59, 0.31, 0.1], 0)
    assert not below.accept
    assert below.threshold == 0.6 and below.probability == pytest.approx(0.59)


def test_per_option_bar_overrides_the_global_one() -> None:
    rule = ThresholdRule(0.9, {"b": 0.5})
    assert rule.verdict(OPTIONS, [0.2, 0.55, 0.25], 1).accept
    assert not rule.verdict(OPTIONS, [0.55, 0.2, 0.25], 0).accept


def test_no_threshold_escalates_everything() -> None:
    verdict = ThresholdRule(None).verdict(OPTIONS, [1.0, 0.0, 0.0], 0)
    assert not verdict.accept
    assert verdict.threshold is None and "escalate everything" in verdict.reason


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_threshold_outside_unit_interval_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        ThresholdRule(bad)


def test_margin_is_answer_minus_best_other() -> None:
    rule = MarginRule(0.2)
    assert rule.verdict(OPTIONS, [0.5, 0.3, 0.2], 0).accept  # margin 0.2
    assert not rule.verdict(OPTIONS, [0.45, 0.35, 0.2], 0).accept  # margin 0.1
    # The answer is the raw argmax: if calibration moved another option above it, margin < 0.
    verdict = rule.verdict(OPTIONS, [0.3, 0.6, 0.1], 0)
    assert not verdict.accept and "margin -0.300" in verdict.reason


def test_budget_caps_escalations_in_its_window_and_says_so() -> None:
    rule = BudgetRule(ThresholdRule(0.9), max_escalation=0.2, window=10)
    window = EscalationWindow(10)
    low = [0.5, 0.3, 0.2]

    def judge(calibrated: list[float]) -> Verdict:
        verdict = rule.verdict(OPTIONS, calibrated, 0, escalations=window.escalations)
        window.record(verdict)
        return verdict

    verdicts = [judge(low) for _ in range(10)]
    # 2 escalations fit the budget (0.2 * 10); the rest are accepted below the bar, marked.
    assert [v.accept for v in verdicts] == [False, False] + [True] * 8
    for v in verdicts[2:]:
        assert v.reason.startswith("budget exhausted")
        assert v.threshold == 0.9 and v.probability < v.threshold
    assert window.escalation_rate == pytest.approx(0.2)
    # Once the two escalations slide out of the window, escalation is allowed again.
    for _ in range(10):
        judge([0.95, 0.03, 0.02])
    assert window.escalations == 0 and not judge(low).accept


def test_the_budget_rule_is_pure_its_window_belongs_to_the_caller() -> None:
    rule = BudgetRule(ThresholdRule(0.9), max_escalation=0.2, window=10)
    low = [0.5, 0.3, 0.2]
    # The same question gets the same verdict however often it is asked: no hidden state.
    assert {rule.verdict(OPTIONS, low, 0, escalations=1).accept for _ in range(5)} == {False}
    assert rule.verdict(OPTIONS, low, 0, escalations=2).accept


def test_budget_never_changes_accepts_of_the_base_rule() -> None:
    rule = BudgetRule(ThresholdRule(0.5), max_escalation=0.0, window=5)
    verdict = rule.verdict(OPTIONS, [0.7, 0.2, 0.1], 0)
    assert verdict.accept and not verdict.reason.startswith("budget")


@pytest.mark.parametrize("rule", [
    ThresholdRule(0.7, {"a": 0.8}),
    ThresholdRule(None),
    MarginRule(0.1),
    BudgetRule(ThresholdRule(0.7), max_escalation=0.3, window=50),
])
def test_rules_survive_their_dict_form(rule: object) -> None:
    data = rule.to_dict()  # type: ignore[attr-defined]
    assert rule_from_dict(data).to_dict() == data


@pytest.mark.parametrize(("data", "message"), [
    ({"kind": "magic"}, "tag 'magic'.*'threshold', 'margin', 'budget'"),
    ({"kind": "margin"}, "rule margin.min_margin: Field required"),
    ({"kind": "budget", "base": {"kind": "threshold", "threshold": 0.5}},
     "rule budget.max_escalation: Field required"),
    ({"kind": "threshold", "threshold": 2.0}, "rule threshold.threshold: .*less than or equal"),
    ({"kind": "budget", "base": {"kind": "margin"}, "max_escalation": 0.1},
     "rule budget.base.margin.min_margin"),
])
def test_bad_rule_dicts_name_the_problem(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rule_from_dict(data)
