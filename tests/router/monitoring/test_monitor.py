"""The Monitor behind routing's observer port: told of each decision (``decided``) and label
(``labelled``), asked through ``gate`` whether a policy's accepted answers escalate. The ladder
(audit_then_escalate), escalate_all and alert_only; alarms reach the log, the gauges and a
restart, an operator's clear wins over them; a reload of the same policy changes the action at
once, and one with another drift reference rebuilds the watch on it; identical inputs count once;
audits and feedback label accepted decisions once."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from policies.file import PolicyFile, ReferenceSummary
from policies.policy import Policy
from policies.types import DecisionRequest, Option, OptionScores
from router.errors import SlowPathTimeout
from router.monitoring.monitor import Monitor
from router.routing.ports import Label, Observation
from router.routing.registry import PolicyRegistry
from router.routing.reload import reload_now
from router.settings import PolicySettings
from router.store.decision_log import as_event
from router.store.metrics import Metrics
from router.store.records import AlarmRecord, AuditRecord
from tests.router.monitoring.conftest import (
    DOUBTFUL,
    OPTIONS,
    confident,
    spelled,
    watched_policy,
)


class Events:
    """The decision log's event sink: each record as the log stores it (``as_event``)."""

    def __init__(self) -> None:
        self.records: list[AuditRecord | AlarmRecord] = []

    async def __call__(self, record: AlarmRecord | dict[str, Any]) -> None:
        self.records.append(as_event(record))

    @property
    def alarms(self) -> list[AlarmRecord]:
        return [r for r in self.records if isinstance(r, AlarmRecord)]


def scores(p: float) -> OptionScores:
    return OptionScores(OPTIONS, confident(p))


def request(i: int | str) -> DecisionRequest:
    return DecisionRequest(f"q{i}", "which?", tuple(Option(o) for o in OPTIONS),
                           f"state {spelled(i)}")


def decide(monitor: Monitor, policy: PolicyFile, p: float, i: int | str = 0, *,
           served: bool = True) -> bool:
    """One decision as the service makes it: the pure policy, the gate, then the observer.
    Returns whether the fast answer was served (accepted and not gated)."""
    verdict, calibrated = Policy.from_file(policy).decide(scores(p))
    gated = monitor.gate(policy.policy_id) is not None
    served_fast = verdict.accept and not gated and served
    monitor.decided(Observation(request(i), f"d{i}", policy.policy_id, calibrated[0],
                                verdict.accept, "a", served_fast))
    return served_fast


def drive_into_drift(monitor: Monitor, policy: PolicyFile) -> int:
    watch = monitor.watches[policy.policy_id]
    for n in range(400):
        if "drift" in watch.alarms:
            return n
        decide(monitor, policy, DOUBTFUL, f"doubtful {n}")  # accepted, less sure than tuning
    raise AssertionError("no drift alarm within 400 decisions")


async def test_escalate_all_gates_on_a_drift_alarm_logged_exported_and_restored() -> None:
    metrics, events = Metrics(), Events()
    monitor = Monitor(metrics=metrics, events=events)
    policy = watched_policy(on_alarm="escalate_all")
    monitor.watch(policy)
    assert decide(monitor, policy, 0.98) and monitor.gate(policy.policy_id) is None
    drive_into_drift(monitor, policy)
    assert not decide(monitor, policy, 0.98, "sure")
    assert "drift alarm" in str(monitor.gate(policy.policy_id))
    await asyncio.sleep(0)  # the alarm record is written by a task
    [alarm] = events.alarms
    assert alarm.policy_id == policy.policy_id and alarm.kind == "drift"
    text = metrics.render().decode()
    assert f'slotgate_policy_alarm{{kind="drift",policy="{policy.policy_id}"}} 1.0' in text
    # a restart with the same policy re-arms the alarm from the log; a re-tuned one starts clean
    again = Monitor()
    again.watch(policy)
    assert again.restore(events.alarms) == 1 and again.gate(policy.policy_id) is not None
    retuned = watched_policy(data_hash="1" * 64, on_alarm="escalate_all")
    again.watch(retuned)
    assert again.gate(retuned.policy_id) is None


