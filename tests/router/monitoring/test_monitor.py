"""The Monitor as the router uses it: a policy wrapped by it escalates everything once drift is
detected (escalate_all) or only alerts (alert_only); alarms reach the log, the gauges and a
restart; a re-tuned policy starts clean; audits and feedback label accepted decisions once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from policies.types import Decision, DecisionRequest, Option, OptionScores
from router.errors import SlowPathTimeout
from router.monitoring.monitor import Monitor
from router.store.metrics import Metrics
from tests.router.monitoring.conftest import OPTIONS, confident, watched_policy


class Events:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def __call__(self, record: dict[str, Any]) -> None:
        self.records.append(record)


def scores(p: float) -> OptionScores:
    return OptionScores(OPTIONS, confident(p))


async def test_drift_alarm_escalates_everything_and_is_logged_and_exported() -> None:
    metrics, events = Metrics(), Events()
    monitor = Monitor(metrics=metrics, events=events)
    policy = watched_policy()
    runtime = monitor.wrap(policy.runtime(), policy)
    high = scores(0.98)
    assert runtime.decide(high)[0].accept  # confident reads, like the tuning rows: accepted
    n = 0
    while runtime.watch.alarm is None:  # the reads become much less confident
        runtime.decide(scores(0.55))
        n += 1
        assert n < 200
    verdict, _ = runtime.decide(high)
    assert not verdict.accept and "drift alarm" in verdict.reason
    await asyncio.sleep(0)  # the alarm record is written by a task
    [alarm] = [r for r in events.records if r["type"] == "alarm"]
    assert alarm["policy_id"] == policy.policy_id and alarm["kind"] == "drift"
    text = metrics.render().decode()
    assert f'slotgate_policy_alarm{{kind="drift",policy="{policy.policy_id}"}} 1.0' in text
    assert "slotgate_policy_accept_share" in text and "slotgate_policy_drift_log_martingale" in text
    # a restart with the same policy re-arms the alarm from the log; a re-tuned one starts clean
    again = Monitor()
    restarted = again.wrap(policy.runtime(), policy)
    assert again.restore(events.records) == 1 and not restarted.decide(high)[0].accept
    retuned = watched_policy(threshold=0.7)
    assert again.wrap(retuned.runtime(), retuned).decide(high)[0].accept


def test_alert_only_keeps_serving_and_no_summary_means_no_drift_test(
        caplog: pytest.LogCaptureFixture) -> None:
    monitor = Monitor()
    policy = watched_policy(on_alarm="alert_only")
    runtime = monitor.wrap(policy.runtime(), policy)
    for _ in range(200):
        runtime.decide(scores(0.55))
    assert runtime.watch.alarm is not None and runtime.decide(scores(0.98))[0].accept
    with caplog.at_level(logging.WARNING, logger="slotgate.monitoring"):
        old = watched_policy(reference=None, threshold=0.75)
        bare = monitor.wrap(old.runtime(), old)
    assert "no drift alarm" in caplog.text and bare.watch.drift is None
    for _ in range(200):
        bare.decide(scores(0.55))
    assert bare.watch.alarm is None


def request(i: int) -> DecisionRequest:
    return DecisionRequest(f"q{i}", "which?", tuple(Option(o) for o in OPTIONS), f"state {i}")


def decision(i: int, policy_id: str, *, answer: str = "a", route: str = "fast",
             escalated: bool = False) -> Decision:
    return Decision(f"d{i}", f"q{i}", answer, route, 0.9, 0.9, 0.8, policy_id,  # type: ignore[arg-type]
                    1.0, escalated=escalated)


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
    monitor.wrap(policy.runtime(), policy)
    pid = policy.policy_id
    monitor.after([request(i) for i in range(5)],
                  [decision(0, pid), decision(1, pid, route="slow", escalated=True),
                   decision(2, pid), decision(3, pid), decision(4, pid, route="cache")])
    await monitor.audits.join()
    assert sorted(asked) == ["q0", "q2", "q3", "q4"]  # accepted ones only, escalated not
    audits = {r["decision_id"]: r for r in events.records if r["type"] == "audit"}
    assert audits["d0"]["correct"] and not audits["d2"]["correct"] and "d3" not in audits
    watch = monitor.watches[pid]
    assert watch.accuracy.n == 3 and watch.accuracy.bounds().mean == pytest.approx(2 / 3)
    counts = monitor.audits.counts
    assert (counts.done, counts.failed, counts.dropped) == (3, 1, 0)
    # feedback for an audited decision is not counted twice; for a new one it is
    await monitor.feedback({"decision_id": "d0", "policy_id": pid, "answer": "a",
                            "route": "fast", "escalated": False}, "c")
    await monitor.feedback({"decision_id": "d9", "policy_id": pid, "answer": "a",
                            "route": "fast", "escalated": False}, "a")
    assert watch.accuracy.n == 4
    await monitor.aclose()

    gate = asyncio.Event()

    async def stuck(req: DecisionRequest) -> str:
        await gate.wait()
        return "a"

    small = Monitor(metrics=metrics, answer=stuck, audit_capacity=1, audit_workers=1)
    small.wrap(policy.runtime(), policy)
    small.after([request(i) for i in range(4)], [decision(i, pid) for i in range(4)])
    await asyncio.sleep(0)  # the worker takes one; one waits; the others find the queue full
    small.after([request(9)], [decision(9, pid)])
    assert small.audits.counts.dropped >= 2
    assert f'slotgate_audits_total{{policy="{pid}",result="dropped"}}' in metrics.render().decode()
    gate.set()
    await small.aclose()
