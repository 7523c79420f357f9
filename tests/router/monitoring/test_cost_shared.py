"""A broken cost promise acts on the whole fleet: two replicas' monitors on one real private
Redis, rounds of the sync run one by one (``sync_alarms``), so the test waits on nothing. The
breach replica A finds is latched by replica B, which applies its own ``on_cost_alarm``, logs it
as shared and re-arms it after a restart; an operator's clear (the operator page's, or
`slotgate alarms clear --redis-url`) ends it on both and is not undone by a restart; a breach
Redis lost is posted again; a breach found after a clear stands."""

from __future__ import annotations

import asyncio
import time

import redis

from router.monitoring.monitor import Monitor
from router.store.alarm_board import RedisAlarmBoard, alarm_key
from router.store.records import AlarmRecord
from tests.router.monitoring.test_cost import feed, promised
from tests.router.monitoring.test_monitor import Events

NEVER_S = 3600.0  # the background sync never runs within a test: rounds are called directly
POLICY = promised(on_cost_alarm="serve_unverified")
PID = POLICY.policy_id


async def settle() -> None:
    """Let the monitors' spawned writes (the log's events, the board's post) run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_breach_on_one_replica_acts_on_the_other_and_a_clear_ends_it_on_both(
        redis_url: str) -> None:
    boards = [RedisAlarmBoard(redis_url, ttl_s=600) for _ in range(3)]
    events_a, events_b = Events(), Events()
    a, b = Monitor(events=events_a), Monitor(events=events_b)
    a.watch(POLICY)
    b.watch(promised(on_cost_alarm="alert_only"))  # B's own choice is what B applies
    a.share(boards[0], interval_s=NEVER_S)
    b.share(boards[1], interval_s=NEVER_S)
    try:
        feed(a, POLICY, 0.4, 800, seed=0)  # breaks the promise (and raises a drift alarm)
        await a.sync_alarms()  # A's post is done by the end of its round
        assert a.cost_alarm(PID) is not None and b.cost_alarm(PID) is None
        assert await b.sync_alarms() == 2
        latched = b.cost_alarm(PID)
        assert latched is not None and latched.on_cost_alarm == "alert_only"
        assert latched.detail == a.costs.checks[PID].alarm.detail  # type: ignore[union-attr]
        assert b.costs.checks[PID].n_decisions == 0  # B's own evidence is its own
        assert await b.sync_alarms() == 0  # latched once
        await settle()
        [raised] = [r for r in events_a.alarms if r.kind == "cost"]
        [shared] = [r for r in events_b.alarms if r.kind == "cost"]
        assert (raised.kind, raised.shared, raised.on_alarm) == ("cost", False, "serve_unverified")
        assert (shared.kind, shared.shared) == ("cost", True)
        restarted = Monitor()  # B restarted: its log re-arms the shared breach
        restarted.watch(POLICY)
        assert restarted.restore(events_b.alarms) == 2 and restarted.cost_alarm(PID) is not None

        # the operator clears the policy on replica B's operator page: here, and through Redis
        at = time.time()
        assert b.clear(PID, at)
        await boards[2].clear(PID, at, "cleared on the operator page")
        await a.sync_alarms()
        assert a.cost_alarm(PID) is None and b.cost_alarm(PID) is None
        assert a.costs.checks[PID].n_decisions == 0  # A's check starts afresh
        for _ in range(2):  # nobody posts the cleared breach again
            assert await a.sync_alarms() == 0 and await b.sync_alarms() == 0
        assert a.cost_alarm(PID) is None and b.cost_alarm(PID) is None
        await settle()
        for events in (events_a, events_b):  # each logged the clear: a restart stays clear
            assert events.alarms[-1].kind == "clear"
            again = Monitor()
            again.watch(POLICY)
            assert again.restore(events.alarms) == 0 and again.cost_alarm(PID) is None

        # found again on A after the clear: it stands and is shared, and `slotgate alarms
        # clear --redis-url` (the board's clear) ends it on both, deleting the shared key
        feed(a, POLICY, 0.4, 800, seed=2)
        await a.sync_alarms()
        assert await b.sync_alarms() >= 1 and b.cost_alarm(PID) is not None
        await boards[2].clear(PID, time.time(), "test clear")
        client = redis.Redis.from_url(redis_url)
        assert client.get(alarm_key(PID, "cost")) is None
        client.close()
        await a.sync_alarms()
        await b.sync_alarms()
        assert a.cost_alarm(PID) is None and b.cost_alarm(PID) is None
    finally:
        for monitor in (a, b):
            await monitor.aclose()
        for board in boards:
            await board.aclose()


async def test_a_breach_redis_lost_is_posted_again_and_reaches_a_late_replica(
        redis_url: str) -> None:
    boards = [RedisAlarmBoard(redis_url, ttl_s=600) for _ in range(2)]
    a, late = Monitor(), Monitor()
    a.watch(POLICY)
    a.share(boards[0], interval_s=NEVER_S)
    try:
        feed(a, POLICY, 0.4, 800, seed=0)
        await a.sync_alarms()
        client = redis.Redis.from_url(redis_url)
        assert client.get(alarm_key(PID, "cost")) is not None
        client.delete(alarm_key(PID, "cost"))  # as if Redis restarted empty
        await a.sync_alarms()
        assert client.get(alarm_key(PID, "cost")) is not None
        client.close()
        late.watch(POLICY)
        late.share(boards[1], interval_s=NEVER_S)
        assert await late.sync_alarms() >= 1 and late.cost_alarm(PID) is not None
    finally:
        for monitor in (a, late):
            await monitor.aclose()
        for board in boards:
            await board.aclose()


async def test_a_breach_found_after_a_clear_stands_and_one_before_it_does_not_latch(
        redis_url: str) -> None:
    board = RedisAlarmBoard(redis_url, ttl_s=600)
    monitor = Monitor()
    monitor.watch(POLICY)
    now = time.time()
    try:
        feed(monitor, POLICY, 0.4, 800, seed=0)  # found now
        assert monitor.clear(PID, now - 60)  # a clear made (elsewhere) before it was found
        assert monitor.cost_alarm(PID) is not None
        old = AlarmRecord(policy_id=PID, kind="cost", decision=9, time=now - 120, detail="old")
        fresh = Monitor()
        fresh.watch(POLICY)
        fresh.clear(PID, now - 60)
        await board.post(old)
        fresh.share(board, interval_s=NEVER_S)
        assert await fresh.sync_alarms() == 0 and fresh.cost_alarm(PID) is None
        await fresh.aclose()
    finally:
        await monitor.aclose()
        await board.aclose()
