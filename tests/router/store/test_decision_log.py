"""The decision log: JSONL and Redis-stream round trips, nothing lost when the process is killed
or Redis is down. Its export into predictions: tests/router/tuning/test_log_export.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from router.settings import CacheSettings, LogSettings, Settings
from router.store.decision_log import JsonlDecisionLog, read_records
from router.store.log_factory import make_decision_log
from router.store.records import DecisionView
from router.store.redis_log import RedisStreamDecisionLog
from tests.conftest import ROOT, RedisServer

OPTIONS = ["lost_card", "card_arrival", "exchange_rate"]
# What get() returns of record(i): what feedback and the monitor read, never the text.
VIEW = {"namespace": "default", "options": tuple(OPTIONS), "answer": "lost_card",
        "policy_id": "p@1", "route": "fast", "escalated": False}


def view(decision_id: str) -> DecisionView:
    return DecisionView(decision_id=decision_id, **VIEW)


def record(i: int, *, proba: list[float] | None = None, signature: str = "sig-a",
           options: list[str] | None = None) -> dict[str, Any]:
    return {"decision_id": f"d{i}", "time": 1.0 + i, "namespace": "default",
            "signature": signature, "fingerprint": "fp", "options": options or OPTIONS,
            "proba": proba if proba is not None else [0.7, 0.2, 0.1], "text": f"message {i}",
            "answer": "lost_card", "route": "fast", "policy_id": "p@1", "escalated": False}


async def test_jsonl_round_trip_and_index_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "var" / "decisions.jsonl"
    log = JsonlDecisionLog(path)
    for i in range(3):
        await log.append(record(i))
    await log.add_feedback("d1", "card_arrival", trusted=True)
    assert await log.get("d2") == view("d2")
    assert await log.get("nope") is None
    await log.aclose()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["type"] for r in lines] == ["decision"] * 3 + ["feedback"]
    assert lines[3]["decision_id"] == "d1" and lines[3]["label"] == "card_arrival"
    assert lines[3]["time"] > 0
    reopened = JsonlDecisionLog(path)  # a server restart: recent decisions still found
    assert (await reopened.get("d0")).options == tuple(OPTIONS)  # type: ignore[union-attr]
    await reopened.append(record(9))  # appends after the old records, nothing overwritten
    await reopened.aclose()
    assert len(path.read_text().splitlines()) == 5


async def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    log = JsonlDecisionLog(tmp_path / "d.jsonl", fsync_interval_s=0)
    await asyncio.gather(*(log.append(record(i) | {"text": "x" * 5000}) for i in range(200)))
    await log.aclose()
    ids = [r["decision_id"] for r in read_records(tmp_path / "d.jsonl")]
    assert sorted(ids) == sorted(f"d{i}" for i in range(200))


async def test_fsync_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    every = JsonlDecisionLog(tmp_path / "a.jsonl", fsync_interval_s=0)
    for i in range(3):
        await every.append(record(i))
    assert len(synced) == 3
    await every.aclose()
    assert len(synced) == 4  # and once more on close
    lazy = JsonlDecisionLog(tmp_path / "b.jsonl", fsync_interval_s=3600)
    for i in range(3):
        await lazy.append(record(i))
    assert len(synced) == 4  # written (visible to readers) but not yet fsynced
    assert len(list(read_records(tmp_path / "b.jsonl"))) == 3
    await lazy.aclose()
    assert len(synced) == 5


def test_records_are_on_disk_when_append_returns_even_if_killed(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    script = (
        "import asyncio, sys\n"
        "from router.store.decision_log import JsonlDecisionLog\n"
        "async def main():\n"
        f"    log = JsonlDecisionLog({str(path)!r}, fsync_interval_s=3600)\n"
        "    for i in range(500):\n"
        "        await log.append({'decision_id': f'd{i}', 'options': ['a', 'b'], 'proba': [0.5, 0.5]})\n"
        "    print('appended', flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"appended"
    finally:
        proc.send_signal(signal.SIGKILL)  # no aclose, no flush, no atexit
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert len(list(read_records(path))) == 500


async def test_a_torn_last_line_is_skipped_and_fenced(tmp_path: Path) -> None:
    path = tmp_path / "torn.jsonl"
    path.write_text(json.dumps(record(0)) + "\n" + '{"decision_id": "d1", "opt')
    log = JsonlDecisionLog(path)
    await log.append(record(2))
    await log.aclose()
    assert [r["decision_id"] for r in read_records(path)] == ["d0", "d2"]


async def test_redis_stream_round_trip_and_jsonl_copy(redis_url: str, tmp_path: Path) -> None:
    log = RedisStreamDecisionLog(redis_url, "slotgate:v1:log", jsonl=tmp_path / "d.jsonl",
                                 ttl_s=600)
    await log.append(record(0))
    await log.add_feedback("d0", "card_arrival", trusted=True)
    await log.aclose()
    client = redis.Redis.from_url(redis_url)
    entries = client.xrange("slotgate:v1:log")
    keys = client.keys("slotgate:v1:log:decision:*")
    ttl = client.ttl(keys[0])
    client.close()
    data = [json.loads(fields[b"data"]) for _, fields in entries]
    assert [d["type"] for d in data] == ["decision", "feedback"]
    assert data[0]["decision_id"] == "d0" and data[1]["label"] == "card_arrival"
    assert len(keys) == 1 and b"d0" not in keys[0] and 590 < ttl <= 600
    assert [r["type"] for r in read_records(tmp_path / "d.jsonl")] == ["decision", "feedback"]
    # another process (other JSONL file, empty index) finds the decision through Redis
    other = RedisStreamDecisionLog(redis_url, "slotgate:v1:log", jsonl=tmp_path / "o.jsonl")
    assert await other.get("d0") == view("d0")  # monitoring's facts too
    assert await other.get("d0:\nKEYS *") is None
    await other.aclose()


async def test_redis_writes_happen_behind_append_in_one_batch(redis_url: str,
                                                              tmp_path: Path) -> None:
    """append returns before Redis is touched; the records of one batch window reach Redis in
    one round trip (one pipeline), in order, with the JSONL line already written."""
    log = RedisStreamDecisionLog(redis_url, "s", jsonl=tmp_path / "d.jsonl",
                                 batch_window_s=0.2)
    client = redis.Redis.from_url(redis_url)
    try:
        assert await log.get("unknown") is None  # opens the log's connection (its handshake)
        reads_before = client.info("stats")["total_reads_processed"]
        for i in range(20):
            await log.append(record(i))
        assert len(list(read_records(tmp_path / "d.jsonl"))) == 20
        assert client.xlen("s") == 0  # nothing sent on the requests' path
        polls = 1
        for _ in range(100):
            await asyncio.sleep(0.05)
            polls += 1
            if client.xlen("s") == 20:
                break
        reads_after = client.info("stats")["total_reads_processed"]
        entries = client.xrange("s")
        assert [json.loads(f[b"data"])["decision_id"] for _, f in entries] == [
            f"d{i}" for i in range(20)]
        assert reads_after - reads_before - polls - 1 == 1  # the log's own round trips
        assert (await log.get("d3")).answer == "lost_card"  # type: ignore[union-attr]
    finally:
        await log.aclose()
        client.close()


async def test_redis_down_loses_nothing_and_raises_nothing(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    log = RedisStreamDecisionLog(server.url, "s", jsonl=tmp_path / "d.jsonl")
    try:
        await log.append(record(0))
        server.stop()
        await log.append(record(1))
        await log.add_feedback("d1", "lost_card", trusted=True)
        assert (await log.get("d1")).decision_id == "d1"  # type: ignore[union-attr]
        await log.flush()  # Redis is written behind the request: send the queue now
        assert log.redis_errors >= 2
        server.start()  # restarted empty (no persistence): the JSONL still has everything
        await log.append(record(2))
    finally:
        await log.aclose()
        server.stop()
    kinds = [(r["type"], r["decision_id"]) for r in read_records(tmp_path / "d.jsonl")]
    assert kinds == [("decision", "d0"), ("decision", "d1"), ("feedback", "d1"),
                     ("decision", "d2")]


def test_make_decision_log_picks_by_settings(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    plain = make_decision_log(Settings(log=LogSettings(decision_log_path=path)))
    assert isinstance(plain, JsonlDecisionLog) and plain.path == path
    with_redis = make_decision_log(Settings(
        log=LogSettings(decision_log_path=path, redis_stream="x:log"),
        cache=CacheSettings(redis_url="redis://127.0.0.1:1/0")))
    assert isinstance(with_redis, RedisStreamDecisionLog) and with_redis.stream == "x:log"
    asyncio.run(with_redis.aclose())


async def test_redis_gets_the_record_once(redis_url: str, tmp_path: Path) -> None:
    """The stream holds the full record; the per-decision key only what feedback reads, the
    option list by its hash, so a 900 KB message is stored once."""
    log = RedisStreamDecisionLog(redis_url, "s", jsonl=tmp_path / "d.jsonl")
    message = "x" * 200_000
    await log.append(record(0) | {"text": message})
    assert await log.flush()
    await log.aclose()
    client = redis.Redis.from_url(redis_url)
    [key] = client.keys("s:decision:*")
    value = json.loads(client.get(key))
    options = json.loads(client.get(f"s:options:{value['options_sha256']}"))
    key_bytes = len(client.get(key))
    [(_, fields)] = client.xrange("s")
    client.close()
    assert value.keys() == {"namespace", "answer", "options_sha256", "policy_id", "route",
                            "escalated"} and key_bytes < 250
    assert value["answer"] == "lost_card" and options == OPTIONS
    assert json.loads(fields[b"data"])["text"] == message


async def test_decisions_made_while_redis_was_down_reach_it_later(tmp_path: Path) -> None:
    """A decision logged while Redis is down is sent once it is back (another
    replica then finds it for feedback), and after a restart that lost everything, the keys of
    every decision still in the index are sent again."""
    server = RedisServer(tmp_path)
    server.start()
    log = RedisStreamDecisionLog(server.url, "s", jsonl=tmp_path / "a.jsonl",
                                 retry_interval_s=0.1)
    other = RedisStreamDecisionLog(server.url, "s", jsonl=tmp_path / "b.jsonl")
    try:
        await log.append(record(0))
        assert await log.flush()
        server.stop()
        await log.append(record(1))
        await log.add_feedback("d1", "card_arrival", trusted=True)
        await asyncio.sleep(0.3)  # the flusher tries, fails and keeps them
        assert log.redis_errors >= 3 and log.n_pending == 3  # 2 stream entries, 1 key
        server.start()  # back, and empty: d0's key was lost with the restart
        for _ in range(100):  # no new record needed: the flusher retries by itself
            await asyncio.sleep(0.05)
            if log.n_pending == 0 and await other.get("d0") is not None:
                break
        assert (await other.get("d1")).options == tuple(OPTIONS)  # type: ignore[union-attr]
        assert (await other.get("d0")).answer == "lost_card"  # type: ignore[union-attr]
        client = redis.Redis.from_url(server.url)
        stream = [json.loads(f[b"data"]) for _, f in client.xrange("s")]
        client.close()
        assert [(r["type"], r["decision_id"]) for r in stream] == [
            ("decision", "d1"), ("feedback", "d1")]  # d0's entry went with the restart
    finally:
        await log.aclose()
        await other.aclose()
        server.stop()


async def test_a_restarted_replica_sends_the_keys_it_read_back(redis_url: str,
                                                               tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    first = JsonlDecisionLog(path)
    await first.append(record(0))  # logged while the replica ran without Redis
    await first.aclose()
    log = RedisStreamDecisionLog(redis_url, "s", jsonl=path)
    other = RedisStreamDecisionLog(redis_url, "s", jsonl=tmp_path / "o.jsonl")
    try:
        await log.append(record(1))
        assert await log.flush()
        assert (await other.get("d0")).answer == "lost_card"  # type: ignore[union-attr]
    finally:
        await log.aclose()
        await other.aclose()


async def test_a_full_queue_drops_the_oldest_stream_entries_not_the_keys(tmp_path: Path) -> None:
    log = RedisStreamDecisionLog("redis://127.0.0.1:1/0", "s", jsonl=tmp_path / "d.jsonl",
                                 max_pending_bytes=3_000, retry_interval_s=60)
    try:
        for i in range(20):
            await log.append(record(i) | {"text": "m" * 500})
        assert log.dropped > 0 and log._pending_bytes <= 3_000
        assert log.index.n_unsynced == 20  # the small keys are all still to be sent
    finally:
        await log.aclose()


async def test_damaged_redis_entries_are_skipped_never_raised(redis_url: str,
                                                              tmp_path: Path) -> None:
    """A damaged per-decision key reads as an unknown decision (counted), a damaged stream
    entry is skipped by the reader (counted) and the rest of the stream still reads."""
    import hashlib

    from router.store.log_reader import ReadCounts, read_stream

    log = RedisStreamDecisionLog(redis_url, "dmg", jsonl=tmp_path / "d.jsonl")
    await log.append(record(0))
    assert await log.flush()
    await log.aclose()
    client = redis.Redis.from_url(redis_url)
    try:
        key = f"dmg:decision:{hashlib.sha256(b'd9').hexdigest()}"
        client.set(key, b"[" * 100_000)
        client.xadd("dmg", {"data": b'{"type": "feedback", "decision_id": "d0"}'})  # no label
        client.xadd("dmg", {"data": b'{"type": "feedback", "decision_id": "d0", "label": "x"}'})
    finally:
        client.close()
    other = RedisStreamDecisionLog(redis_url, "dmg", jsonl=tmp_path / "o.jsonl")
    assert await other.get("d9") is None and other.redis_errors == 1
    await other.aclose()
    counts = ReadCounts()
    kinds = [(r.type, r.decision_id) for r in read_stream(redis_url, "dmg", counts=counts)]
    assert kinds == [("decision", "d0"), ("feedback", "d0")] and counts.damaged == 1
