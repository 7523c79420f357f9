"""One tuned policy watched in production: its drift martingale (label-free), its accuracy
sequence (audit and feedback labels), the live accept share, and the alarm they raise. No I/O:
the Monitor feeds it and decides what to log and export."""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from calibration.monitoring import AccuracySequence, ConformalDriftTest

AlarmKind = Literal["drift", "accuracy"]
ACCEPT_WINDOW = 1000  # decisions behind the live accept share


@dataclass(frozen=True, slots=True)
class Alarm:
    """Why and when a policy stopped being trusted (latched until a re-tuned policy loads)."""

    policy_id: str
    kind: AlarmKind
    decision: int  # the policy's decision count when it was raised
    time: float
    detail: str


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """What a policy file says about watching it (``policies.file.PolicyFile``)."""

    policy_id: str
    target_accuracy: float
    audit_rate: float = 0.0
    on_alarm: Literal["escalate_all", "alert_only"] = "escalate_all"
    alarm_alpha: float = 0.05
    reference: tuple[float, ...] | None = None  # tuning rows' confidences; None: no drift test
    reference_accept_share: float | None = None
    seed: int = 0

    @classmethod
    def of(cls, policy_file: Any) -> WatchSettings:
        reference = policy_file.reference
        return cls(policy_id=policy_file.policy_id, target_accuracy=policy_file.target_accuracy,
                   audit_rate=policy_file.audit_rate, on_alarm=policy_file.on_alarm,
                   alarm_alpha=policy_file.alarm_alpha,
                   reference=None if reference is None else tuple(reference.confidence),
                   reference_accept_share=None if reference is None else reference.accept_share,
                   seed=policy_file.seed)


class PolicyWatch:
    """The drift and accuracy alarms share ``alarm_alpha`` equally, so together they raise a
    false alarm with probability at most ``alarm_alpha`` while traffic looks like the tuning
    rows and the policy keeps its promise."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        half = settings.alarm_alpha / 2.0
        self.drift = (None if settings.reference is None else
                      ConformalDriftTest(settings.reference, alpha=half, seed=settings.seed))
        self.accuracy = AccuracySequence(alpha=half)
        self.alarm: Alarm | None = None
        self.n_decisions = 0
        self.n_accepted = 0
        self._recent: deque[bool] = deque(maxlen=ACCEPT_WINDOW)
        # Seeded, one stream per policy: which accepted decisions get audited is reproducible.
        self._audit_rng = random.Random(f"{settings.seed}:{settings.policy_id}")

    @property
    def policy_id(self) -> str:
        return self.settings.policy_id

    @property
    def escalate_all(self) -> bool:
        return self.alarm is not None and self.settings.on_alarm == "escalate_all"

    @property
    def accept_share(self) -> float | None:
        """Accepted share of the last ``ACCEPT_WINDOW`` decisions (None before the first)."""
        return sum(self._recent) / len(self._recent) if self._recent else None

    def observe(self, confidence: float, *, accepted: bool) -> Alarm | None:
        """One decision with a fast read: its confidence (calibrated probability of the fast
        answer) and whether the policy accepted it. Returns an alarm raised by this decision."""
        self.n_decisions += 1
        self.n_accepted += int(accepted)
        self._recent.append(accepted)
        if self.drift is None:
            return None
        # Kept up to date after an alarm too, so the gauge and plots still show the evidence.
        if self.drift.update(min(1.0, max(0.0, confidence))) and self.alarm is None:
            return self._raise("drift", f"the confidence martingale reached "
                               f"{self.drift.log_value:.2f} (log) >= log(1/{self.drift.alpha:g}) "
                               f"after {self.drift.n} decisions")
        return None

    def wants_audit(self) -> bool:
        """Draw for one accepted decision: audit it?"""
        rate = self.settings.audit_rate
        return rate > 0.0 and self._audit_rng.random() < rate

    def label(self, correct: bool) -> Alarm | None:
        """One labelled accepted decision (audit or feedback). Returns an alarm it raised."""
        self.accuracy.update(correct)
        target = self.settings.target_accuracy
        if self.alarm is None and self.accuracy.below(target):
            return self._raise("accuracy", f"accepted accuracy is below the target {target}: "
                               f"upper confidence bound {self.accuracy.upper:.4f} after "
                               f"{self.accuracy.n} labels")
        return None

    def restore(self, alarm: Alarm) -> None:
        """Re-arm an alarm this policy raised before a restart (read back from the log)."""
        if self.alarm is None:
            self.alarm = alarm

    def snapshot(self) -> dict[str, Any]:
        bounds = self.accuracy.bounds()
        return {
            "policy_id": self.policy_id,
            "decisions": self.n_decisions,
            "accepted": self.n_accepted,
            "accept_share": self.accept_share,
            "reference_accept_share": self.settings.reference_accept_share,
            "drift_test": self.drift is not None,
            "drift_log_martingale": None if self.drift is None else self.drift.log_value,
            "labels": bounds.n,
            "accuracy": bounds.mean,
            "accuracy_lower": bounds.lower,
            "accuracy_upper": bounds.upper,
            "target_accuracy": self.settings.target_accuracy,
            "alarm": None if self.alarm is None else self.alarm.kind,
            "alarm_detail": None if self.alarm is None else self.alarm.detail,
            "on_alarm": self.settings.on_alarm,
        }

    def _raise(self, kind: AlarmKind, detail: str) -> Alarm:
        self.alarm = Alarm(self.policy_id, kind, self.n_decisions, time.time(), detail)
        return self.alarm
