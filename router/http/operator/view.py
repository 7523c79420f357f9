"""What the operator page shows, gathered from the running app as typed records: each loaded
policy's question, promise (its cost promise too, when it has one) and watch (live coverage and
accuracy with their confidence sequences, the watch state, the alarms standing, a broken cost
promise among them) and the last decisions in the decision log (read from its file's tail;
never their message text)."""

from __future__ import annotations

import asyncio
import math
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from calibration.monitoring import Bounds
from calibration.sequences import rate_sequence
from policies.file import PolicyFile
from router.http.state import AppState
from router.monitoring.ladder import state_word
from router.monitoring.monitor import Monitor
from router.routing.registry import LoadedPolicy, PolicyRegistry
from router.store.log_reader import DamagedRecord, parse_record
from router.store.records import DecisionRecord

LAST_DECISIONS = 20
TAIL_BYTES = 512 * 1024  # how much of the log's end is read for them


@dataclass(frozen=True, slots=True)
class Interval:
    """A share with its confidence sequence's interval now (``mean`` None before any count)."""

    mean: float | None
    lower: float
    upper: float
    n: int

    @classmethod
    def of(cls, bounds: Bounds) -> Interval:
        return cls(bounds.mean, bounds.lower, bounds.upper, bounds.n)


# What a broken cost promise does, by the policy file's ``on_cost_alarm`` (router.routing.plan).
COST_ACTIONS = {
    "alert_only": "logged and exported only; no decision changes",
    "serve_unverified": "where the policy's own verdict escalates, the fast answer is served "
                        "marked unverified; an accuracy alarm's escalations still reach the "
                        "slow model",
}


@dataclass(frozen=True, slots=True)
class AlarmView:
    """A standing alarm; ``action``: what it does (``on_alarm`` for drift and accuracy, the
    file's ``on_cost_alarm`` for a broken cost promise, kind ``cost``)."""

    kind: str
    time: float
    decision: int
    detail: str
    action: str


@dataclass(frozen=True, slots=True)
class CostPromiseView:
    """A policy's promise on cost: the slow model answers more than ``share`` of a block of
    ``block`` consecutive decisions with probability at most ``delta``; ``on_cost_alarm`` and
    ``action`` say what a broken one does."""

    share: float
    block: int
    delta: float
    on_cost_alarm: str
    action: str


@dataclass(frozen=True, slots=True)
class WatchView:
    """A policy's watch: ``state`` is the receipts' word ("clear", "suspect", "alarmed");
    ``coverage`` the accepted share of every decision since the watch started and ``accuracy``
    the weighted estimate of accepted accuracy (``PolicyWatch.accuracy``), each with its
    interval at ``level``; ``trusted_labels`` the trusted labels, tested apart."""

    state: str
    decisions: int
    coverage: Interval
    recent_coverage: float | None
    accuracy: Interval
    trusted_labels: int
    level: float
    alarms: list[AlarmView]
    escalating: bool
    on_alarm: str
    audit_rate: float
    traffic_tripped: bool
    drift_log: float | None
    drift_alarm_at: float | None


@dataclass(frozen=True, slots=True)
class PolicyView:
    """One loaded policy: its question, its promise (on its ``n_tune`` tuning rows: accepted
    accuracy at least ``bound``, at level ``1 - delta``, accepting ``tuned_coverage``) and its
    watch (None when monitoring is off)."""

    name: str
    policy_id: str
    path: str | None
    question: str
    instructions: str
    context: str
    options: list[str]
    guarantee: str | None
    unguaranteed: str | None
    shadow: bool
    target_accuracy: float
    delta: float
    bound: float
    tuned_coverage: float
    n_tune: int
    cost: CostPromiseView | None
    watch: WatchView | None


@dataclass(frozen=True, slots=True)
class DecisionRow:
    time: float
    decision_id: str
    policy_id: str | None
    route: str | None
    answer: str | None
    probability: float | None
    threshold: float | None
    latency_ms: float | None


@dataclass(frozen=True, slots=True)
class PageView:
    replica: str
    generated_at: float
    monitoring: bool
    shared_alarms: bool
    policies: list[PolicyView]
    decisions: list[DecisionRow]
    log_path: str


