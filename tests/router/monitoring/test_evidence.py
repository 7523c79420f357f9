"""A watch's evidence outlives its process and a retired policy's watch does not: restarts every
50 decisions still reach the drift alarm (the checkpoint beside the decision log carries the
wealth and the ranked confidences), a checkpoint taken on another drift reference is not
resumed, a live server picks up where it stopped, and a live re-tune drops the old policy's
watch, its gauges and its checkpoint; the accuracy test started when traffic turned suspect
resumes too."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from router.http.state import app_state
from router.monitoring.checkpoint import checkpoint_path
from router.monitoring.monitor import Monitor
from router.monitoring.watch import PolicyWatch, WatchSettings
from router.routing.registry import PolicyRegistry
from router.routing.reload import reload_now
from router.settings import PolicySettings
from router.store.metrics import Metrics
from standins.llm import StandinHandle
from tests.router.monitoring.conftest import DOUBTFUL, spelled, watched_policy
from tests.router.monitoring.test_live import ask, start
from tests.router.monitoring.test_monitor import decide


async def test_restarts_every_50_decisions_still_reach_the_drift_alarm(tmp_path: Path) -> None:
    policy = watched_policy(on_alarm="alert_only")
    path = tmp_path / "decisions.jsonl.watch.json"
    alone = Monitor()
    alone.watch(policy)
    n_alone = 0
    while alone.watches[policy.policy_id].alarm is None and n_alone < 400:
        n_alone += 1
        decide(alone, policy, DOUBTFUL, f"d {spelled(n_alone)}")
    n, monitor = 0, None
    while n < 400:
        monitor = Monitor()  # a new process: only the checkpoint carries the evidence
        monitor.watch(policy)
        monitor.keep_checkpoints(path)
        for _ in range(50):
            n += 1
            decide(monitor, policy, DOUBTFUL, f"d {spelled(n)}")
        if monitor.watches[policy.policy_id].alarm is not None:
            break
        await monitor.aclose()  # a graceful stop writes the checkpoint
    assert monitor is not None
    watch = monitor.watches[policy.policy_id]
    assert watch.alarm is not None and watch.alarm.kind == "drift"
    assert n_alone <= n < n_alone + 50 and watch.n_decisions == n
    await monitor.aclose()

    # Re-tuned on other rows under the same id: the old evidence is not resumed.
    other = policy.model_copy(update={"reference": policy.reference.model_copy(  # type: ignore[union-attr]
        update={"confidence": [0.9] * 400})})
    fresh = Monitor()
    fresh.watch(other)
    assert fresh.keep_checkpoints(path) == 0 and fresh.watches[other.policy_id].n_decisions == 0
    await fresh.aclose()


def test_a_live_server_resumes_its_watch_after_a_restart(tmp_path: Path,
                                                        standin: StandinHandle) -> None:
    server, policy_id = start(tmp_path, standin)
    with server:
        for i in range(12):
            ask(server, f"unsure state {spelled(i)}")
        before = app_state(server.app).service.monitor.watches[policy_id].state()
    saved = json.loads(checkpoint_path(tmp_path / "decisions.jsonl").read_text())
    assert saved[policy_id]["decisions"] == 12 and saved[policy_id]["drift"]["n"] == 12
    again, _ = start(tmp_path, standin)
    with again:
        watch = app_state(again.app).service.monitor.watches[policy_id]
        assert watch.n_decisions == 12 and watch.drift is not None and watch.drift.n == 12
        wealth = before["drift"]["log_scale"] + math.log(sum(before["drift"]["wealth"]))
        assert watch.drift.log_value == pytest.approx(wealth) and wealth > 0.5


async def test_a_live_re_tune_drops_the_old_watch_its_gauges_and_its_checkpoint(
        tmp_path: Path) -> None:
    metrics = Metrics()
    monitor = Monitor(metrics=metrics)
    old = watched_policy(on_alarm="escalate_all")
    file = tmp_path / "policy.json"
    old.write(file)
    registry = PolicyRegistry.load(PolicySettings(files=[file]),
                                   backend_fingerprint=old.backend_fingerprint, monitor=monitor)
    for n in range(400):
        decide(monitor, old, DOUBTFUL, f"d {spelled(n)}")
        if monitor.watches[old.policy_id].alarm is not None:
            break
    assert f'slotgate_policy_alarm{{kind="drift",policy="{old.policy_id}"}} 1.0' in (
        metrics.render().decode())
    retuned = watched_policy(on_alarm="escalate_all", data_hash="1" * 64)
    retuned.write(file)
    assert reload_now(registry, "test", metrics)
    assert list(monitor.watches) == [retuned.policy_id]
    text = metrics.render().decode()
    assert old.policy_id not in text and f'policy="{retuned.policy_id}"' in text
    monitor.keep_checkpoints(tmp_path / "watch.json")
    await monitor.aclose()
    assert list(json.loads((tmp_path / "watch.json").read_text())) == [retuned.policy_id]


def test_the_traffic_test_runs_on_through_an_on_alarm_reload_and_its_suspect_test_resumes(
) -> None:
    watch = PolicyWatch(WatchSettings.of(watched_policy(on_alarm="audit_then_escalate")))
    for i in range(10):
        watch.take(0.9, accepted=True, key=str(i), now=0.0)
    watch.update_settings(WatchSettings.of(watched_policy(on_alarm="escalate_all")))
    assert watch.traffic is not None and watch.traffic.n == 10  # one detector for every action
    assert watch.weighted.suspect is None
    for i in range(10, 400):  # unsure traffic trips the detector: the suspect test starts
        watch.take(0.05, accepted=False, key=str(i), now=0.0)
        if watch.traffic_tripped:
            break
    assert watch.traffic_tripped and watch.suspect_from == watch.traffic_tripped_at
    assert watch.audit_rate > 0  # the trip raised it
    for _ in range(3):  # accepted decisions the weighted suspect test bets on
        draw, _ = watch.draw(0.9)
        if draw is not None:
            watch.audited(draw.ticket, False)
    suspect = watch.weighted.suspect
    assert suspect is not None and suspect.n == 3
    resumed = PolicyWatch(WatchSettings.of(watched_policy(on_alarm="escalate_all")))
    assert resumed.resume(json.loads(json.dumps(watch.state())))
    assert resumed.suspect_from == watch.suspect_from and resumed.weighted.suspect is not None
    assert resumed.weighted.suspect.log_value == pytest.approx(suspect.log_value)
    assert resumed.traffic is not None and resumed.traffic.n == watch.traffic.n
