"""The monitoring a proxy ran, replayed offline from its decision log and its policy files, as
time series (``slotgate monitor``): accept share, drift martingale, the accuracy confidence
sequence at each label, alarms, and accepted accuracy per answer.

The log is streamed twice (labels and alarms first, then the decisions in order), so memory
holds the labels and the series, never the records. Each decision is judged by the policy's
own steps (``verdict_on``: per-option bars, margins and the budget as served; a cascade's
decision climbs its tiers again on the tiers' logged reads, or, logged without them, its logged
verdict is replayed and counted in ``logged_verdicts``); labels are joined
by ``router.store.log_join`` and count, as live, for decisions whose fast answer was served,
and, as live, only audits and trusted keys' labels (a client's labels judge nothing). Where the
proxy logged its audits' draw probabilities, the weighted test takes every accepted, served,
new input as live (``router.monitoring.weighted``): an audited one at its logged probability
with its audit's label, the others as not drawn; an audit label logged without a probability
(an older log) is taken as a trusted label (one warning says how many)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calibration.monitoring import Bounds
from calibration.per_answer import AnswerAccuracy, PerAnswerTally
from policies.policy import Policy
from policies.types import OptionScores, Verdict
from router.monitoring.watch import Alarm, PolicyWatch, WatchSettings
from router.store.log_join import LabelJoin, distinct_decisions
from router.store.log_reader import ReadCounts, read_log
from router.store.records import AlarmRecord, AuditRecord, DecisionRecord

ROLLING = 200  # decisions behind the plotted accept share
BATCH = 1024  # decisions calibrated in one call (memory: BATCH x options floats)
logger = logging.getLogger("slotgate.monitoring")


class LogError(ValueError):
    """A decision log that cannot be replayed; ``field`` names what is missing."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class TierTally:
    """One tier of a cascade in a replayed log: the decisions it read, those it answered (its
    answer served), the labels of those answers, and its own watch on its reads against the
    tier's reference, as a policy's (docs/monitoring.md): ``drift``, the drift test's log
    martingale on the answers it accepted, and ``drift_alarm``, the decision at which it first
    alarmed; ``traffic_tripped_at``, the decision at which the traffic test on all its reads
    first tripped (None: never; all three None when the file has no reference for the tier).
    Shown, never acted on: the proxy's alarms are the whole cascade's."""

    read: int = 0
    answered: int = 0
    labelled: int = 0
    correct: int = 0
    drift: float | None = None
    drift_alarm: int | None = None
    traffic_tripped_at: int | None = None


