"""Router overhead: latency slotgate and the LiteLLM proxy add over calling one instant upstream
directly, and the requests/s each path sustains, all paths interleaved in one run.

    python -m bench.overhead --quick      (< 3 min; writes bench/results/overhead.json)
    python -m bench.overhead --profile    (also py-spy's profile of slotgate's decision path)

Paths: direct (the upstream); slotgate_decision (a json_schema enum decision, fast read by a mock
backend sure of its answer: no upstream call, the router's own cost); slotgate_passthrough (a
plain chat through slotgate's slow path, litellm in-process, to the upstream); litellm (the
LiteLLM proxy, one worker, to the upstream). The last line printed is one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common, peers, profiling

# (rounds, requests per path per round, seconds cap per segment) for each concurrency.
QUICK_MEASURE_END_S = 140.0
PROFILE_S = 10.0  # decision-only load while py-spy samples slotgate
PLANS = {
    "quick": {1: (4, 300, 2.5), 32: (3, 3000, 2.0)},
    "full": {1: (8, 1000, 8.0), 32: (5, 10000, 6.0)},
}


def targets(upstream: str, slotgate: str, litellm: str, api_key: str) -> list[common.Target]:
    auth = {"authorization": f"Bearer {api_key}"}
    return [
        common.Target("direct", f"{upstream}/v1/chat/completions", common.chat_body),
        common.Target("slotgate_decision", f"{slotgate}/v1/chat/completions",
                      common.decision_body, auth),
        common.Target("slotgate_passthrough", f"{slotgate}/v1/chat/completions",
                      common.slotgate_chat_body, auth),
        common.Target("litellm", f"{litellm}/v1/chat/completions", common.chat_body, auth,
                      timing_header="x-litellm-overhead-duration-ms"),
    ]


def analyse(stats: dict[str, common.PathStats]) -> dict[str, Any]:
    direct = common.summarize(stats["direct"].latencies_ms)
    out: dict[str, Any] = {}
    for name, s in stats.items():
        summary = common.summarize(s.latencies_ms)
        out[name] = {
            **summary,
            "added_p50_ms": summary["p50_ms"] - direct["p50_ms"],
            "added_p99_ms": summary["p99_ms"] - direct["p99_ms"],
            "requests_per_s": common.median(s.rounds_rps),
            "rounds_rps": s.rounds_rps,
            "errors": s.errors,
            "first_error": s.first_error,
        }
        if s.header_ms:
            out[name]["self_reported_overhead_p50_ms"] = common.median(s.header_ms)
    return out


async def measure(plan: dict[int, tuple[int, int, float]], paths: list[common.Target], *,
                  deadline: float | None) -> dict[str, Any]:
    by_concurrency: dict[str, Any] = {}
    deadlines = common.split_deadlines(deadline, len(plan))
    for k, (concurrency, (rounds, per_round, segment_s)) in enumerate(plan.items()):
        stats = await common.interleaved(paths, concurrency=concurrency, rounds=rounds,
                                         per_round=per_round, segment_s=segment_s,
                                         warmup=max(50, concurrency * 4), deadline=deadlines[k],
                                         index_base=(k + 1) * 10_000_000)
        by_concurrency[str(concurrency)] = analyse(stats)
    return by_concurrency


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller run, < 3 minutes")
    parser.add_argument("--profile", action="store_true", help="run slotgate under py-spy")
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    peers.use_uvloop()
    api_key = "sk-" + secrets.token_hex(24)
    t0 = time.monotonic()
    machine = common.machine_info()
    probe = profiling.gc_probe()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        work = Path(tmp)
        profile = None
        with contextlib.ExitStack() as stack:
            up = stack.enter_context(peers.upstream_server())
            ll = stack.enter_context(peers.litellm_proxy(up.url, work, master_key=api_key))
            settings = common.slotgate_settings(up.url, work, api_key)
            sg = stack.enter_context(peers.slotgate_server(settings, work))
            paths = targets(up.url, sg.url, ll.url, api_key)
            # --quick ends its measurement by QUICK_MEASURE_END_S after start, however loaded
            # the machine is (fewer rounds then), so the whole run stays under 3 minutes.
            deadline = t0 + QUICK_MEASURE_END_S if args.quick else None
            results = asyncio.run(measure(PLANS[mode], paths, deadline=deadline))
            gc_stats = {"slotgate": peers.read_gc_stats(sg)}
            if args.profile:  # after the measurement, so the sampler's CPU never skews it
                assert sg.proc is not None
                decisions = next(p for p in paths if p.name == "slotgate_decision")
                spy = profiling.Profiler(sg.proc.pid, work / "slotgate.collapsed")
                asyncio.run(common.profile_load(decisions, concurrency=32, seconds=PROFILE_S))
                collapsed = spy.stop()
                profile = profiling.profile_top(collapsed) if collapsed else None

    c1, c32 = results["1"], results["32"]
    sg_p50 = c1["slotgate_decision"]["added_p50_ms"]
    ll_p50 = c1["litellm"]["added_p50_ms"]
    headline = {
        "slotgate_p50_ms": common.finite(sg_p50, 3),
        "slotgate_p99_ms": common.finite(c1["slotgate_decision"]["added_p99_ms"], 3),
        "slotgate_passthrough_p50_ms": common.finite(c1["slotgate_passthrough"]["added_p50_ms"], 3),
        "slotgate_passthrough_p99_ms": common.finite(c1["slotgate_passthrough"]["added_p99_ms"], 3),
        "litellm_p50_ms": common.finite(ll_p50, 3),
        "litellm_p99_ms": common.finite(c1["litellm"]["added_p99_ms"], 3),
        # An overhead below the timer's resolution would make the ratio meaningless: floor 0.01 ms.
        "litellm_over_slotgate": common.finite(ll_p50 / max(sg_p50, 0.01), 1),
        "slotgate_decision_rps_c32": common.finite(c32["slotgate_decision"]["requests_per_s"], 1),
        "slotgate_passthrough_rps_c32": common.finite(c32["slotgate_passthrough"]["requests_per_s"], 1),
        "litellm_rps_c32": common.finite(c32["litellm"]["requests_per_s"], 1),
        "direct_rps_c32": common.finite(c32["direct"]["requests_per_s"], 1),
    }
    headline["slotgate_decision_p99_ms_c32"] = common.finite(c32["slotgate_decision"]["p99_ms"], 1)
    payload = {
        "benchmark": "overhead", "mode": mode, "headline": headline, "by_concurrency": results,
        "command": "python -m bench.overhead" + (" --quick" if args.quick else "")
        + (" --profile" if args.profile else ""),
        "machine": machine, "loadavg_at_end": list(__import__("os").getloadavg()),
        "wall_s": round(time.monotonic() - t0, 1), "profile": profile, "slotgate_gc": gc_stats, "gc_probe": probe,
        "litellm_version": peers.litellm_version(),
    }
    out = common.write_json("overhead.json", payload)
    for conc, res in results.items():
        common.print_table(
            f"overhead at concurrency {conc} (ms; added = path - direct)",
            ["path", "n", "p50", "p99", "added p50", "added p99", "req/s", "errors"],
            [[k, v["n"], v["p50_ms"], v["p99_ms"], v["added_p50_ms"], v["added_p99_ms"],
              v["requests_per_s"], v["errors"]] for k, v in res.items()])
    print(f"wrote {out}", file=sys.stderr)
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
