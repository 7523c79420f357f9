"""Alarms that act on the whole fleet: two replicas' monitors on one real private Redis. A drift
alarm raised on replica A is latched by replica B, which then escalates what it would have
accepted, logs the alarm as shared and re-arms it after a restart; a re-tuned policy starts
clean on both; a dead Redis shares nothing and raises nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import redis

from router.monitoring.monitor import Monitor, WatchedPolicy
from router.store.alarm_board import RedisAlarmBoard, alarm_key
from tests.conftest import RedisServer
from tests.router.monitoring.conftest import watched_policy
from tests.router.monitoring.test_monitor import Events, scores


def drive_into_alarm(runtime: WatchedPolicy) -> None:
    for _ in range(200):
        if runtime.watch.alarm is not None:
            return
        runtime.decide(scores(0.55))  # much less confident than the tuning rows
    raise AssertionError("no drift alarm within 200 decisions")


async def until(condition: Any, within_s: float = 5.0) -> None:
    for _ in range(int(within_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_an_alarm_on_one_replica_acts_on_the_other(redis_url: str) -> None:
    policy = watched_policy()
    boards = [RedisAlarmBoard(redis_url, ttl_s=60) for _ in range(2)]
    events_b = Events()
    a, b = Monitor(), Monitor(events=events_b)
    on_a, on_b = a.wrap(policy.runtime(), policy), b.wrap(policy.runtime(), policy)
    a.share(boards[0], interval_s=0.05)
    b.share(boards[1], interval_s=0.05)
    try:
        high = scores(0.98)
        assert on_b.decide(high)[0].accept
        drive_into_alarm(on_a)
        await until(lambda: on_b.watch.alarm is not None)
        verdict, _ = on_b.decide(high)
        assert not verdict.accept and "drift alarm" in verdict.reason
        assert on_b.watch.alarm == on_a.watch.alarm  # the same alarm, not one of B's own
        await until(lambda: any(r["type"] == "alarm" for r in events_b.records))
        [record] = [r for r in events_b.records if r["type"] == "alarm"]
        assert record["shared"] is True and record["policy_id"] == policy.policy_id
        assert await b.sync_alarms() == 0  # latched once
        restarted = Monitor()  # B restarted: its log re-arms the shared alarm
        again = restarted.wrap(policy.runtime(), policy)
        assert restarted.restore(events_b.records) == 1 and not again.decide(high)[0].accept
        retuned = watched_policy(threshold=0.7)  # a new policy id: clean on every replica
        assert b.wrap(retuned.runtime(), retuned).decide(high)[0].accept
        assert await b.sync_alarms() == 0
    finally:
        for monitor in (a, b):
            await monitor.aclose()
        for board in boards:
            await board.aclose()


async def test_the_first_alarm_is_kept_and_damaged_records_are_skipped(redis_url: str) -> None:
    board = RedisAlarmBoard(redis_url, ttl_s=60)
    try:
        first = {"policy_id": "p", "kind": "drift", "decision": 10, "time": 1.0, "detail": "d"}
        await board.post(first)
        await board.post({**first, "kind": "accuracy", "decision": 20})
        assert await board.read(["p", "q"]) == [first]
        client = redis.Redis.from_url(redis_url)
        client.set(alarm_key("q"), b"not json")
        client.set(alarm_key("r"), b'{"policy_id": "r"}')
        client.close()
        assert await board.read(["q", "r"]) == []
    finally:
        await board.aclose()


async def test_a_dead_redis_shares_nothing_and_raises_nothing(tmp_path: Path) -> None:
    board = RedisAlarmBoard(RedisServer(tmp_path).url, ttl_s=60)  # never started
    try:
        await board.post({"policy_id": "p", "kind": "drift", "decision": 1, "time": 1.0,
                          "detail": "d"})
        assert await board.read(["p"]) == []
    finally:
        await board.aclose()
