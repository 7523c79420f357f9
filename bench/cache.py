"""Cache throughput: decisions/s and p99 when every fast read is a cache hit, with Redis (a private
redis-server) and with the in-process cache, at concurrency 1/32/128, beside the LiteLLM proxy's
passthrough throughput in the same run, interleaved; and Redis commands per decision.

    python -m bench.cache --quick      (< 3 min; writes bench/results/cache.json)

Redis commands per decision are counted from ``INFO commandstats`` deltas around a run of
decisions, round trips in all from the server's socket reads (``total_reads_processed``: a
pipeline counts once). Round trips on the request path are the cache's own calls (MGET, and on a
miss its SET pipeline), told apart by key in a MONITOR of the run (``CommandLog``); the decision
log's EXISTS + SET + XADD go write-behind, batched after the reply.
The last line printed is one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from bench import common, peers, profiling

QUICK_MEASURE_END_S = 140.0
N_STATES = 512  # distinct decisions, warmed once, then read again and again: every read a hit
# (rounds, requests per path per round, seconds cap per segment) for each concurrency.
PLANS = {
    "quick": {1: (3, 1000, 1.2), 32: (3, 4000, 1.2), 128: (3, 4000, 1.2)},
    "full": {1: (5, 5000, 6.0), 32: (5, 20000, 6.0), 128: (5, 20000, 6.0)},
}


def hit_body(i: int) -> bytes:
    return common.decision_body(i % N_STATES)


class RedisCounter:
    """Snapshots of a Redis server's command calls (``INFO commandstats``) and socket reads
    (``total_reads_processed``: one per round trip, a pipeline included), through one
    connection so the snapshots' own cost is a constant that ``overhead_reads`` subtracts."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.snapshot()
        first, second = self.snapshot(), self.snapshot()
        self.overhead_reads = second[1] - first[1]

    def snapshot(self) -> tuple[dict[str, int], int]:
        commands = {k.removeprefix("cmdstat_"): int(v["calls"])
                    for k, v in self.client.info("commandstats").items() if k != "cmdstat_info"}
        return commands, int(self.client.info("stats")["total_reads_processed"])

    def close(self) -> None:
        self.client.close()


async def send_sequentially(url: str, bodies: list[bytes], api_key: str) -> list[dict[str, Any]]:
    import aiohttp

    headers = {"content-type": "application/json", "authorization": f"Bearer {api_key}"}
    replies = []
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            async with session.post(f"{url}/v1/chat/completions", data=body, headers=headers) as r:
                payload = await r.read()
                if r.status >= 300:
                    raise RuntimeError(f"slotgate answered {r.status}: {payload[:300]!r}")
                replies.append({"headers": dict(r.headers), "body": json.loads(payload)})
    return replies


def route_of(reply: dict[str, Any]) -> str:
    """The route slotgate reports (a header or the extra top-level field), for the hit check."""
    for k, v in reply["headers"].items():
        if k.lower() == "x-slotgate-route":
            return str(v)
    extra = reply["body"].get("slotgate") or {}
    return str(extra.get("route", "unknown"))


CACHE_KEY = re.compile(r"^slotgate:v1:[^:]+:(read|slow):")  # router/store/cache.py's keys


