"""What OpenTelemetry tracing costs a decision: bench.overhead's decision path (a sure fast read
by the mock backend, no upstream call) through three `slotgate serve` processes interleaved in
one run, so machine noise falls on all alike: tracing off, tracing on (spans batched over
OTLP/HTTP to the instant upstream, which accepts any POST), and, with ``--before REV``, a commit
without tracing (exported as bench.ab exports it) for the cost of tracing being off.

    python -m bench.tracing_overhead --before 06551b0    (needs the tracing extra for "on")

Writes bench/results/tracing_overhead.json; the last line printed is one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench import ab, common, peers

ROUNDS, PER_ROUND, SEGMENT_S = 8, 400, 4.0
TARGET_OFF_OVER_BASELINE = 1.05  # tracing off: p50 within 5% of the code without tracing


def slotgate_at(tree: Path, settings: dict[str, Any], workdir: Path) -> peers.Server:
    """`slotgate serve` from the checkout at ``tree`` (its own bench/peers.py and code)."""
    port = peers.free_port()
    config = workdir / f"slotgate-{port}.yaml"
    config.write_text(yaml.safe_dump({**settings, "host": "127.0.0.1", "port": port}))
    argv = [sys.executable, str(tree / "bench" / "peers.py"), "slotgate", "--config", str(config),
            "--gc-stats", str(workdir / f"slotgate-{port}.gc.json")]
    return peers.Server(f"slotgate-{port}", argv, port, ready_path="/healthz", cwd=tree,
                        env={"PYTHONPATH": os.pathsep.join(
                            filter(None, (str(tree), os.environ.get("PYTHONPATH"))))},
                        warm_log_marker="start-up heap frozen")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a commit without tracing to compare against")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    peers.use_uvloop()
    api_key = "sk-" + secrets.token_hex(24)
    auth = {"authorization": f"Bearer {api_key}"}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp, \
            contextlib.ExitStack() as stack:
        work = Path(tmp)
        before = ab.export_commit(args.before, work / "before") if args.before else None
        up = stack.enter_context(peers.upstream_server())
        base = common.slotgate_settings(up.url, work, api_key)
        servers = {}
        for name, tree, tracing in (
                ("baseline", before, None),
                ("tracing_off", peers.ROOT, None),
                ("tracing_on", peers.ROOT, {"enabled": True,
                                            "otlp_endpoint": f"{up.url}/v1/traces"})):
            if tree is None:
                continue
            folder = work / name
            folder.mkdir()
            settings = {**base, "log": {"decision_log_path": str(folder / "decisions.jsonl")},
                        **({"tracing": tracing} if tracing else {})}
            servers[name] = stack.enter_context(slotgate_at(Path(tree).resolve(), settings,
                                                            folder))
        paths = [common.Target("direct", f"{up.url}/v1/chat/completions", common.chat_body)] + [
            common.Target(name, f"{s.url}/v1/chat/completions", common.decision_body, auth)
            for name, s in servers.items()]
        stats = asyncio.run(common.interleaved(paths, concurrency=1, rounds=args.rounds,
                                               per_round=PER_ROUND, segment_s=SEGMENT_S,
                                               warmup=100))
    direct = common.summarize(stats["direct"].latencies_ms)["p50_ms"]
    results: dict[str, dict[str, Any]] = {}
    for name, s in stats.items():
        summary = common.summarize(s.latencies_ms)
        results[name] = {**summary, "added_p50_ms": summary["p50_ms"] - direct,
                         "errors": s.errors, "first_error": s.first_error}
    headline: dict[str, Any] = {f"{n}_added_p50_ms": common.finite(r["added_p50_ms"], 3)
                                for n, r in results.items() if n != "direct"}
    off, on = results["tracing_off"]["added_p50_ms"], results["tracing_on"]["added_p50_ms"]
    headline["on_over_off"] = common.finite(on / off, 3)
    if "baseline" in results:
        ratio = off / results["baseline"]["added_p50_ms"]
        headline["off_over_baseline"] = common.finite(ratio, 3)
        headline["off_within_target"] = ratio <= TARGET_OFF_OVER_BASELINE
    payload = {"benchmark": "tracing_overhead", "headline": headline, "results": results,
               "command": "python -m bench.tracing_overhead"
               + (f" --before {args.before}" if args.before else ""),
               "machine": common.machine_info(), "wall_s": round(time.monotonic() - t0, 1)}
    out = common.write_json("tracing_overhead.json", payload)
    common.print_table("decision overhead, concurrency 1 (ms; added = path - direct)",
                       ["path", "n", "p50", "p99", "added p50", "errors"],
                       [[k, v["n"], v["p50_ms"], v["p99_ms"], v["added_p50_ms"], v["errors"]]
                        for k, v in results.items()])
    print(f"wrote {out}", file=sys.stderr)
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
