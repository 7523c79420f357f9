"""What one logged decision costs: in the process (the index /v1/feedback reads, and RSS), on
disk (the JSONL line) and in Redis (the stream entry and the per-decision key). Records have
the demo's shape: 77 BANKING77 intents, their 77 probabilities, a real test.csv message.

Run: python -m bench.decision_log_cost [--n 20000]  ->  bench/results/decision_log_cost.json
(--quick: bench/results/local/)
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gc
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import peers
from bench.common import machine_info, print_table, write_json
from router.store.decision_log import JsonlDecisionLog
from router.store.redis_log import RedisStreamDecisionLog

DATA = Path(os.environ.get("SLOTGATE_DATA_DIR", peers.ROOT.parent / "shared/data/banking77"))


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def demo_records(n: int) -> list[dict[str, Any]]:
    """``n`` records as the routing service writes them for the demo's 77-intent question."""
    with (DATA / "test.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    labels = sorted({r["category"] for r in rows})
    out = []
    for i in range(n):
        row = rows[i % len(rows)]
        proba = [(1.0 + (i * 7 + j) % 13) / 600.0 for j in range(len(labels))]
        out.append({
            "decision_id": "", "time": time.time(), "namespace": "default",
            "question_id": "intent", "signature": "9f" * 32, "fingerprint": "ab" * 32,
            "options": labels, "proba": proba, "text": row["text"], "answer": row["category"],
            "route": "fast", "escalated": False, "probability": 0.93, "raw_probability": 0.81,
            "threshold": 0.62, "policy_id": "banking77@" + "c" * 12, "latency_ms": 1.3,
            "note": None})
    return out


async def measure(records: list[dict[str, Any]], work: Path, redis_url: str | None
                  ) -> dict[str, float]:
    n = len(records)
    path = work / f"{'redis' if redis_url else 'jsonl'}.jsonl"
    jsonl = JsonlDecisionLog(path, max_index=n, max_index_bytes=2**40)
    log: Any = RedisStreamDecisionLog(redis_url, "bench:log", jsonl=jsonl) if redis_url else jsonl
    redis_before = 0
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        client.flushall()
        redis_before = int(client.info("memory")["used_memory"])
    gc.collect()
    rss_start = rss_bytes()
    rss_half = 0
    for i, record in enumerate(records):
        # A fresh id, as the service makes one per decision (the index keeps it).
        await log.append({**record, "decision_id": uuid.uuid4().hex})
        if i % 200 == 199:  # traffic leaves the write-behind task time to send its batches
            await asyncio.sleep(0.003)
        if i + 1 == n // 2:
            if redis_url:
                assert await log.flush()
            gc.collect()
            rss_half = rss_bytes()
    if redis_url:
        assert await log.flush()
    gc.collect()
    rss_end = rss_bytes()
    # The slope over the second half: what each further decision adds once the allocator's
    # one-time growth (connection buffers, the first batches) is behind.
    result = {"index_bytes_estimated": jsonl.index.nbytes / n,
              "rss_bytes_per_decision": (rss_end - rss_half) / (n - n // 2),
              "rss_bytes_first_half": (rss_half - rss_start) / (n // 2),
              "jsonl_bytes": path.stat().st_size / n}
    if redis_url:
        stream = int(client.memory_usage("bench:log") or 0)
        key = next(iter(client.scan_iter("bench:log:decision:*", count=100)))
        result.update(redis_bytes=(int(client.info("memory")["used_memory"]) - redis_before) / n,
                      redis_stream_bytes=stream / n,
                      redis_key_bytes=float(client.memory_usage(key) or 0))
        client.close()
    await log.aclose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="decisions per store")
    parser.add_argument("--quick", action="store_true", help="5,000 decisions")
    args = parser.parse_args()
    n = 5_000 if args.quick else args.n
    records = demo_records(n)
    # (the with statement starts it: a .start() here too started a second redis-server on the
    # same port and lost the first, which outlived every run)
    with tempfile.TemporaryDirectory() as tmp, peers.redis_server(Path(tmp)) as rd:
        jsonl = asyncio.run(measure(records, Path(tmp), None))
        with_redis = asyncio.run(measure(records, Path(tmp), f"redis://127.0.0.1:{rd.port}/0"))
    rows = [
        ("in-process index (estimate it is bounded by)", jsonl["index_bytes_estimated"], "-"),
        ("process RSS, slope over the second half", jsonl["rss_bytes_per_decision"],
         with_redis["rss_bytes_per_decision"]),
        ("process RSS, first half (start-up growth included)", jsonl["rss_bytes_first_half"],
         with_redis["rss_bytes_first_half"]),
        ("JSONL file", jsonl["jsonl_bytes"], with_redis["jsonl_bytes"]),
        ("Redis used_memory", "-", with_redis["redis_bytes"]),
        ("  of which the stream entry", "-", with_redis["redis_stream_bytes"]),
        ("  of which the per-decision key", "-", with_redis["redis_key_bytes"]),
    ]
    print_table(f"bytes per logged decision ({n:,} decisions, 77 options)",
                ["where", "JSONL only", "JSONL + Redis"], rows)
    out = write_json("decision_log_cost.json", {
        "n": n, "jsonl": jsonl, "redis": with_redis, "machine": machine_info()},
        recorded=not args.quick)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
