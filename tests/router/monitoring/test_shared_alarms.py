"""Alarms that act on the whole fleet: two replicas' monitors on one real private Redis. A drift
alarm raised on replica A is latched by replica B, which then escalates what it would have
accepted, logs the alarm as shared and re-arms it after a restart; an operator's clear reaches
both and is not re-armed by a restart; an alarm Redis lost is posted again; a damaged record
costs its own key only, logged once; a dead Redis shares nothing and raises nothing."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from router.monitoring.monitor import Monitor
from router.store.alarm_board import RedisAlarmBoard, alarm_key
from router.store.records import AlarmRecord
from tests.conftest import RedisServer
from tests.router.monitoring.conftest import watched_policy
from tests.router.monitoring.test_monitor import Events, decide, drive_into_drift


async def until(condition: Any, within_s: float = 5.0) -> None:
    for _ in range(int(within_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_an_alarm_on_one_replica_acts_on_the_other_and_a_clear_on_both(
        redis_url: str) -> None:
    policy = watched_policy(on_alarm="escalate_all")
    pid = policy.policy_id
    boards = [RedisAlarmBoard(redis_url, ttl_s=60) for _ in range(3)]
    events_a, events_b = Events(), Events()
    a, b = Monitor(events=events_a), Monitor(events=events_b)
    for monitor, board in ((a, boards[0]), (b, boards[1])):
        monitor.watch(policy)
        monitor.share(board, interval_s=0.05)
    try:
        assert decide(b, policy, 0.98)
        drive_into_drift(a, policy)
        await until(lambda: b.watches[pid].alarm is not None)
        assert not decide(b, policy, 0.98, "sure") and "drift alarm" in str(b.gate(pid))
        assert b.watches[pid].alarm == a.watches[pid].alarm  # the same alarm, not B's own
        await until(lambda: bool(events_b.alarms))
        [record] = events_b.alarms
        assert record.shared is True and record.policy_id == pid
        assert await b.sync_alarms() == 0  # latched once
        restarted = Monitor()  # B restarted: its log re-arms the shared alarm
        restarted.watch(policy)
        assert restarted.restore(events_b.alarms) == 1 and restarted.gate(pid) is not None

        # the operator clears it (what `slotgate alarms clear --redis-url` does): both replicas
        await boards[2].clear(pid, time.time(), "test clear")
        await until(lambda: a.gate(pid) is None and b.gate(pid) is None)
        assert decide(a, policy, 0.98, "after") and decide(b, policy, 0.98, "after")
        await asyncio.sleep(0.2)  # a few more syncs: nobody re-posts the cleared alarm
        assert a.gate(pid) is None and b.gate(pid) is None
        for events in (events_a, events_b):  # logged by each replica: a restart stays clear
            await until(lambda events=events: any(r.kind == "clear" for r in events.alarms))
            again = Monitor()
            again.watch(policy)
            assert again.restore(events.alarms) == 0 and again.gate(pid) is None
        retuned = watched_policy(data_hash="1" * 64)  # a new policy id: clean on every replica
        b.watch(retuned)
        assert b.gate(retuned.policy_id) is None and await b.sync_alarms() == 0
    finally:
        for monitor in (a, b):
            await monitor.aclose()
        for board in boards:
            await board.aclose()


async def test_a_replica_posts_again_an_alarm_redis_lost(redis_url: str) -> None:
    policy = watched_policy(on_alarm="escalate_all")
    pid = policy.policy_id
    a, late = Monitor(), Monitor()
    boards = [RedisAlarmBoard(redis_url, ttl_s=60) for _ in range(2)]
    try:
        a.watch(policy)
        a.share(boards[0], interval_s=0.05)
        drive_into_drift(a, policy)
        client = redis.Redis.from_url(redis_url)
        await until(lambda: client.get(alarm_key(pid, "drift")) is not None)
        client.delete(alarm_key(pid, "drift"))  # as if Redis restarted empty
        await until(lambda: client.get(alarm_key(pid, "drift")) is not None)
        client.close()
        late.watch(policy)  # a replica started after Redis lost it: in alarm like the others
        late.share(boards[1], interval_s=0.05)
        await until(lambda: late.gate(pid) is not None)
    finally:
        for monitor in (a, late):
            await monitor.aclose()
        for board in boards:
            await board.aclose()


async def test_a_damaged_record_costs_its_own_key_only_and_is_logged_once(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    good, bad = watched_policy(), watched_policy(data_hash="3" * 64)
    board = RedisAlarmBoard(redis_url, ttl_s=60)
    monitor = Monitor()
    try:
        first = AlarmRecord(policy_id="p", kind="drift", decision=10, time=1.0, detail="d")
        await board.post(first)
        await board.post(first.model_copy(update={"decision": 20}))  # the first one is kept
        assert await board.read(["p", "q"]) == [first]
        client = redis.Redis.from_url(redis_url)
        client.set(alarm_key(bad.policy_id, "drift"), b'{"policy_id": 7, "kind": "drift"}')
        client.set(alarm_key(bad.policy_id, "accuracy"), b"not json")
        client.set(alarm_key(good.policy_id, "drift"), (
            b'{"policy_id": "%s", "kind": "drift", "decision": 5, "time": %f, "detail": "x"}'
            % (good.policy_id.encode(), time.time())))
        client.close()
        for policy in (good, bad):
            monitor.watch(policy)
        monitor.share(board, interval_s=0.02)
        with caplog.at_level(logging.WARNING, logger="router.store.alarm_board"):
            await until(lambda: monitor.watches[good.policy_id].alarm is not None)
            await asyncio.sleep(0.3)  # ~15 syncs
        assert monitor.watches[bad.policy_id].alarm is None
        damaged = [r for r in caplog.records if "damaged record" in r.getMessage()]
        assert len(damaged) == 1
        assert "policy_id: Input should be a valid string" in damaged[0].getMessage()
    finally:
        await monitor.aclose()
        await board.aclose()


async def test_a_dead_redis_shares_nothing_and_raises_nothing(tmp_path: Path) -> None:
    board = RedisAlarmBoard(RedisServer(tmp_path).url, ttl_s=60)  # never started
    try:
        await board.post(AlarmRecord(policy_id="p", kind="drift", decision=1, time=1.0,
                                     detail="d"))
        assert await board.read(["p"]) is None
    finally:
        await board.aclose()
