"""The parameters a policy is tuned with, validated once at ``Policy.fit`` (pydantic: a bad
value names its field, and the CLI turns the field into its flag). One model for one to n
tiers; the fields only one shape uses are refused for the other, naming the field."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from calibration.calibrators import calibrator_kinds
from policies.specs import OpenUnit, TargetAccuracy, Unit

__all__ = ["PolicyOptions", "TierCost"]


@dataclass(frozen=True, slots=True)
class TierCost:
    """A fast tier as tuning sees it: its name (as the settings name the tier) and what one
    read of it costs (any unit, the slow model's cost in the same)."""

    name: str
    cost: float


class PolicyOptions(BaseModel):
    """``calibrator``, ``target_accuracy``, ``delta``, ``calibration_fraction`` and ``seed``
    apply to every policy. One tier only: ``max_escalation`` and ``budget_window`` (an
    escalation budget, ``policies.rules.BudgetRule``) and ``per_answer_floor`` (a bar per
    answer, ``policies.answer_floor``). Several tiers only: ``max_slow_share`` (a cap on the
    share of decisions that reach the slow model, held at 1 - delta / 2). Any shape: the cost
    promise ``cost_share`` (None: none), ``cost_block``, ``cost_delta``: the slow model answers
    more than ``cost_share`` of a block of ``cost_block`` consecutive decisions with probability
    at most ``cost_delta`` (``calibration.block_cost``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    calibrator: str = "temperature"
    target_accuracy: TargetAccuracy = 0.95
    delta: OpenUnit = 0.05
    calibration_fraction: OpenUnit = 0.5
    seed: int = 0
    max_escalation: Unit | None = None
    budget_window: int = Field(default=1000, ge=1)
    per_answer_floor: TargetAccuracy | None = None
    max_slow_share: Unit | None = None
    cost_share: Unit | None = None
    cost_block: int = Field(default=1000, ge=1)
    cost_delta: OpenUnit = 0.05

    @field_validator("calibrator")
    @classmethod
    def _known_calibrator(cls, value: str) -> str:
        kinds = calibrator_kinds()
        if value not in kinds:
            raise ValueError(f"must be one of {', '.join(sorted(kinds))}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _cost_fields_go_together(self) -> PolicyOptions:
        if self.cost_share is None:
            for name in ("cost_block", "cost_delta"):
                if name in self.model_fields_set:
                    raise ValueError(f"{name}: belongs to a cost promise; set cost_share too")
        return self

    def check_shape(self, n_tiers: int) -> None:
        """Refuse the fields the policy's shape does not use (ValueError naming the field)."""
        if n_tiers == 1 and self.max_slow_share is not None:
            raise ValueError("max_slow_share: caps the slow share of a cascade; a one-tier "
                             "policy caps its escalations with max_escalation")
        if self.cost_share is not None and self.per_answer_floor is not None:
            raise ValueError("cost_share: the cost promise bounds the escalations of one "
                             "threshold; per_answer_floor adds a bar per answer, which it does "
                             "not cover")
        if n_tiers > 1:
            for name in ("max_escalation", "per_answer_floor"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: a one-tier policy's option; a cascade of "
                                     f"{n_tiers} tiers does not take it")
