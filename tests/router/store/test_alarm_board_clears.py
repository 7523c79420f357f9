"""An operator's clear outlives a Redis restart as an alarm does: the replicas that applied it
post it again when Redis lost it, so an alarm re-armed from another replica's log (that replica
was down at the clear) and re-posted does not latch on a fresh replica. Rounds of the sync are
run one by one (``sync_alarms``), so the test waits on nothing."""

from __future__ import annotations

import time

import redis

from router.monitoring.monitor import Monitor
from router.store.alarm_board import RedisAlarmBoard
from router.store.records import AlarmRecord
from tests.router.monitoring.conftest import watched_policy

NEVER_S = 3600.0  # the background sync never runs within a test: rounds are called directly


async def test_a_clear_outlives_a_redis_restart(redis_url: str) -> None:
    policy = watched_policy(on_alarm="escalate_all")
    pid = policy.policy_id
    raised = AlarmRecord(policy_id=pid, kind="drift", decision=5, time=time.time() - 60,
                         detail="drift test")
    boards = [RedisAlarmBoard(redis_url, ttl_s=600) for _ in range(4)]
    a, b, c = Monitor(), Monitor(), Monitor()
    try:
        a.watch(policy)
        a.restore([raised])
        a.share(boards[0], interval_s=NEVER_S)
        await boards[3].clear(pid, time.time(), "test clear")  # `slotgate alarms clear`
        await a.sync_alarms()
        assert a.gate(pid) is None

        client = redis.Redis.from_url(redis_url)
        client.flushall()  # Redis restarted empty
        client.close()
        b.watch(policy)  # down at the clear: its log re-arms the alarm, and it posts it again
        b.restore([raised])
        b.share(boards[1], interval_s=NEVER_S)
        await b.sync_alarms()
        await a.sync_alarms()  # a posts again the clear Redis lost

        c.watch(policy)  # a fresh replica: the clear supersedes the re-posted alarm
        c.share(boards[2], interval_s=NEVER_S)
        assert await c.sync_alarms() == 0 and c.gate(pid) is None
        await b.sync_alarms()
        assert b.gate(pid) is None
    finally:
        for monitor in (a, b, c):
            await monitor.aclose()
        for board in boards:
            await board.aclose()
