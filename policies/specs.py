"""The typed parts of a policy file: the fitted calibrator and the acceptance rule, each a pydantic
union on ``kind``, and the value ranges the file and ``slotgate tune`` share. A spec validates its
own JSON without building anything; ``build()`` makes the runnable object once, at load."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from policies.rules import BudgetRule, MarginRule, Rule, ThresholdRule

if TYPE_CHECKING:
    from calibration.base import Calibrator

# The ranges, named once: PolicyFile's fields and the tuning options both use them, so a bad
# value is refused with the field's name wherever it comes from (file, CLI flag, Python).
Unit = Annotated[float, Field(ge=0, le=1)]
TargetAccuracy = Annotated[float, Field(gt=0, le=1)]
OpenUnit = Annotated[float, Field(gt=0, lt=1)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _SameLength(_Spec):
    """Two arrays of a piecewise map that must pair up (checked here, not by building it)."""

    def _check_pairs(self, first: list[float], second: list[float], names: str) -> None:
        if len(first) != len(second) or not first:
            raise ValueError(f"{names} must be non-empty and of equal length "
                             f"(got {len(first)} and {len(second)})")


class TemperatureOptions(_Spec):
    min_temperature: float = Field(default=0.01, gt=0)
    max_temperature: float = Field(default=100.0, gt=0)


class TemperatureState(_Spec):
    temperature_: float = Field(gt=0)


class IsotonicState(_SameLength):
    x_thresholds_: list[float]
    y_thresholds_: list[Unit]

    @model_validator(mode="after")
    def _paired(self) -> Self:
        self._check_pairs(self.x_thresholds_, self.y_thresholds_, "x_thresholds_ and y_thresholds_")
        return self


class HistogramOptions(_Spec):
    n_bins: int = Field(default=15, ge=1)
    strategy: Literal["quantile", "uniform"] = "quantile"


class HistogramState(_Spec):
    bin_edges_: list[float]
    bin_values_: list[Unit]

    @model_validator(mode="after")
    def _edges(self) -> Self:
        if len(self.bin_edges_) != len(self.bin_values_) + 1 or not self.bin_values_:
            raise ValueError(f"bin_edges_ must have one more entry than bin_values_ (got "
                             f"{len(self.bin_edges_)} and {len(self.bin_values_)})")
        return self


class _Empty(_Spec):
    pass


class _CalibratorSpec(_Spec):
    def build(self) -> Calibrator:
        """The fitted calibrator; its ``transform`` is the one that was tuned."""
        from calibration.calibrators import calibrator_from_dict

        return calibrator_from_dict(self.model_dump(mode="json"))


class TemperatureSpec(_CalibratorSpec):
    kind: Literal["temperature"]
    options: TemperatureOptions = TemperatureOptions()
    state: TemperatureState


class IsotonicSpec(_CalibratorSpec):
    kind: Literal["isotonic"]
    options: _Empty = _Empty()
    state: IsotonicState


class HistogramSpec(_CalibratorSpec):
    kind: Literal["histogram"]
    options: HistogramOptions = HistogramOptions()
    state: HistogramState


class IdentitySpec(_CalibratorSpec):
    kind: Literal["none"]
    options: _Empty = _Empty()
    state: _Empty = _Empty()


CalibratorSpec = Annotated[TemperatureSpec | IsotonicSpec | HistogramSpec | IdentitySpec,
                           Field(discriminator="kind")]


class ThresholdRuleSpec(_Spec):
    """``per_option`` bars override ``threshold`` for their answer; a bar of None escalates every
    answer of that option (no bar passed its test)."""

    kind: Literal["threshold"]
    threshold: Unit | None
    per_option: dict[str, Unit | None] = {}

    def build(self) -> Rule:
        return ThresholdRule(self.threshold, dict(self.per_option))


class MarginRuleSpec(_Spec):
    kind: Literal["margin"]
    min_margin: Unit

    def build(self) -> Rule:
        return MarginRule(self.min_margin)


class BudgetRuleSpec(_Spec):
    kind: Literal["budget"]
    base: RuleSpec
    max_escalation: Unit
    window: int = Field(default=1000, ge=1)

    def build(self) -> Rule:
        return BudgetRule(self.base.build(), max_escalation=self.max_escalation,
                          window=self.window)


RuleSpec = Annotated[ThresholdRuleSpec | MarginRuleSpec | BudgetRuleSpec,
                     Field(discriminator="kind")]
BudgetRuleSpec.model_rebuild()


def guaranteed_threshold_of(rule: RuleSpec) -> float | None:
    """The global bar a rule applies (a budget rule's is its base's; a margin rule has none)."""
    if isinstance(rule, BudgetRuleSpec):
        return guaranteed_threshold_of(rule.base)
    return rule.threshold if isinstance(rule, ThresholdRuleSpec) else None


def rule_from_dict(data: Mapping[str, Any]) -> Rule:
    """Rebuild a rule from ``to_dict()`` through the policy file's typed rule union
    (``RuleSpec``), the one reader of rule JSON; a bad dict raises ValueError
    naming the kind and field."""
    try:
        return TypeAdapter(RuleSpec).validate_python(data).build()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"rule {where or 'kind'}: {first['msg']}") from exc
