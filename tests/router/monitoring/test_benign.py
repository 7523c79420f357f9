"""What the watch does not take for harm, and what it never lets slide: templated messages (ids,
names, timestamps) are one input; a campaign of distinct unsure messages the policy never
accepts raises no alarm (it buys audits; under escalate_all it escalates until cleared) while
accepted answers less sure than the tuning rows do; under a drift alarm or after the traffic
detector's trip, audits that cannot be had make the ladder escalate, and it says so, until the audit queue drains
(not until someone asks: the gate only reads the watch)."""

from __future__ import annotations

import asyncio
import time

from policies.file import PolicyFile
from policies.policy import Policy
from policies.types import DecisionRequest, Option
from router.errors import SlowPathTimeout
from router.monitoring.fingerprint import input_key, normalised
from router.monitoring.ladder import WatchSnapshot
from router.monitoring.monitor import Monitor
from router.routing.ports import Observation
from tests.router.monitoring.conftest import DOUBTFUL, OPTIONS, spelled, watched_policy
from tests.router.monitoring.test_monitor import decide, drive_into_drift, scores


def asked(text: str) -> DecisionRequest:
    return DecisionRequest("pick", "which?", tuple(Option(o) for o in OPTIONS), text)


def observe(monitor: Monitor, policy: PolicyFile, p: float, text: str) -> None:
    """One decision on ``text`` exactly as written (``decide`` spells digits out)."""
    verdict, calibrated = Policy.from_file(policy).decide(scores(p))
    monitor.decided(Observation(asked(text), text, policy.policy_id, calibrated[0],
                                verdict.accept, "a", verdict.accept))


def test_templated_ids_names_and_timestamps_are_one_input() -> None:
    same = [
        "Ticket #104233: Hi, I am Maria Lopez and my card was declined at 10:32 on 2024-05-01",
        "Ticket #998812: Hi, I am John Smith and my card was declined at 09:05 on 2025-11-30",
        "Ticket #5: hi, I am Li and my card was declined at 23:59 on 1/2/2026",
    ]
    assert len({input_key(asked(text)) for text in same}) == 1
    assert normalised(same[0]) == "ticket <n> hi i am <name> and my card was declined at <n> on <n>"
    other = "Ticket #104233: Hi, I am Maria Lopez and my card never arrived"
    assert input_key(asked(other)) != input_key(asked(same[0]))
    ids = ["order A12B-99 ships to bob@example.com", "order ZX-4410-Q ships to amy@mail.org"]
    assert input_key(asked(ids[0])) == input_key(asked(ids[1]))
    assert input_key(asked("my card")) != input_key(
        DecisionRequest("pick", "which?", tuple(Option(o) for o in ("a", "b")), "my card"))


def test_copies_that_differ_by_case_spacing_or_punctuation_are_one_input() -> None:
    """A label on each of several copies of one message counts once: a copy with "!", "?",
    "...", other spacing or case is the same input (for labels as for drift)."""
    copies = ["My card has not arrived", "my card has not arrived!", "My card has not arrived?",
              "My card  has not arrived...", "MY CARD HAS NOT ARRIVED!!!", " my card, has not arrived "]
    assert len({input_key(asked(text)) for text in copies}) == 1
    assert input_key(asked("my card has arrived")) != input_key(asked(copies[0]))


def test_unsure_messages_never_accepted_buy_audits_only_and_a_novel_class_still_alarms() -> None:
    monitor = Monitor()
    policy = watched_policy(on_alarm="audit_then_escalate", audit_rate=0.05, audit_boost=0.5)
    monitor.watch(policy)
    watch = monitor.watches[policy.policy_id]
    for i in range(2000):  # a campaign: every message distinct, all under the bar
        assert not decide(monitor, policy, 0.55, f"campaign {spelled(i)}")
        if i % 5 == 0:  # templated unsure traffic at 20%: one input
            observe(monitor, policy, 0.6, f"Ticket #{100000 + i}: where is my refund?")
        decide(monitor, policy, 0.98, f"ordinary {spelled(i)}")
    assert watch.alarm is None and watch.drift is not None and watch.drift.log_value < 1.0
    assert watch.n_counted == 2000 + 2000 + 1
    # the traffic as a whole is less sure than the tuning rows: that buys audits, nothing else
    assert watch.traffic_tripped and watch.audit_rate == 0.5
    assert monitor.gate(policy.policy_id) is None
    assert drive_into_drift(monitor, policy) < 200  # accepted answers less sure than tuning


def stuck_audits() -> tuple[Monitor, PolicyFile, asyncio.Event]:
    """A monitor whose audits wait until the event is set (a queue of 2, one worker), watching a
    policy under audit_then_escalate that audits every accepted decision once in doubt."""
    release = asyncio.Event()

    async def stuck(request: DecisionRequest) -> str:
        await release.wait()
        return "a"

    monitor = Monitor(answer=stuck, audit_capacity=2, audit_workers=1)
    policy = watched_policy(on_alarm="audit_then_escalate", audit_rate=0.0, audit_boost=1.0)
    monitor.watch(policy)
    return monitor, policy, release


