"""Routing policies and the value types shared upward (pure logic: numpy only, no I/O beyond policy files)."""

from policies.file import PolicyFile, PolicyFileError, load_policy
from policies.options import PolicyOptions
from policies.policy import Policy
from policies.rules import BudgetRule, MarginRule, Rule, ThresholdRule
from policies.specs import rule_from_dict
from policies.types import Decision, DecisionRequest, Option, OptionScores, Verdict

__all__ = [
    "BudgetRule",
    "Decision",
    "DecisionRequest",
    "MarginRule",
    "Option",
    "OptionScores",
    "Policy",
    "PolicyFile",
    "PolicyFileError",
    "PolicyOptions",
    "Rule",
    "ThresholdRule",
    "Verdict",
    "load_policy",
    "rule_from_dict",
]
