"""A small tuned policy over three options whose tuning rows were confident (drift reference)."""

from __future__ import annotations

from typing import Any

import numpy as np

from policies.file import PolicyFile
from policies.scope import Question, scope_signature
from tests.policies.test_file import make_policy

OPTIONS = ("a", "b", "c")
# A raw top probability the policy accepts (calibrated about 0.81, over its 0.8 bar) with less
# confidence than any of its tuning rows had (0.85 to 1.0): what drift looks like to the watch.
DOUBTFUL = 0.86


def spelled(i: int | str) -> str:
    """``i`` with its digits spelled as letters: distinct inputs to the watch, whose fingerprint
    folds numbers (templated ids) to one placeholder."""
    return str(i).translate(str.maketrans("0123456789", "abcdefghij"))


# The question the policy was tuned for: a json_schema named "pick" with no description.
PICK = Question.asked("pick")


def watched_policy(*, question: Question = PICK, **overrides: Any) -> PolicyFile:
    reference = np.random.default_rng(0).uniform(0.85, 1.0, size=400)
    fields: dict[str, Any] = {
        "question": question.as_dict(), "signature": scope_signature(OPTIONS, question),
        "audit_rate": 0.0, "on_alarm": "escalate_all", "alarm_alpha": 0.05, "options": list(OPTIONS),
        "reference": {"n": 400, "accept_share": float(np.mean(reference >= 0.8)),
                      "confidence": sorted(round(float(v), 4) for v in reference)}}
    fields.update(overrides)
    return make_policy(**fields)


def confident(p: float) -> tuple[float, float, float]:
    """A read whose top option gets raw probability ``p`` (the rest split evenly)."""
    rest = (1.0 - p) / 2
    return (p, rest, rest)