async def test_missing_audits_under_a_drift_alarm_escalate_until_they_keep_up() -> None:
    monitor, policy, release = stuck_audits()
    pid = policy.policy_id
    watch = monitor.watches[pid]
    drive_into_drift(monitor, policy)  # the traffic test trips first: every accepted is audited
    await asyncio.sleep(0)
    decide(monitor, policy, 0.98, "one more")  # its audit finds the queue full
    assert "drift" in watch.alarms and monitor.audits.counts.dropped >= 1 and watch.audits_short
    assert "too few audits" in str(monitor.gate(pid))
    assert not decide(monitor, policy, 0.98, "escalated, not served unaudited")
    release.set()
    await monitor.audits.join()
    assert decide(monitor, policy, DOUBTFUL, "the queue drained") and not watch.audits_short
    await monitor.aclose()


async def test_missing_audits_after_a_traffic_trip_escalate_until_they_keep_up() -> None:
    """No drift alarm: the traffic detector's trip alone makes audits the evidence."""
    monitor, policy, release = stuck_audits()
    pid = policy.policy_id
    watch = monitor.watches[pid]
    for i in range(2000):  # distinct unsure messages, none accepted: nothing to audit yet
        decide(monitor, policy, 0.55, f"campaign {spelled(i)}")
        if watch.traffic_tripped:
            break
    assert watch.traffic_tripped and not watch.alarms and not watch.audits_short
    assert monitor.gate(pid) is None
    for i in range(4):  # accepted answers, each audited: the stuck queue fills
        decide(monitor, policy, 0.98, f"sure {spelled(i)}")
        await asyncio.sleep(0)
    assert monitor.audits.counts.dropped >= 1 and watch.audits_short
    assert "traffic less sure than the tuning rows and too few audits" in str(monitor.gate(pid))
    assert not decide(monitor, policy, 0.98, "escalated, not served unaudited")
    release.set()
    await monitor.audits.join()
    assert decide(monitor, policy, 0.98, "the queue drained") and not watch.audits_short
    await monitor.aclose()


async def test_under_escalate_all_unsure_traffic_escalates_until_an_operator_clears_it() -> None:
    monitor = Monitor()
    policy = watched_policy(on_alarm="escalate_all")
    monitor.watch(policy)
    pid = policy.policy_id
    watch = monitor.watches[pid]
    for i in range(2000):
        decide(monitor, policy, 0.55, f"campaign {spelled(i)}")
        if watch.traffic_tripped:
            break
    assert watch.traffic_tripped and watch.alarm is None  # no alarm: nothing to share or log
    assert watch.traffic_tripped_at == watch.n_decisions == watch.report()["traffic_tripped_at"]
    assert "traffic less sure" in str(monitor.gate(pid))
    assert not decide(monitor, policy, 0.98, "a confident one")
    assert monitor.clear(pid, at=time.time())  # logged: no alarm stood, the tests start afresh
    assert not watch.traffic_tripped and monitor.gate(pid) is None


def test_the_gate_only_reads_the_watch() -> None:
    monitor = Monitor()
    policy = watched_policy(on_alarm="audit_then_escalate", audit_rate=0.0, audit_boost=0.5)
    monitor.watch(policy)
    pid = policy.policy_id
    watch = monitor.watches[pid]
    drive_into_drift(monitor, policy)
    watch.audits_short = True  # as a dropped audit leaves it; the queue is empty now
    first = monitor.gate(pid)
    assert first is not None and first.startswith("drift alarm and too few audits")
    assert monitor.gate(pid) == first and watch.audits_short  # asking cleared nothing
    assert monitor.snapshot(pid) == WatchSnapshot(
        policy_id=pid, on_alarm="audit_then_escalate", alarms=frozenset({"drift"}),
        traffic_tripped=watch.traffic_tripped, audits_short=True, audit_rate=0.0,
        audit_boost=0.5)
    assert monitor.snapshot("unwatched") is None and monitor.gate("unwatched") is None


async def test_failed_audits_escalate_only_while_the_queue_is_backed_up() -> None:
    """A slow model that fails while a backlog of audits waits switches the policy to
    escalating; the failures drain the queue and switch it back; a failure with the queue
    near empty changes nothing (the next accepted decision is audited again)."""
    release = asyncio.Event()

    async def failing(request: DecisionRequest) -> str:
        await release.wait()
        raise SlowPathTimeout("the slow model is down")

    monitor = Monitor(answer=failing, audit_capacity=4, audit_workers=1)
    policy = watched_policy(on_alarm="audit_then_escalate", audit_rate=0.0, audit_boost=1.0)
    monitor.watch(policy)
    pid = policy.policy_id
    watch = monitor.watches[pid]
    drive_into_drift(monitor, policy)
    for i in range(8):
        decide(monitor, policy, 0.98, f"sure {spelled(i)}")
        await asyncio.sleep(0)
    assert watch.audits_short and "too few audits" in str(monitor.gate(pid))
    release.set()
    await monitor.audits.join()
    assert not watch.audits_short and monitor.gate(pid) is None
    failed = monitor.audits.counts.failed
    assert decide(monitor, policy, 0.98, "after the backlog")  # served and drawn for an audit
    await monitor.audits.join()
    assert monitor.audits.counts.failed == failed + 1 and not watch.audits_short
    await monitor.aclose()
