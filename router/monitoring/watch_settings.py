"""What a policy file says about watching it (``WatchSettings``: what the watch measures
against and what its alarms do) and the alarm it raises (``Alarm``)."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from router.monitoring.ladder import AlarmKind, OnAlarm

DEFAULT_AUDIT_BOOST = 0.75  # audit rate while a drift alarm stands (audit_then_escalate)


@dataclass(frozen=True, slots=True)
class Alarm:
    """Why and when a policy stopped being trusted (latched until cleared or re-tuned)."""

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
    on_alarm: OnAlarm = "audit_then_escalate"
    audit_boost: float = DEFAULT_AUDIT_BOOST
    alarm_alpha: float = 0.05
    reference: tuple[float, ...] | None = None  # tuning rows' confidences; None: no drift test
    reference_accept_share: float | None = None
    seed: int = 0

    @classmethod
    def of(cls, policy_file: Any) -> WatchSettings:
        reference = policy_file.reference
        return cls(policy_id=policy_file.policy_id, target_accuracy=policy_file.target_accuracy,
                   audit_rate=policy_file.audit_rate, on_alarm=policy_file.on_alarm,
                   audit_boost=getattr(policy_file, "audit_boost", DEFAULT_AUDIT_BOOST),
                   alarm_alpha=policy_file.alarm_alpha,
                   reference=None if reference is None else tuple(reference.confidence),
                   reference_accept_share=None if reference is None else reference.accept_share,
                   seed=policy_file.seed)

    @property
    def basis(self) -> tuple[object, ...]:
        """What the watch's statistics are measured against: the drift reference (the tuning
        rows' confidences and accept share), the alarms' alpha, the target and the seed. A
        reloaded file of the same policy id with another basis needs a fresh watch (its old
        evidence was gathered against something that no longer holds); the action fields
        (``on_alarm``, ``audit_rate``, ``audit_boost``) are not part of it."""
        return (self.reference, self.reference_accept_share, self.alarm_alpha,
                self.target_accuracy, self.seed)

    @property
    def reference_id(self) -> str:
        """A short fingerprint of the drift reference, for logs ("none" without one)."""
        if self.reference is None:
            return "none"
        digest = hashlib.blake2b(digest_size=6)
        digest.update(struct.pack(f"<{len(self.reference)}d", *self.reference))
        digest.update(struct.pack("<d", -1.0 if self.reference_accept_share is None
                                  else self.reference_accept_share))
        return digest.hexdigest()

    @property
    def accepted_reference(self) -> tuple[float, ...] | None:
        """The tuning rows the policy accepted: the top ``reference_accept_share`` of the sorted
        reference confidences (exact for one global threshold; for per-option thresholds the
        surest rows stand in for the accepted ones). None when there are none."""
        if self.reference is None:
            return None
        if self.reference_accept_share is None:
            return self.reference
        n = round(self.reference_accept_share * len(self.reference))
        return tuple(sorted(self.reference)[-n:]) if n > 0 else None

    def basis_changes(self, other: WatchSettings) -> list[str]:
        """The fields of ``basis`` that differ from ``other``'s, by name."""
        names = ("reference", "reference", "alarm_alpha", "target_accuracy", "seed")
        return list(dict.fromkeys(name for name, mine, theirs
                                  in zip(names, self.basis, other.basis, strict=True)
                                  if mine != theirs))
