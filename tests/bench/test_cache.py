"""bench/cache.py's Redis accounting against a live `slotgate serve`: a decision whose read is
cached costs one round trip on the request path (its MGET), a miss adds its SET pipeline, and
every repeated decision is answered from the cache."""

from __future__ import annotations

import pytest

from bench import common
from bench.cache import hit_body, round_trips, send_sequentially
from tests.bench.conftest import Peers

N = 20


async def test_a_hit_costs_one_round_trip_and_a_miss_two(bench_peers: Peers) -> None:
    url, key = bench_peers.slotgate, bench_peers.api_key
    warm = await send_sequentially(url, [hit_body(i) for i in range(N)], key)
    assert len(warm) == N  # the first sight of each state fills the cache
    trips = await round_trips(url, bench_peers.redis_url, key, n=N)
    hit, miss, burst = trips["hit"], trips["miss"], trips["hit_32_at_a_time"]
    for kind in (hit, miss, burst):
        assert kind["decisions"] == N and sum(kind["routes"].values()) == N
        # The decision log's write-behind batches are the round trips off the request path.
        assert kind["log_batches_per_decision"] == pytest.approx(
            kind["round_trips_per_decision"] - kind["request_path_round_trips_per_decision"])
        assert kind["log_batches_per_decision"] >= 0
    assert hit["routes"] == {"cache": N} == burst["routes"]
    assert hit["request_path_round_trips_per_decision"] == 1.0  # one MGET
    assert hit["cache_reads_per_decision"] == 1.0
    assert miss["routes"] == {"fast": N}  # the mock read is sure of its answer
    assert miss["request_path_round_trips_per_decision"] == 2.0  # MGET, then the SET pipeline
    assert common.decision_body(0) == hit_body(0)  # hits re-send the warmed states


def test_a_connections_unbroken_run_of_cache_sets_is_one_pipeline() -> None:
    """Pipelines are told apart by what the connection sent between them, not by the clock:
    two decisions' SETs 0.9 ms apart are two round trips, one pipeline's two SETs are one."""
    from bench.cache import CommandLog

    key = "slotgate:v1:ns:read:" + "a" * 64
    log = CommandLog.__new__(CommandLog)
    log.commands = [
        ("c1", 1.0000, ["MGET", key]), ("c1", 1.0002, ["SET", key]), ("c1", 1.0003, ["SET", key]),
        ("c2", 1.0004, ["XADD", "slotgate:v1:log"]),
        ("c1", 1.0006, ["MGET", key]), ("c1", 1.0009, ["SET", key]),
    ]
    assert log.cache_round_trips() == 4  # two MGETs, two pipelines