class CommandLog:
    """Every command Redis runs while it is open (MONITOR, on a connection of its own): which
    connection sent it, when, and its words. The decision log's keys and the cache's differ, so
    the cache's round trips, the ones a decision waits for, are told apart from the log's
    write-behind batches by key, not guessed from command totals."""

    def __init__(self, url: str) -> None:
        import redis.asyncio

        self._client = redis.asyncio.Redis.from_url(url)
        self.commands: list[tuple[str, float, list[str]]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        started = asyncio.Event()

        async def listen() -> None:
            async with self._client.monitor() as monitor:
                started.set()
                async for entry in monitor.listen():
                    client = f"{entry.get('client_address')}:{entry.get('client_port')}"
                    self.commands.append((client, float(entry["time"]),
                                          str(entry["command"]).split()))

        self._task = asyncio.create_task(listen())
        await asyncio.wait_for(started.wait(), timeout=5)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(0.2)  # the last commands' MONITOR lines are on their way
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._client.aclose()

    def cache_round_trips(self) -> int:
        """The cache's reads (one MGET or GET each) plus its write pipelines. A pipeline holds its
        connection while its commands go out back to back, so one connection's unbroken run of
        cache SETs is one pipeline (not a time window: two pipelines can land within a
        millisecond of each other)."""
        reads = writes = 0
        last_was_set: dict[str, bool] = {}
        for client, _, words in self.commands:
            cache_set = (words[0].upper() == "SET" and len(words) > 1
                         and bool(CACHE_KEY.match(words[1].strip('"'))))
            if cache_set and not last_was_set.get(client, False):
                writes += 1
            last_was_set[client] = cache_set
            if (words[0].upper() in ("MGET", "GET") and len(words) > 1
                    and CACHE_KEY.match(words[1].strip('"'))):
                reads += 1
        return reads + writes


async def round_trips(sg_url: str, redis_url: str, api_key: str, n: int) -> dict[str, Any]:
    """Redis commands and round trips per decision for ``n`` hits (warm states) and ``n``
    misses (new states), sent one at a time so no two decisions share a cache round trip, and
    ``n`` hits sent 32 at a time (the decision log's write-behind batches grow with load)."""
    counter = RedisCounter(redis_url)
    out: dict[str, Any] = {}
    try:
        for kind, bodies, senders in (
                ("hit", [hit_body(i) for i in range(n)], 1),
                ("miss", [common.decision_body(50_000_000 + i) for i in range(n)], 1),
                ("hit_32_at_a_time", [hit_body(i) for i in range(n)], 32)):
            before, reads_before = counter.snapshot()
            async with CommandLog(redis_url) as monitored:
                replies = [reply for part in await asyncio.gather(*(
                    send_sequentially(sg_url, bodies[k::senders], api_key)
                    for k in range(senders))) for reply in part]
                await asyncio.sleep(0.5)  # let any write-behind (decision log, cache set) land
            after, reads_after = counter.snapshot()
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            delta = {k: v for k, v in delta.items() if v}
            routes: dict[str, int] = {}
            for reply in replies:
                routes[route_of(reply)] = routes.get(route_of(reply), 0) + 1
            trips = reads_after - reads_before - counter.overhead_reads
            delta.pop("monitor", None)  # CommandLog's own
            on_path = monitored.cache_round_trips()
            out[kind] = {"decisions": n, "commands": delta, "routes": routes,
                         "commands_per_decision": sum(delta.values()) / n,
                         "round_trips_per_decision": trips / n,
                         "request_path_round_trips_per_decision": on_path / n,
                         "log_batches_per_decision": (trips - on_path) / n,
                         "cache_reads_per_decision": (delta.get("mget", 0) + delta.get("get", 0)) / n}
    finally:
        counter.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller run, < 3 minutes")
    parser.add_argument("--profile", action="store_true",
                        help="then py-spy on slotgate serving Redis hits")
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    peers.use_uvloop()
    api_key = "sk-" + secrets.token_hex(24)
    t0 = time.monotonic()
    machine = common.machine_info()
    print("starting servers (the LiteLLM proxy takes 20-60 s)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        work = Path(tmp)
        with peers.upstream_server() as up, peers.redis_server(work) as rd:
            redis_url = f"redis://127.0.0.1:{rd.port}/0"
            (work / "mem").mkdir()
            with peers.litellm_proxy(up.url, work, master_key=api_key) as ll, \
                    peers.slotgate_server(common.slotgate_settings(
                        up.url, work, api_key, redis_url=redis_url), work) as sg_redis, \
                    peers.slotgate_server(common.slotgate_settings(
                        up.url, work / "mem", api_key), work / "mem") as sg_mem:
                # --quick ends its measurement by QUICK_MEASURE_END_S after start, however
                # loaded the machine is (fewer rounds then), so the run stays under 3 minutes.
                deadline = t0 + QUICK_MEASURE_END_S if args.quick else None
                results, trips = asyncio.run(run_all(PLANS[mode], up.url, sg_redis.url,
                                                     sg_mem.url, ll.url, redis_url, api_key,
                                                     deadline=deadline))
                gc_stats = {"redis": peers.read_gc_stats(sg_redis),
                            "memory": peers.read_gc_stats(sg_mem)}
                profile = None
                if args.profile:  # after the measurement, so the sampler never skews it
                    assert sg_redis.proc is not None
                    spy = profiling.Profiler(sg_redis.proc.pid, work / "slotgate.collapsed")
                    hits = common.Target("hits", f"{sg_redis.url}/v1/chat/completions", hit_body,
                                         {"authorization": f"Bearer {api_key}"})
                    asyncio.run(common.profile_load(hits, concurrency=32, seconds=10.0))
                    collapsed = spy.stop()
                    profile = profiling.profile_top(collapsed) if collapsed else None

    per_conc = {c: {name: v["requests_per_s"] for name, v in r.items()} for c, r in results.items()}
    best = {name: max(r[name] for r in per_conc.values()) for name in next(iter(per_conc.values()))}
    c1 = results["1"]
    headline = {
        "slotgate_decisions_per_s": round(best["slotgate_redis_hit"], 1),
        "slotgate_memory_decisions_per_s": round(best["slotgate_memory_hit"], 1),
        "litellm_passthrough_per_s": round(best["litellm"], 1),
        "ratio": round(best["slotgate_redis_hit"] / best["litellm"], 2),
        # What a hit waits for (target one); _total adds the write-behind log's batches.
        "redis_round_trips_per_decision": round(
            trips["hit"]["request_path_round_trips_per_decision"], 3),
        "redis_round_trips_per_decision_total": round(trips["hit"]["round_trips_per_decision"], 3),
        "redis_round_trips_per_decision_total_32_at_a_time": round(
            trips["hit_32_at_a_time"]["round_trips_per_decision"], 3),
        "redis_cache_reads_per_decision": round(trips["hit"]["cache_reads_per_decision"], 3),
        "redis_commands_per_decision": round(trips["hit"]["commands_per_decision"], 3),
        "redis_round_trips_per_miss": round(
            trips["miss"]["request_path_round_trips_per_decision"], 3),
        "redis_round_trips_per_miss_total": round(trips["miss"]["round_trips_per_decision"], 3),
        "slotgate_redis_hit_p99_ms_c1": round(c1["slotgate_redis_hit"]["p99_ms"], 3),
        "slotgate_memory_hit_p99_ms_c1": round(c1["slotgate_memory_hit"]["p99_ms"], 3),
        "litellm_p99_ms_c1": round(c1["litellm"]["p99_ms"], 3),
    }
    payload = {
        "benchmark": "cache", "mode": mode, "headline": headline, "by_concurrency": results,
        "round_trips": trips, "n_states": N_STATES, "profile": profile, "slotgate_gc": gc_stats,
        "command": "python -m bench.cache" + (" --quick" if args.quick else "")
        + (" --profile" if args.profile else ""),
        "machine": machine, "loadavg_at_end": list(os.getloadavg()),
        "wall_s": round(time.monotonic() - t0, 1), "litellm_version": peers.litellm_version(),
    }
    out = common.write_json("cache.json", payload)
    for conc, res in results.items():
        common.print_table(
            f"cache hits at concurrency {conc} (ms)",
            ["path", "n", "p50", "p99", "req/s", "errors"],
            [[k, v["n"], v["p50_ms"], v["p99_ms"], v["requests_per_s"], v["errors"]]
             for k, v in res.items()])
    common.print_table("Redis per decision",
                       ["reads", "decisions", "round trips on the request path",
                        "round trips in all", "commands", "commands", "routes"],
                       [[k, v["decisions"], v["request_path_round_trips_per_decision"],
                         v["round_trips_per_decision"], v["commands_per_decision"],
                         v["commands"], v["routes"]] for k, v in trips.items()])
    print(f"wrote {out}", file=sys.stderr)
    print(json.dumps(headline))
    return 0


async def run_all(plan: dict[int, tuple[int, int, float]], upstream: str, sg_redis: str,
                  sg_mem: str, litellm: str, redis_url: str, api_key: str, *,
                  deadline: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
    started = time.monotonic()
    warm = [hit_body(i) for i in range(N_STATES)]
    # The first sight of each state fills the cache (16 at a time, both servers at once).
    await asyncio.gather(*(send_sequentially(url, warm[k::16], api_key)
                           for url in (sg_redis, sg_mem) for k in range(16)))
    auth = {"authorization": f"Bearer {api_key}"}
    paths = [
        common.Target("direct", f"{upstream}/v1/chat/completions", common.chat_body),
        common.Target("slotgate_redis_hit", f"{sg_redis}/v1/chat/completions", hit_body, auth),
        common.Target("slotgate_memory_hit", f"{sg_mem}/v1/chat/completions", hit_body, auth),
        common.Target("litellm", f"{litellm}/v1/chat/completions", common.chat_body, auth),
    ]
    results: dict[str, Any] = {}
    print(f"cache filled in {time.monotonic() - started:.1f} s", file=sys.stderr)
    deadlines = common.split_deadlines(deadline, len(plan))
    for k, (concurrency, (rounds, per_round, segment_s)) in enumerate(plan.items()):
        stats = await common.interleaved(paths, concurrency=concurrency, rounds=rounds,
                                         per_round=per_round, segment_s=segment_s,
                                         warmup=max(50, concurrency * 2), deadline=deadlines[k])
        results[str(concurrency)] = {
            name: {**common.summarize(s.latencies_ms), "requests_per_s": common.median(s.rounds_rps),
                   "rounds_rps": s.rounds_rps, "errors": s.errors, "first_error": s.first_error}
            for name, s in stats.items()}
        print(f"concurrency {concurrency} done at {time.monotonic() - started:.1f} s", file=sys.stderr)
    trips = await round_trips(sg_redis, redis_url, api_key, n=100)
    return results, trips


if __name__ == "__main__":
    raise SystemExit(main())
