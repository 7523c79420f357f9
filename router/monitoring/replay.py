"""The monitoring a proxy ran, replayed offline from its decision log and its policy files, as
time series (``slotgate monitor``): accept share, drift martingale, the accuracy confidence
sequence at each label, alarms. Labels: a human (feedback) label wins over an audit label."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from router.monitoring.watch import PolicyWatch, WatchSettings

ROLLING = 200  # decisions behind the plotted accept share


class LogError(ValueError):
    """A decision log that cannot be replayed; ``field`` names what is missing."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Series:
    """One policy's replay. ``labels`` rows: (decision index, correct, lower, upper)."""

    policy_id: str
    target_accuracy: float
    reference_accept_share: float | None
    drift_threshold: float | None  # log(1 / alpha) of the drift test
    accepted: list[bool] = field(default_factory=list)
    drift: list[float] = field(default_factory=list)
    labels: list[tuple[int, bool, float, float]] = field(default_factory=list)
    alarms: list[dict[str, Any]] = field(default_factory=list)  # replayed here
    logged_alarms: list[dict[str, Any]] = field(default_factory=list)  # raised by the proxy
    state: dict[str, Any] = field(default_factory=dict)

    def rolling_accept_share(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        accepted = np.asarray(self.accepted, dtype=np.float64)
        sums = np.cumsum(accepted)
        window = np.minimum(np.arange(1, len(accepted) + 1), ROLLING)
        lagged = np.concatenate([np.zeros(ROLLING), sums])[: len(accepted)]
        return np.asarray((sums - lagged) / window, dtype=np.float64)


def replay_log(log_path: Path, policies: list[Any]) -> list[Series]:
    """Replay ``log_path`` for each policy file in ``policies`` whose id made decisions."""
    from policies.tuning import answer_confidence
    from router.store.decision_log import read_records

    if not log_path.is_file():
        raise LogError(f"{log_path}: decision log not found", field="log")
    decisions: dict[str, list[dict[str, Any]]] = {}
    human: dict[str, str] = {}
    audit: dict[str, str] = {}
    alarms: dict[str, list[dict[str, Any]]] = {}
    for record in read_records(log_path, events=True):
        kind = record.get("type", "decision")
        if kind == "decision" and record.get("proba") is not None:
            decisions.setdefault(str(record.get("policy_id")), []).append(record)
        elif kind == "feedback":
            human[str(record["decision_id"])] = str(record["label"])
        elif kind == "audit":
            audit[str(record["decision_id"])] = str(record["label"])
        elif kind == "alarm":
            alarms.setdefault(str(record.get("policy_id")), []).append(record)
    if not decisions:
        raise LogError(f"{log_path}: field 'type': the log holds no decisions (no record of "
                       "type 'decision' with a fast read in 'proba')", field="type")
    out = []
    for policy in policies:
        records = decisions.get(policy.policy_id)
        if not records:
            continue
        proba = np.asarray([r["proba"] for r in records], dtype=np.float64)
        runtime = policy.runtime()
        _, confidence = answer_confidence(proba, runtime.calibrator.transform(proba))
        watch = PolicyWatch(WatchSettings.of(policy))
        series = Series(policy.policy_id, policy.target_accuracy,
                        watch.settings.reference_accept_share,
                        None if watch.drift is None else float(np.log(1 / watch.drift.alpha)),
                        logged_alarms=alarms.get(policy.policy_id, []))
        threshold = np.inf if policy.threshold is None else policy.threshold
        for i, (record, c) in enumerate(zip(records, confidence, strict=True)):
            accepted = bool(c >= threshold)
            raised = watch.observe(float(c), accepted=accepted)
            series.accepted.append(accepted)
            if watch.drift is not None:
                series.drift.append(watch.drift.log_value)
            decision_id = str(record["decision_id"])
            label = human.get(decision_id, audit.get(decision_id))
            served_fast = record.get("route") in ("fast", "cache") and not record.get("escalated")
            if label is not None and served_fast:
                raised = watch.label(label == record.get("answer")) or raised
                series.labels.append((i, label == record.get("answer"), watch.accuracy.lower,
                                      watch.accuracy.upper))
            if raised is not None:
                series.alarms.append({"decision": i, "kind": raised.kind, "detail": raised.detail})
        series.state = watch.snapshot()
        out.append(series)
    if not out:
        known = ", ".join(sorted(decisions)) or "none"
        raise LogError(f"{log_path}: field 'policy_id': no decision was made by the given policies "
                       f"({', '.join(p.policy_id for p in policies)}); policy ids in the log: "
                       f"{known}", field="policy_id")
    return out