async def test_the_ladder_boosts_audits_on_drift_and_escalates_on_accuracy() -> None:
    asked: list[str] = []

    async def wrong(req: DecisionRequest) -> str:
        asked.append(req.question_id)
        return "b"  # the slow model disagrees with every fast answer

    monitor = Monitor(answer=wrong)
    policy = watched_policy(on_alarm="audit_then_escalate", audit_rate=0.0, audit_boost=0.5)
    monitor.watch(policy)
    watch = monitor.watches[policy.policy_id]
    drive_into_drift(monitor, policy)
    # drift alone: alert and audit more, the policy's answers are still served
    assert monitor.gate(policy.policy_id) is None and watch.audit_rate == 0.5
    assert not asked
    for i in range(200):
        decide(monitor, policy, 0.98, f"sure {i}")
        await monitor.audits.join()
        if "accuracy" in watch.alarms:
            break
    assert "accuracy" in watch.alarms and 0 < len(asked) < 200
    assert "accuracy alarm" in str(monitor.gate(policy.policy_id))
    assert not decide(monitor, policy, 0.98, "after")
    await monitor.aclose()


def test_a_reload_of_the_same_policy_changes_the_action_at_once() -> None:
    monitor = Monitor()
    policy = watched_policy(on_alarm="escalate_all")
    monitor.watch(policy)
    drive_into_drift(monitor, policy)
    assert monitor.gate(policy.policy_id) is not None
    edited = policy.model_copy(update={"on_alarm": "alert_only", "audit_rate": 0.3})
    assert edited.policy_id == policy.policy_id  # monitoring fields keep the identity
    monitor.watch(edited)  # what registry.load does on a live reload
    watch = monitor.watches[policy.policy_id]
    assert monitor.gate(policy.policy_id) is None and watch.audit_rate == 0.3
    assert "drift" in watch.alarms  # the alarm stands; only its action changed


def test_identical_inputs_count_once_and_confident_traffic_never_alarms() -> None:
    monitor = Monitor()
    policy = watched_policy(on_alarm="escalate_all")
    monitor.watch(policy)
    watch = monitor.watches[policy.policy_id]
    for _ in range(1000):  # one doubtful question asked again and again: one input
        decide(monitor, policy, DOUBTFUL, "canary")
    assert watch.n_decisions == 1000 and watch.n_counted == 1 and not watch.alarms
    for i in range(3000):  # many distinct inputs, all surer than the tuning rows
        decide(monitor, policy, 0.999, f"confident {i}")
    assert not watch.alarms and watch.drift is not None and watch.drift.log_value < 0


async def test_a_clear_stops_the_action_is_logged_and_wins_at_restore() -> None:
    events = Events()
    monitor = Monitor(events=events)
    policy = watched_policy(on_alarm="escalate_all")
    monitor.watch(policy)
    drive_into_drift(monitor, policy)
    alarm_time = monitor.watches[policy.policy_id].alarms["drift"].time
    assert monitor.clear(policy.policy_id, alarm_time + 1.0)
    assert monitor.gate(policy.policy_id) is None
    assert decide(monitor, policy, 0.98, "after the clear")  # the reset test does not re-fire
    await asyncio.sleep(0)
    kinds = [r.kind for r in events.alarms]
    assert kinds == ["drift", "clear"]
    restarted = Monitor()
    restarted.watch(policy)
    assert restarted.restore(events.alarms) == 0 and restarted.gate(policy.policy_id) is None
    # an alarm raised after the clear is re-armed again
    later = events.alarms[0].model_copy(update={"time": alarm_time + 2.0})
    assert restarted.restore([*events.alarms, later]) == 1


def test_alert_only_keeps_serving_and_no_summary_means_no_drift_test(
        caplog: pytest.LogCaptureFixture) -> None:
    monitor = Monitor()
    policy = watched_policy(on_alarm="alert_only")
    monitor.watch(policy)
    drive_into_drift(monitor, policy)
    assert monitor.gate(policy.policy_id) is None and decide(monitor, policy, 0.98, "sure")
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        old = watched_policy(reference=None, data_hash="2" * 64)
        monitor.watch(old)
    assert "no drift alarm" in caplog.text and monitor.watches[old.policy_id].drift is None
    for i in range(200):
        decide(monitor, old, DOUBTFUL, i)
    assert monitor.watches[old.policy_id].alarm is None


