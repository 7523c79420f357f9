"""The cost promise's live check beside the accuracy alarm: fed every decision a policy judges
(its own verdict), it finds the promise broken on a stream that escalates past its cap and not
on one within it, counts fixed blocks, hands the routing plan the operator's choice, shows in
/metrics and goes with a retired policy."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from policies.file import PolicyFile
from policies.types import DecisionRequest, Option
from router.backends.mock import MockBackend
from router.monitoring.cost import CostSettings, CostWatch
from router.monitoring.monitor import Monitor
from router.routing.ports import Observation
from router.routing.registry import PolicyRegistry
from router.routing.service import RoutingService
from router.settings import PolicySettings, Settings
from router.store.cache import MemoryCache
from router.store.metrics import Metrics
from tests.router.monitoring.conftest import OPTIONS, spelled, watched_policy
from tests.router.monitoring.test_monitor import request
from tests.router.routing.test_service import ListLog, RecordingSlow

# The slow share promised for each block of 200, the escalation probability past which it fails.
PROMISE = {"share": 0.3, "block": 200, "delta": 0.05, "n": 1000, "n_escalated": 200,
           "escalation_upper": 0.23, "block_bound": 0.04, "live_cap": 0.247,
           "coverage_alone": 0.8}


def promised(**overrides: Any) -> PolicyFile:
    return watched_policy(cost_promise=PROMISE, **overrides)


def feed(monitor: Monitor, policy: PolicyFile, p_escalate: float, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for i, escalated in enumerate(rng.uniform(size=n) < p_escalate):
        monitor.decided(Observation(request(i), f"d{i}", policy.policy_id, 0.9,
                                    not escalated, "a", served_fast=not escalated))


def test_a_stream_past_the_cap_breaks_the_promise_and_hands_the_plan_the_choice() -> None:
    policy = promised(on_cost_alarm="serve_unverified")
    monitor = Monitor(metrics=(metrics := Metrics()))
    monitor.watch(policy)
    assert monitor.cost_alarm(policy.policy_id) is None
    feed(monitor, policy, 0.4, 800, seed=0)
    alarm = monitor.cost_alarm(policy.policy_id)
    assert alarm is not None and alarm.on_cost_alarm == "serve_unverified"
    assert "cost promise broken" in alarm.detail and "0.2470" in alarm.detail
    check = monitor.costs.checks[policy.policy_id]
    assert check.blocks == 4 and check.blocks_over >= 2
    text = metrics.render().decode()
    assert f'slotgate_policy_cost_alarm{{policy="{policy.policy_id}"}} 1.0' in text
    assert "slotgate_policy_slow_share" in text and "slotgate_policy_cost_blocks" in text
    # An operator's clear ends the breach and starts the check afresh (the evidence so far
    # does not re-raise it); the stream past the cap breaks it again.
    assert monitor.clear(policy.policy_id, at=time.time())
    assert monitor.cost_alarm(policy.policy_id) is None
    assert monitor.costs.checks[policy.policy_id].n_decisions == 0
    feed(monitor, policy, 0.4, 800, seed=2)
    assert monitor.cost_alarm(policy.policy_id) is not None
    # A reload that only changes the operator's choice keeps the evidence and the breach.
    monitor.watch(promised(on_cost_alarm="alert_only"))
    again = monitor.cost_alarm(policy.policy_id)
    assert again is not None and again.on_cost_alarm == "alert_only"
    monitor.retire_others([])
    assert monitor.cost_alarm(policy.policy_id) is None
    assert f'slotgate_policy_cost_alarm{{policy="{policy.policy_id}"}}' not in (
        metrics.render().decode())


def test_streams_that_keep_the_promise_do_not_break_it() -> None:
    policy = promised()
    monitor = Monitor()
    monitor.watch(policy)
    feed(monitor, policy, 0.2, 400, seed=1)
    assert monitor.cost_alarm(policy.policy_id) is None
    settings = CostSettings.of(policy)
    assert settings is not None
    alarms = 0
    for seed in range(20):
        check, rng = CostWatch(settings), np.random.default_rng(seed)
        for escalated in rng.uniform(size=1500) < 0.2:
            check.take(bool(escalated))
        alarms += check.alarm is not None
    assert alarms <= 1  # at most alpha 0.05 per stream at the cap itself; 0.2 is below it


def test_a_policy_without_a_cost_promise_has_no_check() -> None:
    policy = watched_policy()
    monitor = Monitor()
    monitor.watch(policy)
    feed(monitor, policy, 1.0, 300, seed=1)
    assert monitor.cost_alarm(policy.policy_id) is None and not monitor.costs.checks


def test_blocks_are_fixed_and_counted_once_full() -> None:
    check = CostWatch(CostSettings(policy_id="p", share=0.5, block=4, live_cap=0.6,
                                   alpha=0.05))
    for escalated in (1, 1, 1, 0, 0, 0, 1, 1, 1, 1):
        check.take(bool(escalated))
    report = check.report()
    assert (report["blocks"], report["blocks_over"]) == (2, 1)  # (3 of 4), (1 of 4); 2 waiting
    assert report["slow_share"] == 0.7


def picked(i: int) -> DecisionRequest:
    """A decision of the question the policy covers (``PICK``)."""
    return DecisionRequest("pick", "", tuple(Option(o) for o in OPTIONS), f"state {spelled(i)}")


async def test_the_service_serves_unverified_once_the_promise_is_broken(tmp_path: Path) -> None:
    """Real registry, monitor and routing service: a read below the policy's threshold goes to
    the slow model while the promise holds, and is served fast, marked unverified, once the
    live check has found it broken (on_cost_alarm: serve_unverified)."""
    backend = MockBackend(lambda request: [0.34, 0.33, 0.33])
    policy = promised(on_cost_alarm="serve_unverified",
                      backend_fingerprint=backend.fingerprint)
    path = tmp_path / "policy.json"
    policy.write(path)
    monitor = Monitor()
    registry = PolicyRegistry.load(PolicySettings(files=[path]),
                                   backend_fingerprint=backend.fingerprint, monitor=monitor)
    slow = RecordingSlow()
    service = RoutingService(
        backend=backend,
        cache=MemoryCache(max_entries=100, ttl_s=60), registry=registry,
        slow=slow, log=ListLog(), metrics=Metrics(), settings=Settings(),  # type: ignore[arg-type]
        monitor=monitor)
    [before] = await service.route([picked(0)], namespace="t")
    assert before.route == "slow" and len(slow.calls) == 1
    for n in range(1, 60):  # every decision escalates: far past the promise's cap
        await service.route([picked(n)], namespace="t")
    assert registry.cost_alarm(registry.loaded()[0].runtime) is not None
    calls = len(slow.calls)
    [after] = await service.route([picked(60)], namespace="t")
    assert (after.route, after.guarantee, after.answer) == ("unverified", None, "a")
    assert after.note is not None and "on_cost_alarm: serve_unverified" in after.note
    assert len(slow.calls) == calls
