"""Load test on loopback: `slotgate serve` (a subprocess) under N concurrent closed-loop clients
for a fixed time, with a mix of OpenAI decisions (cache hits and misses), System One decisions
and passthrough chats to an instant upstream through litellm. Reports throughput, p50/p99 by
kind, every non-2xx by status, and the server's resident memory (VmRSS) after warm-up and at the
end; writes bench/results/load.json; the last stdout line is one JSON object.

    python -m bench.load            # 60 s at 200 clients after a 10 s warm-up
    python -m bench.load --quick    # 15 s at 200 clients after a 5 s warm-up
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import machine_info, summarize, write_json
from bench.peers import slotgate_server, upstream_server

API_KEY = "load-test-key"
OPTIONS = ["card_lost", "card_arrival", "balance", "refund", "other"]
N_STATES = 2_000  # distinct states per surface: the cache fills, then mostly hits
RSS_TOLERANCE = 0.10
KINDS = ("openai_decision", "systemone", "passthrough")


def body_for(i: int) -> tuple[str, str, bytes]:
    """(kind, path, body) of request ``i``: 6 in 10 OpenAI decisions, 2 System One, 2 chats."""
    slot, state = i % 10, f"customer message {(i * 7919) % N_STATES}: my card"
    if slot < 6:
        return KINDS[0], "/v1/chat/completions", json.dumps({
            "model": "m", "messages": [{"role": "user", "content": state}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "intent", "schema": {"type": "string", "enum": OPTIONS}}}}).encode()
    if slot < 8:
        return KINDS[1], "/v1/systemone", json.dumps({
            "state": state, "questions": {"intent": {
                "type": "choice", "criteria": dict.fromkeys(OPTIONS)}}}).encode()
    return KINDS[2], "/v1/chat/completions", json.dumps({
        "model": "openai/standin", "max_tokens": 4,
        "messages": [{"role": "user", "content": f"hello {i}"}]}).encode()


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` from /proc/<pid>/status (VmRSS, KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Tally:
    def __init__(self) -> None:
        self.latencies_ms: dict[str, list[float]] = {k: [] for k in KINDS}
        self.statuses: Counter[str] = Counter()
        self.first_errors: list[str] = []

    def failure(self, what: str) -> None:
        self.statuses[what] += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(what)


async def drive(url: str, *, clients: int, seconds: float, max_requests: int, start: int,
                tally: Tally) -> float:
    """Closed loop: ``clients`` workers send back to back until ``seconds`` or ``max_requests``."""
    import aiohttp

    headers = {"content-type": "application/json", "authorization": f"Bearer {API_KEY}"}
    next_i = start
    deadline = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal next_i
        while next_i < start + max_requests and time.perf_counter() < deadline:
            i, next_i = next_i, next_i + 1
            kind, path, body = body_for(i)
            t0 = time.perf_counter()
            try:
                async with session.post(url + path, data=body, headers=headers) as r:
                    payload = await r.read()
                    status = r.status
            except (TimeoutError, aiohttp.ClientError) as exc:
                tally.failure(f"{kind}: {type(exc).__name__}: {exc}"[:300])
                continue
            if status == 200:
                tally.latencies_ms[kind].append((time.perf_counter() - t0) * 1e3)
                tally.statuses["200"] += 1
            else:
                tally.statuses[str(status)] += 1
                if len(tally.first_errors) < 5:
                    tally.first_errors.append(f"{kind} {status}: {payload[:200]!r}")

    t0 = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(clients)))
    return time.perf_counter() - t0


async def sample_rss(pid: int, samples: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        samples.append(rss_kib(pid))
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            pass


async def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="slotgate-load-"))
    slow = {"model": "openai/standin", "api_base": "", "api_key": "sk-load"}
    settings: dict[str, Any] = {
        # A mock fast read sure of its first option: the router's own cost is what is measured.
        "fast": {"kind": "mock", "options": {"top_proba": 0.97}},
        "policy": {"unscoped": "threshold"},  # no tuned policy: the fallback bar answers fast
        "slow": slow,
        "log": {"decision_log_path": str(workdir / "decisions.jsonl")},
        "api_key_hashes": [hashlib.sha256(API_KEY.encode()).hexdigest()],
    }
    with upstream_server() as upstream:
        slow["api_base"] = f"{upstream.url}/v1"
        with slotgate_server(settings, workdir) as server:
            assert server.proc is not None
            pid = server.proc.pid
            max_requests = int(args.clients * (args.seconds + args.warmup_s) * 100)
            warm = Tally()
            await drive(server.url, clients=args.clients, seconds=args.warmup_s,
                        max_requests=max_requests, start=0, tally=warm)
            rss_warm = rss_kib(pid)
            tally, samples, stop = Tally(), [rss_warm], asyncio.Event()
            sampler = asyncio.create_task(sample_rss(pid, samples, stop))
            elapsed_s = await drive(server.url, clients=args.clients, seconds=args.seconds,
                                    max_requests=max_requests, start=10_000_000, tally=tally)
            stop.set()
            await sampler
            await asyncio.sleep(1.0)  # let the server finish what the clients abandoned
            rss_end = rss_kib(pid)
            log_path = workdir / "decisions.jsonl"
            decisions_logged = 0
            if log_path.exists():
                with log_path.open() as lines:
                    decisions_logged = sum(1 for _ in lines)
    n_ok = tally.statuses["200"]
    shed = tally.statuses["429"]  # our own backpressure: expected under overload, reported
    unexpected = sum(tally.statuses.values()) - n_ok - shed
    all_latencies = [x for v in tally.latencies_ms.values() for x in v]
    growth = (rss_end - rss_warm) / rss_warm
    return {
        "command": "python -m bench.load" + (" --quick" if args.quick else ""),
        "clients": args.clients, "seconds": args.seconds, "warmup_s": args.warmup_s,
        "elapsed_s": round(elapsed_s, 2),
        "requests": sum(tally.statuses.values()), "ok": n_ok, "shed_429": shed,
        "unexpected_errors": unexpected, "statuses": dict(tally.statuses),
        "first_errors": tally.first_errors,
        "requests_per_s": round(n_ok / elapsed_s, 1),
        "latency_ms": {k: summarize(v) for k, v in tally.latencies_ms.items()},
        "p50_ms": summarize(all_latencies)["p50_ms"], "p99_ms": summarize(all_latencies)["p99_ms"],
        "warmup_requests": sum(warm.statuses.values()), "warmup_unexpected": sum(
            v for k, v in warm.statuses.items() if k not in ("200", "429")),
        "rss_mib_after_warmup": round(rss_warm / 1024, 1), "rss_mib_end": round(rss_end / 1024, 1),
        "rss_mib_max": round(max(samples) / 1024, 1), "rss_growth": round(growth, 4),
        "rss_mib_every_s": [round(x / 1024, 1) for x in samples],
        "rss_within_10pct": abs(growth) <= RSS_TOLERANCE,
        "decisions_logged": decisions_logged,
        "ok_overall": unexpected == 0 and abs(growth) <= RSS_TOLERANCE,
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="15 s after a 5 s warm-up")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--warmup-s", type=float, default=None)
    parser.add_argument("--out", default="load.json",
                        help="file name under bench/results/ (--quick: bench/results/local/)")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (15.0 if args.quick else 60.0)
    args.warmup_s = args.warmup_s or (5.0 if args.quick else 10.0)
    result = asyncio.run(run(args))
    path = write_json(args.out, result, recorded=not args.quick)
    summary = {k: result[k] for k in ("clients", "seconds", "requests", "ok", "shed_429",
                                      "unexpected_errors", "requests_per_s", "p50_ms", "p99_ms",
                                      "rss_mib_after_warmup", "rss_mib_end", "rss_growth",
                                      "ok_overall")}
    print(f"wrote {path}", file=sys.stderr)
    print(json.dumps(summary))
    return 0 if result["ok_overall"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