async def test_audits_label_accepted_decisions_and_a_full_queue_drops() -> None:
    events, metrics = Events(), Metrics()
    asked: list[str] = []

    async def slow(req: DecisionRequest) -> str:
        asked.append(req.question_id)
        if req.question_id == "q3":
            raise SlowPathTimeout("too slow")
        return "b" if req.question_id == "q2" else "a"

    monitor = Monitor(metrics=metrics, events=events, answer=slow)
    policy = watched_policy(audit_rate=1.0)
    monitor.watch(policy)
    pid = policy.policy_id
    for i in range(5):
        decide(monitor, policy, 0.98, i, served=i != 1)  # decision 1 was escalated
    decide(monitor, policy, 0.98, 0)  # the same input again: not audited twice
    await monitor.audits.join()
    assert sorted(asked) == ["q0", "q2", "q3", "q4"]
    audits = {r.decision_id: r for r in events.records if isinstance(r, AuditRecord)}
    assert audits["d0"].correct and not audits["d2"].correct and "d3" not in audits
    assert {r.probability for r in audits.values()} == {1.0}  # every decision drawn at rate 1
    watch = monitor.watches[pid]
    # Four decisions bet in order: three labels, one wrong; the failed audit (d3) counts as
    # right (no label came), so the weighted estimate is 3/4.
    assert watch.accuracy().n == 3 and watch.accuracy().mean == pytest.approx(3 / 4)
    assert watch.weighted.whole.n == 4 and watch.weighted.lost == 1
    assert watch.weighted.pending == 0
    counts = monitor.audits.counts
    assert (counts.done, counts.failed, counts.dropped) == (3, 1, 0)
    # feedback for an audited decision is not counted twice; for a new one it is; for an
    # escalated one never
    await monitor.labelled(Label("d0", pid, True, False, "feedback"))
    await monitor.labelled(Label("d9", pid, True, True, "feedback"))
    await monitor.labelled(Label("d8", pid, False, True, "feedback"))
    assert watch.trusted.n == 1 and watch.accuracy().n == 3
    await monitor.aclose()

    gate = asyncio.Event()

    async def stuck(req: DecisionRequest) -> str:
        await gate.wait()
        return "a"

    small = Monitor(metrics=metrics, answer=stuck, audit_capacity=1, audit_workers=1)
    small.watch(policy)
    for i in range(4):
        decide(small, policy, 0.98, i)
    await asyncio.sleep(0)  # the worker takes one; one waits; the others find the queue full
    decide(small, policy, 0.98, 9)
    assert small.audits.counts.dropped >= 2
    # The dropped audits' decisions are bet as unlabelled; the one in work still waits.
    assert small.watches[pid].weighted.lost == small.audits.counts.dropped
    assert small.watches[pid].weighted.pending >= 1
    assert f'slotgate_audits_total{{policy="{pid}",result="dropped"}}' in metrics.render().decode()
    gate.set()
    await small.aclose()


def reload_file(policy: PolicyFile, path: Path, registry: PolicyRegistry, metrics: Metrics) -> None:
    """An operator writing ``policy`` over the file, then the live reload (SIGHUP, the watch)."""
    policy.write(path)
    assert reload_now(registry, "test", metrics)


def resets(metrics: Metrics) -> list[str]:
    return [line for line in metrics.render().decode().splitlines()
            if line.startswith("slotgate_policy_watch_resets_total{")]


