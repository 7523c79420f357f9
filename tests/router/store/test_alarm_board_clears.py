"""An operator's clear outlives a Redis restart as an alarm does: the replicas that applied it
post it again when Redis lost it, so an alarm re-armed from another replica's log (that replica
was down at the clear) and re-posted does not latch on a fresh replica. A clear record, however
it is posted, ends the policy's alarm keys raised at or before it and keeps those raised after,
so a later alarm of the same kind is posted and latched. Rounds of the sync are run one by one
(``sync_alarms``), so the test waits on nothing."""

from __future__ import annotations

import time

import redis

from router.monitoring.monitor import Monitor
from router.store.alarm_board import RedisAlarmBoard, alarm_key
from router.store.records import AlarmRecord, encode
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


def alarm(pid: str, kind: str, at: float, detail: str = "test alarm") -> AlarmRecord:
    return AlarmRecord(policy_id=pid, kind=kind, decision=5, time=at, detail=detail)


async def test_a_posted_clear_ends_the_alarms_raised_before_it_and_keeps_those_after(
        redis_url: str) -> None:
    pid = watched_policy().policy_id
    now = time.time()
    board = RedisAlarmBoard(redis_url, ttl_s=600)
    try:
        for record in (alarm(pid, "drift", now - 60), alarm(pid, "accuracy", now - 30),
                       alarm(pid, "cost", now + 5)):
            await board.post(record)
        # a clear re-posted by a replica (sync_alarms), not `slotgate alarms clear`
        await board.post(AlarmRecord(policy_id=pid, kind="clear", decision=9, time=now - 30,
                                     detail="cleared by an operator"))
        read = await board.read([pid])
        assert read is not None
        assert {(r.kind, r.time) for r in read} == {("clear", now - 30), ("cost", now + 5)}
        await board.post(alarm(pid, "drift", now - 10, "raised after the clear"))
        read = await board.read([pid])
        assert read is not None
        assert {r.kind: r.detail for r in read}["drift"] == "raised after the clear"
    finally:
        await board.aclose()


async def test_an_alarm_key_the_standing_clear_superseded_gives_way_to_a_later_alarm(
        redis_url: str) -> None:
    pid = watched_policy().policy_id
    now = time.time()
    board = RedisAlarmBoard(redis_url, ttl_s=600)
    client = redis.Redis.from_url(redis_url)
    try:
        await board.clear(pid, now - 30, "test clear")
        # an old alarm written under the clear (a replica posting before it read the clear)
        client.set(alarm_key(pid, "drift"), encode(alarm(pid, "drift", now - 60, "stale")))
        await board.post(alarm(pid, "accuracy", now - 40, "older than the clear"))
        assert client.get(alarm_key(pid, "accuracy")) is None  # superseded: never posted
        await board.post(alarm(pid, "drift", now - 10, "later"))
        await board.post(alarm(pid, "drift", now - 5, "later still"))  # the first one stays
        read = await board.read([pid])
        assert read is not None
        assert {r.kind: r.detail for r in read} == {"clear": "test clear", "drift": "later"}
        # a damaged record has no time to compare: it is left to expire, never overwritten
        client.set(alarm_key(pid, "cost"), b"{not json")
        await board.post(AlarmRecord(policy_id=pid, kind="clear", decision=0, time=now,
                                     detail="again"))
        await board.post(alarm(pid, "cost", now + 1))
        assert client.get(alarm_key(pid, "cost")) == b"{not json"
        assert client.get(alarm_key(pid, "drift")) is None  # "later" was raised before it
    finally:
        client.close()
        await board.aclose()


async def test_a_clear_that_reaches_the_board_only_as_a_replicas_repost_lets_a_later_alarm_latch(
        redis_url: str) -> None:
    """A replica applied a clear from its own log (the clear never reached Redis) and posts it
    in its sync round: the old shared alarm ends, and a later alarm of the same kind raised on
    another replica is posted and latched by a third."""
    policy = watched_policy(on_alarm="escalate_all")
    pid = policy.policy_id
    old = alarm(pid, "drift", time.time() - 60, "old drift")
    boards = [RedisAlarmBoard(redis_url, ttl_s=600) for _ in range(3)]
    a, b, c = Monitor(), Monitor(), Monitor()
    try:
        await boards[0].post(old)
        a.watch(policy)
        a.restore([old, AlarmRecord(policy_id=pid, kind="clear", decision=0,
                                    time=time.time() - 30, detail="cleared, logged only")])
        a.share(boards[0], interval_s=NEVER_S)
        assert await a.sync_alarms() == 0 and a.gate(pid) is None  # it posts its clear
        b.watch(policy)
        b.share(boards[1], interval_s=NEVER_S)
        later = alarm(pid, "drift", time.time(), "later drift")
        await boards[1].post(later)  # what b's monitor posts when it raises one
        c.watch(policy)
        c.share(boards[2], interval_s=NEVER_S)
        assert await c.sync_alarms() == 1
        standing = c.watches[pid].alarms["drift"]
        assert standing.detail == "later drift" and c.gate(pid) is not None
    finally:
        for monitor in (a, b, c):
            await monitor.aclose()
        for board in boards:
            await board.aclose()
