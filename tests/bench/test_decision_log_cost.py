"""bench/decision_log_cost.py's measurement on 1,000 demo-shaped decisions, JSONL alone and
JSONL + Redis: every store's cost per decision is there, and the in-process index the feedback
route reads costs a fraction of the record it points at."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.decision_log_cost import demo_records, measure


async def test_each_store_reports_its_bytes_per_decision(tmp_path: Path, redis_url: str) -> None:
    records = demo_records(1000)
    assert len(records[0]["options"]) == len(records[0]["proba"]) == 77
    jsonl = await measure(records, tmp_path, None)
    with_redis = await measure(records, tmp_path, redis_url)
    # The same records make the same JSONL lines (77 probabilities and a message each).
    assert jsonl["jsonl_bytes"] == pytest.approx(with_redis["jsonl_bytes"])
    assert 1000 < jsonl["jsonl_bytes"] < 10_000
    for result in (jsonl, with_redis):  # bounded: an id and an offset, not the record
        assert 0 < result["index_bytes_estimated"] < result["jsonl_bytes"] / 4
    assert 0 < with_redis["redis_key_bytes"] < with_redis["jsonl_bytes"]
    # The stream holds the records: most of what Redis's used_memory grew by (MEMORY USAGE
    # samples, used_memory is the allocator's view: they agree only roughly).
    assert with_redis["redis_stream_bytes"] == pytest.approx(with_redis["redis_bytes"], rel=0.5)