async def page_view(state: AppState) -> PageView:
    """The page's data now. The policies and watches are read on the event loop, between two
    decisions (the loop changes them); the log file's tail in a thread."""
    service, settings = state.service, state.settings
    monitor = service.monitor if isinstance(service.monitor, Monitor) else None
    policies = [policy_view(p, service.registry, monitor) for p in service.registry.loaded()]
    log_path = settings.log.decision_log_path
    return PageView(
        replica=socket.gethostname(), generated_at=time.time(), monitoring=monitor is not None,
        shared_alarms=bool(settings.cache.redis_url) and settings.monitoring.share_alarms,
        policies=policies, decisions=await asyncio.to_thread(last_decisions, log_path),
        log_path=str(log_path))


def policy_view(policy: LoadedPolicy, registry: PolicyRegistry,
                monitor: Monitor | None) -> PolicyView:
    file = policy.file
    question = file.question
    shadow, guarantee = registry.mode(policy.runtime)
    return PolicyView(
        name=policy.name, policy_id=file.policy_id,
        path=None if policy.path is None else str(policy.path),
        question="" if question is None else question.id,
        instructions="" if question is None else question.instructions,
        context="" if question is None else question.context,
        options=list(file.options or []), guarantee=guarantee, unguaranteed=policy.unguaranteed,
        shadow=shadow, target_accuracy=file.target_accuracy, delta=file.delta, bound=file.bound,
        tuned_coverage=file.coverage, n_tune=file.n_tune, cost=cost_promise_view(file),
        watch=None if monitor is None else watch_view(monitor, file.policy_id))


def cost_promise_view(file: PolicyFile) -> CostPromiseView | None:
    promise = file.cost_promise
    if promise is None:
        return None
    return CostPromiseView(share=promise.share, block=promise.block, delta=promise.delta,
                           on_cost_alarm=file.on_cost_alarm,
                           action=COST_ACTIONS[file.on_cost_alarm])


def watch_view(monitor: Monitor, policy_id: str) -> WatchView | None:
    watch = monitor.watches.get(policy_id)
    if watch is None:
        return None
    # Both intervals at the accuracy gauge's level (``PolicyWatch.accuracy``), so they read alike.
    alpha = watch.settings.alarm_alpha / 2.0
    gate = watch.gate
    on_alarm = f"on_alarm: {watch.settings.on_alarm}"
    alarms = [AlarmView(a.kind, a.time, a.decision, a.detail, on_alarm)
              for a in watch.alarms.values()]
    check = monitor.costs.checks.get(policy_id)
    if check is not None and check.alarm is not None:  # latched until an operator's clear
        on_cost_alarm = check.settings.on_cost_alarm
        alarms.append(AlarmView("cost", check.alarm.time, check.alarm.decision,
                                check.alarm.detail,
                                f"on_cost_alarm: {on_cost_alarm}: {COST_ACTIONS[on_cost_alarm]}"))
    return WatchView(
        state=state_word(watch.snapshot()), decisions=watch.n_decisions,
        coverage=Interval.of(rate_sequence(watch.n_accepted, watch.n_decisions, alpha=alpha)),
        recent_coverage=watch.accept_share, accuracy=Interval.of(watch.accuracy()),
        trusted_labels=watch.trusted.n,
        level=1.0 - alpha,
        alarms=sorted(alarms, key=lambda a: a.time),
        escalating=gate.escalate, on_alarm=watch.settings.on_alarm, audit_rate=gate.audit_rate,
        traffic_tripped=watch.traffic_tripped,
        drift_log=None if watch.drift is None else watch.drift.log_value,
        drift_alarm_at=None if watch.drift is None else math.log(1.0 / watch.drift.alpha))


def last_decisions(path: Path, *, limit: int = LAST_DECISIONS,
                   tail_bytes: int = TAIL_BYTES) -> list[DecisionRow]:
    """The last ``limit`` decisions in the log file, newest first, from its last ``tail_bytes``
    (a line cut by that start, or a damaged one, is skipped); none for a missing file."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - tail_bytes))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    if size > tail_bytes:
        lines = lines[1:]  # the first line starts before the tail
    rows: list[DecisionRow] = []
    for line in reversed(lines):
        try:
            record = parse_record(line) if line.strip() else None
        except DamagedRecord:
            continue
        if isinstance(record, DecisionRecord):
            rows.append(DecisionRow(record.time, record.decision_id, record.policy_id,
                                    record.route, record.answer, record.probability,
                                    record.threshold, record.latency_ms))
            if len(rows) == limit:
                break
    return rows
