"""Routing policies and the value types shared upward (pure logic: numpy only, no I/O beyond policy files)."""

from policies.types import Decision, DecisionRequest, Option, OptionScores, Verdict

__all__ = ["Decision", "DecisionRequest", "Option", "OptionScores", "Verdict"]
