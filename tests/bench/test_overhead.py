"""bench/overhead.py's measurement at a tiny size against a live `slotgate serve` and the
instant upstream (the LiteLLM proxy's path is the quick run's, under `make bench-smoke`): every
path answers without an error, and what slotgate adds is measured against the direct path."""

from __future__ import annotations

import pytest

from bench import overhead
from tests.bench.conftest import Peers

PLAN = {1: (2, 40, 10.0), 8: (1, 120, 10.0)}  # (rounds, requests per path a round, cap s)


async def test_every_path_answers_and_slotgate_adds_to_the_direct_path(bench_peers: Peers) -> None:
    paths = [p for p in overhead.targets(bench_peers.upstream, bench_peers.slotgate, "unused",
                                         bench_peers.api_key) if p.name != "litellm"]
    result = await overhead.measure(PLAN, paths, deadline=None)
    assert set(result) == {"1", "8"}
    for concurrency, (rounds, per_round, _) in PLAN.items():
        by_path = result[str(concurrency)]
        assert set(by_path) == {"direct", "slotgate_decision", "slotgate_passthrough"}
        direct = by_path["direct"]
        assert direct["added_p50_ms"] == 0.0
        for name, path in by_path.items():
            assert path["errors"] == 0 and path["first_error"] is None, (name, path)
            assert path["n"] == rounds * per_round and path["requests_per_s"] > 0
            assert 0 < path["p50_ms"] <= path["p99_ms"]
            assert path["added_p50_ms"] == pytest.approx(path["p50_ms"] - direct["p50_ms"])
        # A decision and a passthrough each do more than the upstream's instant reply.
        assert by_path["slotgate_passthrough"]["p50_ms"] > direct["p50_ms"]