def test_a_reload_of_the_same_id_with_another_reference_rebuilds_the_watch_on_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: the watch was keyed by the policy id only, and the reference is left out of the
    id, so the reload kept the drift test built on the old tuning rows: traffic as sure as the
    new ones raised a false drift alarm. Now the watch is rebuilt on the file's own reference."""
    metrics = Metrics()
    monitor = Monitor(metrics=metrics)
    policy = watched_policy(on_alarm="alert_only")  # confident tuning rows (0.85 to 1.0)
    path = tmp_path / "policy.json"
    policy.write(path)
    registry = PolicyRegistry.load(PolicySettings(files=[path]),
                                   backend_fingerprint=policy.backend_fingerprint, monitor=monitor)
    for i in range(30):
        decide(monitor, policy, 0.98, f"before {i}")
    # Re-tuned on rows as doubtful as today's traffic, all accepted: same id.
    doubtful = Policy.from_file(policy).decide(scores(DOUBTFUL))[1][0]
    rows = np.random.default_rng(1).uniform(doubtful - 0.01, doubtful + 0.01, size=400)
    retuned = policy.model_copy(update={"reference": ReferenceSummary(
        n=400, accept_share=1.0, confidence=sorted(round(float(v), 4) for v in rows))})
    assert retuned.policy_id == policy.policy_id
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        reload_file(retuned, path, registry, metrics)
    watch = monitor.watches[policy.policy_id]
    assert watch.settings.reference == tuple(retuned.reference.confidence)  # type: ignore[union-attr]
    assert watch.n_decisions == 0 and watch.settings.reference_accept_share == 1.0
    for n in range(400):  # would raise the old reference's drift alarm (drive_into_drift)
        decide(monitor, policy, DOUBTFUL, f"doubtful {n}")
    assert not watch.alarms and watch.drift is not None and watch.drift.log_value < 1.0
    [line] = [r.getMessage() for r in caplog.records if "starts afresh" in r.getMessage()]
    assert policy.policy_id in line and "another reference" in line
    assert "dropping the evidence of 30 decisions" in line
    counted = f'slotgate_policy_watch_resets_total{{policy="{policy.policy_id}",reason="reference"}}'
    assert resets(metrics) == [f"{counted} 1.0"]


def test_a_reload_with_the_same_reference_keeps_the_running_watch(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The file written again with the same tuning rows (a re-run of tune, an action edited):
    the evidence gathered so far is still valid, so the watch, its tests and alarms run on."""
    metrics = Metrics()
    monitor = Monitor(metrics=metrics)
    policy = watched_policy(on_alarm="alert_only")
    path = tmp_path / "policy.json"
    policy.write(path)
    registry = PolicyRegistry.load(PolicySettings(files=[path]),
                                   backend_fingerprint=policy.backend_fingerprint, monitor=monitor)
    watch = monitor.watches[policy.policy_id]
    drive_into_drift(monitor, policy)
    evidence = (watch.n_decisions, watch.n_counted, watch.drift.log_value)  # type: ignore[union-attr]
    rewritten = policy.model_copy(update={"created_at": datetime.now(UTC), "audit_rate": 0.2})
    with caplog.at_level(logging.INFO, logger="slotgate.monitoring"):
        reload_file(policy, path, registry, metrics)  # byte for byte the same
        reload_file(rewritten, path, registry, metrics)
    assert monitor.watches[policy.policy_id] is watch and "drift" in watch.alarms
    assert (watch.n_decisions, watch.n_counted, watch.drift.log_value) == evidence  # type: ignore[union-attr]
    assert watch.audit_rate == 0.2  # the action field still applies at once
    assert "starts afresh" not in caplog.text and resets(metrics) == []


async def test_a_trusted_label_before_the_audit_leaves_the_audit_unlabelled() -> None:
    """The first label of a decision counts: a trusted label that comes while its audit is out
    goes to the trusted labels' test, and the audit's decision is bet on as unlabelled."""
    release = asyncio.Event()

    async def slow(req: DecisionRequest) -> str:
        await release.wait()
        return "b"

    monitor = Monitor(answer=slow)
    policy = watched_policy(audit_rate=1.0, on_alarm="alert_only")
    monitor.watch(policy)
    watch = monitor.watches[policy.policy_id]
    decide(monitor, policy, 0.98, 0)
    await asyncio.sleep(0)
    assert watch.weighted.pending == 1
    await monitor.labelled(Label("d0", policy.policy_id, True, True, "feedback"))
    release.set()
    await monitor.audits.join()
    assert watch.trusted.n == 1 and watch.weighted.lost == 1 and watch.weighted.pending == 0
    assert watch.accuracy().n == 0 and watch.accuracy().mean == 1.0  # no label, counted right
    await monitor.aclose()