@dataclass
class Series:
    """One policy's replay. ``labels`` rows: (decision index, correct, lower, upper).
    ``unfit``: decisions of this policy whose logged read its calibrator cannot take (another
    number of options); they are counted, not replayed."""

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
    per_answer: list[AnswerAccuracy] = field(default_factory=list)  # worst first
    # A cascade's tiers (docs/cascade.md), by name in reading order: decisions each read and
    # answered, and the labels of its answers (labelled, correct); empty for one fast tier.
    tiers: dict[str, TierTally] = field(default_factory=dict)
    unfit: int = 0
    damaged_lines: int = 0  # of the whole log
    # A cascade's decisions logged without every tier's read: their logged verdicts replayed.
    logged_verdicts: int = 0
    # Audit labels logged without their draw probability: taken as trusted labels.
    unweighted_audits: int = 0

    def as_json(self) -> dict[str, Any]:
        """What ``slotgate monitor --json`` prints of this policy."""
        return {**self.state, "alarms": self.alarms, "logged_alarms": self.logged_alarms,
                "per_answer": [row.as_dict() for row in self.per_answer],
                "tiers": {name: vars(tally) for name, tally in self.tiers.items()},
                "unfit_decisions": self.unfit, "damaged_lines": self.damaged_lines,
                "logged_verdicts": self.logged_verdicts,
                "unweighted_audits": self.unweighted_audits}

    def per_answer_rows(self, *, limit: int = 20) -> list[tuple[str, str]]:
        """The per-answer table's rows, worst first: (answer, accuracy [bounds] (n labelled))."""
        return [(row.answer, (f"{row.accuracy:.4f} [{row.lower:.4f}, {row.upper:.4f}] "
                              f"({row.correct}/{row.n})")) for row in self.per_answer[:limit]]

    def running_accuracy(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Accuracy of the labels so far, at each label (a cumulative sum: the per-label sums
        it replaced took 250 s of a 45,000-decision log's 300 s ``monitor --plot``)."""
        correct = np.fromiter((c for _, c, *_ in self.labels), dtype=np.float64,
                              count=len(self.labels))
        return np.asarray(np.cumsum(correct) / np.arange(1, len(correct) + 1), dtype=np.float64)

    def rolling_accept_share(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        accepted = np.asarray(self.accepted, dtype=np.float64)
        sums = np.cumsum(accepted)
        window = np.minimum(np.arange(1, len(accepted) + 1), ROLLING)
        lagged = np.concatenate([np.zeros(ROLLING), sums])[: len(accepted)]
        return np.asarray((sums - lagged) / window, dtype=np.float64)


def verdict_on(runtime: Policy, record: DecisionRecord) -> tuple[Verdict, float] | None:
    """The policy's own verdict on one logged fast read (its rule, stateful rules advancing),
    and the confidence its drift test watches: the calibrated probability of the raw argmax, as
    served. None when the record has no read or the read does not fit the policy."""
    if record.proba is None:
        return None
    judged = _Judge(runtime).judge([record])
    return judged[0]


class _Judge:
    """The policy's verdicts on logged reads, calibrated a batch at a time (one ``transform``
    per option count: per-row calls cost ~0.5 ms each, most of a 50,000-decision replay) and
    judged one by one in log order by the policy's rule, so a budget's window advances as it
    did when served."""

    def __init__(self, runtime: Policy) -> None:
        self.runtime = runtime
        self.window = runtime.escalation_window()  # a budget's, advanced in log order
        self.logged_verdicts = 0  # cascade decisions logged without their tiers' reads

    def judge(self, records: list[DecisionRecord]) -> list[tuple[Verdict, float] | None]:
        calibrated: list[np.ndarray[Any, np.dtype[np.float64]] | None] = [None] * len(records)
        by_width: dict[int, list[int]] = {}
        for i, record in enumerate(records):
            if record.proba is not None:
                by_width.setdefault(len(record.proba), []).append(i)
        for rows in by_width.values():
            raw = np.asarray([records[i].proba for i in rows], dtype=np.float64)
            try:
                out = self.runtime.tiers_[0].calibrator.transform(raw)
            except (ValueError, IndexError):  # another option count than it was fit on
                continue
            for i, row in zip(rows, out, strict=True):
                calibrated[i] = row
        judged: list[tuple[Verdict, float] | None] = []
        for record, row in zip(records, calibrated, strict=True):
            if record.tiers is not None:
                judged.append(self.climb(record))
                continue
            if row is None or record.proba is None:
                judged.append(None)
                continue
            top = int(np.argmax(record.proba))  # the raw argmax: the answer served
            window = self.window
            verdict = self.runtime.tiers_[0].rule.verdict(
                record.options, row.tolist(), top,
                escalations=0 if window is None else window.escalations)
            if window is not None:
                window.record(verdict)
            judged.append((verdict, float(row[top])))
        return judged

    def climb(self, record: DecisionRecord) -> tuple[Verdict, float] | None:
        """A cascade decision judged again: the policy's steps up its tiers on the tiers'
        logged reads; the logged verdict when the log lacks a read the climb needs."""
        reads, runtime = record.tier_proba or {}, self.runtime
        k = runtime.next_tier(-1)
        if k is None:
            k = 0
        while k is not None:
            proba = reads.get(runtime.tiers_[k].name)
            if proba is None or len(proba) != len(record.options):
                self.logged_verdicts += 1
                return cascade_verdict(record)
            step = runtime.step(k, OptionScores(tuple(record.options), tuple(proba)))
            if step.climb is None:
                return step.verdict, step.verdict.probability
            k = step.climb
        return None


def cascade_verdict(record: DecisionRecord) -> tuple[Verdict, float] | None:
    """A cascade's verdict on a logged decision: its last tier's, as the proxy logged it (for a
    decision logged without its tiers' reads, which cannot be judged again), and that tier's
    calibrated probability, the confidence its drift test watched.
    None when the record's tiers are damaged or empty (counted as unfit)."""
    try:
        last = (record.tiers or [])[-1]
        return (Verdict(bool(last["accepted"]), record.options.index(last["answer"]),
                        float(last["probability"]), last["threshold"],
                        f"tier {last['tier']}'s logged verdict"), float(last["probability"]))
    except (IndexError, KeyError, TypeError, ValueError):
        return None


class _Replay:
    """One policy's state while the log streams past."""

    def __init__(self, policy: Any, logged_alarms: list[dict[str, Any]], damaged: int, *,
                 weighs: bool = False) -> None:
        self.weighs = weighs  # the log holds audits with their draw probabilities
        self.judge = _Judge(Policy.from_file(policy))
        self.watch = PolicyWatch(WatchSettings.of(policy))
        # A cascade's tiers, each watched on its own reads for drift (label-free, shown only).
        self.tier_watches = {} if policy.cascade is None else {
            tier.name: PolicyWatch(WatchSettings(
                policy_id=f"{policy.policy_id}/{tier.name}",
                target_accuracy=policy.target_accuracy, on_alarm="alert_only",
                alarm_alpha=policy.alarm_alpha, reference=tuple(tier.reference.confidence),
                reference_accept_share=tier.reference.accept_share, seed=policy.seed))
            for tier in policy.cascade.tiers if tier.reference is not None}
        drift = self.watch.drift
        self.series = Series(policy.policy_id, policy.target_accuracy,
                             self.watch.settings.reference_accept_share,
                             None if drift is None else float(np.log(1 / drift.alpha)),
                             logged_alarms=logged_alarms, damaged_lines=damaged)
        self.tally = PerAnswerTally()
        self._batch: list[DecisionRecord] = []

    def add(self, record: DecisionRecord, labels: LabelJoin) -> None:
        self._batch.append(record)
        if len(self._batch) >= BATCH:
            self.flush(labels)

    def flush(self, labels: LabelJoin) -> None:
        batch, self._batch = self._batch, []
        for record, judged in zip(batch, self.judge.judge(batch), strict=True):
            if judged is None:
                self.series.unfit += 1
            else:
                self._step(record, *judged, labels)

    def _step(self, record: DecisionRecord, verdict: Verdict, confidence: float,
              labels: LabelJoin) -> None:
        watch, series, i = self.watch, self.series, len(self.series.accepted)
        counted, raised = watch.take(confidence, accepted=verdict.accept,
                                     caller=record.namespace, now=record.time or None)
        series.accepted.append(verdict.accept)
        self._tier_reads(record, i)
        if watch.drift is not None:
            series.drift.append(watch.drift.log_value)
        fast = record.served_fast and record.answer is not None
        probability = labels.audit_probability(record.decision_id)
        if self.weighs and counted and verdict.accept and fast:
            raised = self._weigh(record, confidence, probability, labels, i) or raised
        joined = labels.label(record.decision_id)
        if joined is not None and fast and probability is None:
            correct = joined[0] == record.answer
            series.unweighted_audits += joined[1] == "slow"
            raised = watch.label(correct) or raised
            self._labelled(record, correct, i, watch.trusted.bounds())
        if record.tier is not None and record.served_fast:
            series.tiers.setdefault(record.tier, TierTally()).answered += 1
        if raised is not None:
            series.alarms.append({"decision": i, "kind": raised.kind, "detail": raised.detail})

    def _weigh(self, record: DecisionRecord, confidence: float, probability: float | None,
               labels: LabelJoin, i: int) -> Alarm | None:
        """An auditable decision for the weighted test: audited at its logged probability, with
        its audit's label, or not drawn."""
        audit = labels.audit(record.decision_id)
        drawn = probability is not None and audit is not None
        draw, raised = self.watch.draw(confidence, ticket=(drawn, probability))
        if draw is None:
            return raised
        correct = audit == record.answer
        raised = self.watch.audited(draw.ticket, correct) or raised
        self._labelled(record, correct, i, self.watch.accuracy())
        return raised

    def _labelled(self, record: DecisionRecord, correct: bool, i: int, bounds: Bounds) -> None:
        """A label taken: the series' row (with the interval it feeds), the per-answer and the
        tier's tallies."""
        self.series.labels.append((i, correct, bounds.lower, bounds.upper))
        self.tally.add(str(record.answer), correct)
        if record.tier is not None:
            tally = self.series.tiers.setdefault(record.tier, TierTally())
            tally.labelled += 1
            tally.correct += correct

    def _tier_reads(self, record: DecisionRecord, i: int) -> None:
        """A cascade's tiers: each read counted and fed to its tier's own watch."""
        for read in record.tiers or ():
            tally = self.series.tiers.setdefault(str(read["tier"]), TierTally())
            tally.read += 1
            tier_watch = self.tier_watches.get(str(read["tier"]))
            if tier_watch is not None and tier_watch.drift is not None:
                tier_raised = tier_watch.observe(float(read["probability"]),
                                                 accepted=bool(read["accepted"]))
                tally.drift = tier_watch.drift.log_value
                if tier_raised is not None and tally.drift_alarm is None:
                    tally.drift_alarm = i
                if tier_watch.traffic_tripped and tally.traffic_tripped_at is None:
                    tally.traffic_tripped_at = i

    def finish(self, labels: LabelJoin) -> Series:
        self.flush(labels)
        self.series.logged_verdicts = self.judge.logged_verdicts
        if self.judge.logged_verdicts:
            logger.warning("policy %s: %d cascade decisions were logged without every tier's "
                           "read; their logged verdicts are replayed, not judged again",
                           self.series.policy_id, self.judge.logged_verdicts)
        if self.series.unweighted_audits:
            logger.warning("policy %s: %d audit labels were logged without their draw "
                           "probability (drawn at one rate for every answer): they are taken "
                           "as trusted labels, not by the weighted test", self.series.policy_id,
                           self.series.unweighted_audits)
        self.series.state = self.watch.report()
        self.series.per_answer = self.tally.table()
        return self.series


def replay_log(log_path: Path, policies: list[Any]) -> list[Series]:
    """Replay ``log_path`` for each policy file in ``policies`` whose id made decisions."""
    if not log_path.is_file():
        raise LogError(f"{log_path}: decision log not found", field="log")
    counts = ReadCounts()
    labels = LabelJoin()
    logged: dict[str, list[dict[str, Any]]] = {}
    made: dict[str, int] = {}  # policy id -> decisions with a fast read
    weighs: set[str] = set()  # policy ids with audits logged with their draw probability
    seen: set[str] = set()
    for record in read_log(log_path, counts=counts):
        labels.add(record)
        if isinstance(record, AlarmRecord):
            logged.setdefault(record.policy_id, []).append(record.model_dump())
        elif isinstance(record, AuditRecord) and record.probability is not None:
            weighs.add(str(record.policy_id))
        elif (isinstance(record, DecisionRecord) and judged(record)
              and record.decision_id not in seen):
            seen.add(record.decision_id)
            made[str(record.policy_id)] = made.get(str(record.policy_id), 0) + 1
    del seen
    if not made:
        raise LogError(f"{log_path}: field 'type': the log holds no decisions (no record of "
                       "type 'decision' with a fast read in 'proba')", field="type")
    replays = {p.policy_id: _Replay(p, logged.get(p.policy_id, []), counts.damaged,
                                    weighs=p.policy_id in weighs)
               for p in policies if p.policy_id in made}
    if not replays:
        known = ", ".join(sorted(made)) or "none"
        raise LogError(f"{log_path}: field 'policy_id': no decision was made by the given policies "
                       f"({', '.join(p.policy_id for p in policies)}); policy ids in the log: "
                       f"{known}", field="policy_id")
    for decision in distinct_decisions(read_log(log_path, quiet=True)):
        replay = replays.get(str(decision.policy_id))
        if replay is not None and judged(decision):
            replay.add(decision, labels)
    return [replay.finish(labels) for replay in replays.values()]


def judged(record: DecisionRecord) -> bool:
    """Whether a policy judged the decision: it has a fast read (``proba``), or a cascade's
    tiers read it (the first tier may not have)."""
    return record.proba is not None or bool(record.tiers)
