"""Acceptance rules: given calibrated probabilities and the answer (the raw argmax of the fast
read), accept the fast answer or escalate. Threshold (global or per option), margin, budget.

Every rule is a small, pure object with ``verdict(options, calibrated, index, *, escalations)
-> Verdict`` and ``to_dict()``; ``policies.specs.rule_from_dict`` reads them back (the policy
file's typed union). The one piece of state a rule reads, the budget's count of recent
escalations, is an ``EscalationWindow`` its caller owns and passes in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.types import Verdict


class Rule(Protocol):
    @property
    def kind(self) -> str: ...

    def verdict(self, options: Sequence[str], calibrated: Sequence[float], index: int, *,
                escalations: int = 0) -> Verdict:
        """Accept or escalate the answer ``options[index]`` whose calibrated proba is given;
        ``escalations``: how many of the caller's recent decisions escalated (only a budget
        rule reads it)."""
        ...

    def to_dict(self) -> dict[str, Any]: ...


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")


@dataclass(frozen=True)
class ThresholdRule:
    """Accept when the answer's calibrated probability >= its bar: ``per_option[answer]`` if set,
    else ``threshold``. A bar of None escalates every answer it applies to: no threshold passed
    the guarantee (globally, or for that answer under ``tune --per-answer-floor``)."""

    threshold: float | None
    per_option: Mapping[str, float | None] = field(default_factory=dict)
    kind: str = field(default="threshold", init=False)

    def __post_init__(self) -> None:
        if self.threshold is not None:
            _check_unit("threshold", self.threshold)
        for name, bar in self.per_option.items():
            if bar is not None:
                _check_unit(f"per_option[{name!r}]", bar)

    def bar(self, option: str) -> float | None:
        return self.per_option.get(option, self.threshold)  # a stored None is kept: escalate

    def verdict(self, options: Sequence[str], calibrated: Sequence[float], index: int, *,
                escalations: int = 0) -> Verdict:
        p, bar = float(calibrated[index]), self.bar(options[index])
        if bar is None:
            what = "everything" if options[index] not in self.per_option else "this answer"
            return Verdict(False, index, p, None, f"no guaranteed threshold: escalate {what}")
        if p >= bar:
            return Verdict(True, index, p, bar, f"p {p:.3f} >= threshold {bar:.3f}")
        return Verdict(False, index, p, bar, f"p {p:.3f} < threshold {bar:.3f}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "threshold": self.threshold, "per_option": dict(self.per_option)}


@dataclass(frozen=True)
class MarginRule:
    """Accept when the answer's calibrated probability beats every other option's by at least
    ``min_margin`` (top-1 minus top-2 when the calibrator kept the argmax; negative otherwise)."""

    min_margin: float
    kind: str = field(default="margin", init=False)

    def __post_init__(self) -> None:
        _check_unit("min_margin", self.min_margin)

    def verdict(self, options: Sequence[str], calibrated: Sequence[float], index: int, *,
                escalations: int = 0) -> Verdict:
        p = float(calibrated[index])
        runner_up = max((float(q) for j, q in enumerate(calibrated) if j != index), default=0.0)
        margin = p - runner_up
        ok = margin >= self.min_margin
        sign = ">=" if ok else "<"
        return Verdict(ok, index, p, None, f"margin {margin:.3f} {sign} {self.min_margin:.3f}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "min_margin": self.min_margin}


class BudgetRule:
    """A base rule plus a cap on the escalation rate over the last ``window`` decisions.

    While fewer than ``max_escalation * window`` of the last ``window`` decisions escalated
    (``escalations``, counted by the caller's ``EscalationWindow``), the base rule decides alone.
    Once the budget is used up, an answer the base rule would escalate is ACCEPTED instead, and
    its Verdict says so: ``reason`` starts with "budget exhausted" and ``threshold`` stays the
    base rule's bar, so probability < threshold is visible. Such answers are outside the tuned
    guarantee. A fresh window is empty, so the first ``max_escalation * window`` escalations are
    always allowed.
    """

    kind = "budget"

    def __init__(self, base: Rule, *, max_escalation: float, window: int = 1000) -> None:
        _check_unit("max_escalation", max_escalation)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.base = base
        self.max_escalation = max_escalation
        self.window = window

    def verdict(self, options: Sequence[str], calibrated: Sequence[float], index: int, *,
                escalations: int = 0) -> Verdict:
        base = self.base.verdict(options, calibrated, index)
        # Would this escalation push the window past its budget?
        if base.accept or escalations + 1 <= self.max_escalation * self.window:
            return base
        reason = (
            f"budget exhausted (max escalation {self.max_escalation:.2f} of the last "
            f"{self.window}): accepted below the rule, outside the guarantee; {base.reason}"
        )
        return Verdict(True, base.index, base.probability, base.threshold, reason)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "base": self.base.to_dict(),
                "max_escalation": self.max_escalation, "window": self.window}


class EscalationWindow:
    """Whether each of the last ``size`` decisions of one policy escalated: the state a budget
    rule reads, owned by whoever runs the policy (the routing service: one per loaded budgeted
    policy, per process; not thread-safe, one event loop)."""

    def __init__(self, size: int) -> None:
        self._recent: deque[bool] = deque(maxlen=size)  # True = escalated
        self._size = size
        self.escalations = 0  # True entries of ``_recent``, kept as they come and go


    @property
    def escalation_rate(self) -> float:
        """Escalations over the last ``size`` decisions (counting an unfilled window as accepts)."""
        return self.escalations / self._size

    def record(self, verdict: Verdict) -> None:
        if len(self._recent) == self._size:
            self.escalations -= self._recent[0]
        self._recent.append(not verdict.accept)
        self.escalations += not verdict.accept
