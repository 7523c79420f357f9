"""A policy ready to run: a fitted calibrator and an acceptance rule. The answer is always the raw
argmax of the fast read; its confidence is the calibrated probability of that option."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from policies.rules import BudgetRule, EscalationWindow, Rule
from policies.types import OptionScores, Verdict

if TYPE_CHECKING:
    from calibration.base import Calibrator


class TunedPolicy:
    """``decide(scores)`` calibrates one read and asks the rule; ``policy_id`` names the tuned
    file it came from (name and a hash of its contents) for decision logs."""

    def __init__(self, calibrator: Calibrator, rule: Rule, *, policy_id: str) -> None:
        self.calibrator = calibrator
        self.rule = rule
        self.policy_id = policy_id

    def calibrate(self, scores: OptionScores) -> list[float]:
        calibrated = self.calibrator.transform(np.asarray([scores.proba], dtype=np.float64))
        return [float(p) for p in calibrated[0]]

    def decide(self, scores: OptionScores, *, escalations: int = 0
               ) -> tuple[Verdict, list[float]]:
        """The verdict on the raw argmax, and the calibrated probabilities of every option.
        Pure: ``escalations`` is the caller's ``EscalationWindow`` count (a budget rule reads it;
        the caller records the verdict in its window)."""
        calibrated = self.calibrate(scores)
        verdict = self.rule.verdict(scores.options, calibrated, scores.top_index,
                                    escalations=escalations)
        return verdict, calibrated

    def escalation_window(self) -> EscalationWindow | None:
        """A fresh window for a caller that runs this policy on a stream of decisions (None: its
        rule has no budget, nothing to count)."""
        rule = self.rule
        return EscalationWindow(rule.window) if isinstance(rule, BudgetRule) else None

    def __repr__(self) -> str:
        return f"TunedPolicy({self.policy_id!r}, rule={self.rule.to_dict()!r})"
