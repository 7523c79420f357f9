"""The versioned policy file that ``slotgate tune`` writes and the router loads: the calibrator,
the acceptance rule, and the evidence behind them (target, delta, bound, coverage, data hash,
backend fingerprint). Validated on load; errors name the file and the field."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from calibration.artifacts import atomic_path
from policies.rules import rule_from_dict
from policies.tuned import TunedPolicy
from policies.types import canonical_hash

POLICY_FORMAT = "slotgate/policy"
POLICY_VERSION = 1
OnAlarm = Literal["escalate_all", "alert_only"]
# How the policy is watched in production, not what it decides: left out of ``policy_id``, so
# changing them keeps a policy's identity (and its alarm) while re-tuning gives a new one.
MONITORING_FIELDS = frozenset({"audit_rate", "on_alarm", "alarm_alpha", "reference"})


class PolicyFileError(ValueError):
    """A policy file that cannot be used; the message names the file and the field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ReferenceSummary(BaseModel):
    """What drift monitoring keeps of the threshold rows (``calibration.monitoring``): their
    confidences on the ranking grid, sorted, and the share the policy accepted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(ge=1)
    accept_share: float = Field(ge=0, le=1)
    confidence: list[float]

    @field_validator("confidence")
    @classmethod
    def _confidences(cls, value: list[float]) -> list[float]:
        if not value:
            raise ValueError("no confidences: the drift test needs the tuning rows'")
        if any(not 0.0 <= v <= 1.0 for v in value):
            raise ValueError("confidences must be in [0, 1]")
        return value


class PolicyFile(BaseModel):
    """What a tuned policy is and why it can be trusted.

    ``threshold`` is the guaranteed one (None: no threshold passed, everything escalates);
    ``bound`` is the Clopper-Pearson lower bound on accepted accuracy reached at it (level
    1 - delta) and ``coverage`` the share accepted, both on the ``n_tune`` threshold rows.
    ``max_escalation`` and ``budget_threshold`` are set when tuning had an escalation budget;
    ``budget_exceeded`` says the guarantee needed more escalation than the budget allows.
    ``tuning`` says how the rows were spent: "split" (``n_calibration`` rows fit the calibrator,
    ``n_tune`` others chose the threshold) or "cross-fitted" (out-of-fold reads over ``n_folds``
    folds; every row did both, see docs/calibration.md for what that assumes). ``guarantee``
    says what "accurate" means: agreement with a human label ("accuracy") or with the slow
    model's answer ("agreement_with_slow", tuned on a shadow-mode log). ``shadow``: every
    decision is also answered by the slow model, whose answer is served; the fast read is logged
    (None: follow the server's ``policy.shadow``; left out of ``policy_id``: switching shadow
    off serves the same tuned policy).

    Monitoring (docs/monitoring.md): ``audit_rate`` is the seeded share of accepted decisions
    also sent to the slow model after the reply; ``on_alarm`` what an alarm does;
    ``alarm_alpha`` the false-alarm probability of the drift and accuracy alarms together;
    ``reference`` the tuning rows' summary (None in older files: no drift alarm).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["slotgate/policy"] = "slotgate/policy"
    version: int = POLICY_VERSION
    name: str = Field(min_length=1)
    signature: str | None = None
    backend_fingerprint: str = "unknown"
    calibrator: dict[str, Any]
    rule: dict[str, Any]
    threshold: float | None = Field(ge=0, le=1)
    target_accuracy: float = Field(gt=0, le=1)
    delta: float = Field(gt=0, lt=1)
    bound: float = Field(ge=0, le=1)
    coverage: float = Field(ge=0, le=1)
    n_tune: int = Field(ge=1)
    n_calibration: int = Field(ge=0)
    seed: int = 0
    max_escalation: float | None = Field(default=None, ge=0, le=1)
    budget_threshold: float | None = None
    budget_exceeded: bool = False
    data_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    tuning: Literal["split", "cross-fitted"] = "split"
    n_folds: int | None = Field(default=None, ge=2)
    guarantee: Literal["accuracy", "agreement_with_slow"] = "accuracy"
    shadow: bool | None = None
    audit_rate: float = Field(default=0.0, ge=0, le=1)
    on_alarm: OnAlarm = "escalate_all"
    alarm_alpha: float = Field(default=0.05, gt=0, lt=1)
    reference: ReferenceSummary | None = None
    # The option names tuned on, in order (None in files written before it was recorded):
    # `slotgate eval` refuses predictions over other options.
    options: list[str] | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != POLICY_VERSION:
            raise ValueError(f"unsupported policy file version {value}; this slotgate reads "
                             f"version {POLICY_VERSION} (re-run `slotgate tune`)")
        return value

    @field_validator("calibrator")
    @classmethod
    def _valid_calibrator(cls, value: dict[str, Any]) -> dict[str, Any]:
        from calibration.calibrators import calibrator_from_dict

        calibrator_from_dict(value)  # raises ValueError naming what is wrong
        return value

    @field_validator("rule")
    @classmethod
    def _valid_rule(cls, value: dict[str, Any]) -> dict[str, Any]:
        rule_from_dict(value)
        return value

    @property
    def policy_id(self) -> str:
        """The name plus a short hash of everything but the creation time."""
        # Unrecorded options are left out, so files written before the field keep their ids.
        exclude = {"created_at", "shadow", *MONITORING_FIELDS}
        if self.options is None:
            exclude.add("options")
        content = self.model_dump(mode="json", exclude=exclude)
        return f"{self.name}@{canonical_hash(content)[:12]}"

    def runtime(self) -> TunedPolicy:
        """A fresh runnable policy (a budget rule's window starts empty)."""
        from calibration.calibrators import calibrator_from_dict

        return TunedPolicy(calibrator_from_dict(self.calibrator), rule_from_dict(self.rule),
                           policy_id=self.policy_id)

    def write(self, path: Path) -> None:
        """Write atomically (temporary file, then rename), as indented JSON."""
        with atomic_path(path) as tmp:
            tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")


def load_policy(path: Path) -> PolicyFile:
    """Read and validate a policy file; every problem raises PolicyFileError naming the field."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PolicyFileError(f"{path}: policy file not found") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyFileError(f"{path}: not a readable JSON file: {exc}") from exc
    if not isinstance(data, dict):
        raise PolicyFileError(f"{path}: a policy file is a JSON object")
    if data.get("format") != POLICY_FORMAT:
        raise PolicyFileError(
            f"{path}: field 'format' is {data.get('format')!r}, expected {POLICY_FORMAT!r}",
            field="format")
    try:
        return PolicyFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        raise PolicyFileError(f"{path}: field {field!r}: {first['msg']}", field=field) from exc
