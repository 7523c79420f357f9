"""Before/after: the same decision load through slotgate as of two commits, run side by side,
interleaved round by round, so the shared machine's noise falls on both alike.

    python -m bench.ab --before e15408c [--after WORKTREE] [--quick]   (writes bench/results/ab.json)

The ``--before`` commit is exported with ``git archive`` into a temporary folder (the repository
is not touched) and served by this checkout's virtual environment; the after side is this
working tree. Both get the settings of bench/overhead.py's decision path (mock fast read, slow
model behind litellm to the instant upstream, in-process cache, JSONL decision log) and are
measured once both are past litellm's background import. The last line printed is one JSON
object."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common, peers

ROOT = Path(__file__).resolve().parent.parent
WARM_S = 20.0  # litellm's background import takes 4-10 s on the shared machine
SERVE = "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; " \
        "from router.http.server import serve; serve(config=Path(sys.argv[2]))"


def export_commit(rev: str, dest: Path) -> Path:
    """The tree of ``rev`` under ``dest`` (git archive: no worktree, no checkout)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def slotgate_at(root: Path, upstream: str, work: Path, api_key: str) -> peers.Server:
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    port = peers.free_port()
    cfg = work / "slotgate.yaml"
    cfg.write_text(yaml.safe_dump({**common.slotgate_settings(upstream, work, api_key),
                                   "host": "127.0.0.1", "port": port}))
    return peers.Server(f"slotgate-{root.name}", [sys.executable, "-c", SERVE, str(root), str(cfg)],
                        port, ready_path="/healthz", cwd=root)


async def compare(urls: dict[str, str], api_key: str, *, rounds: int,
                  segment_s: float) -> dict[str, Any]:
    auth = {"authorization": f"Bearer {api_key}"}
    out: dict[str, Any] = {}
    for concurrency in (1, 32):
        latencies: dict[str, list[float]] = {n: [] for n in urls}
        rps: dict[str, list[float]] = {n: [] for n in urls}
        for r in range(rounds):
            order = list(urls) if r % 2 == 0 else list(reversed(urls))  # ABBA
            for name in order:
                target = common.Target(name, f"{urls[name]}/v1/chat/completions",
                                       common.decision_body, auth)
                res = await common.profile_load(target, concurrency=concurrency,
                                                seconds=segment_s)
                latencies[name] += res.latencies_ms
                rps[name].append(res.requests_per_s)
        out[str(concurrency)] = {n: {**common.summarize(latencies[n]),
                                     "requests_per_s": common.median(rps[n]), "rounds_rps": rps[n]}
                                 for n in urls}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare against")
    parser.add_argument("--quick", action="store_true", help="4 rounds of 4 s (< 2 minutes)")
    args = parser.parse_args()
    rounds, segment_s = (4, 4.0) if args.quick else (8, 8.0)
    before_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
                                check=True, capture_output=True, text=True).stdout.strip()
    after_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                               check=True, capture_output=True, text=True).stdout.strip()
    api_key = "sk-" + secrets.token_hex(24)
    t0 = time.monotonic()
    machine = common.machine_info()
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        work = Path(tmp)
        old_root = export_commit(before_rev, work / "before")
        with peers.upstream_server() as up, \
                slotgate_at(old_root, up.url, work / "run-before", api_key) as old, \
                slotgate_at(ROOT, up.url, work / "run-after", api_key) as new:
            time.sleep(WARM_S)
            results = asyncio.run(compare({"before": old.url, "after": new.url}, api_key,
                                          rounds=rounds, segment_s=segment_s))
    headline: dict[str, Any] = {"before_rev": before_rev, "after_rev": after_rev}
    for conc, res in results.items():
        for side in ("before", "after"):
            headline[f"c{conc}_{side}_p50_ms"] = common.finite(res[side]["p50_ms"], 3)
            headline[f"c{conc}_{side}_p99_ms"] = common.finite(res[side]["p99_ms"], 3)
            headline[f"c{conc}_{side}_rps"] = common.finite(res[side]["requests_per_s"], 1)
        headline[f"c{conc}_rps_after_over_before"] = common.finite(
            res["after"]["requests_per_s"] / res["before"]["requests_per_s"], 2)
    payload = {"benchmark": "ab", "headline": headline, "by_concurrency": results,
               "command": "python -m bench.ab --before " + args.before
               + (" --quick" if args.quick else ""),
               "machine": machine, "loadavg_at_end": list(os.getloadavg()),
               "mode": "quick" if args.quick else "full",
               "wall_s": round(time.monotonic() - t0, 1)}
    out = common.write_json("ab.json", payload)
    for conc, res in results.items():
        common.print_table(f"decisions at concurrency {conc}, {before_rev} vs {after_rev} (ms)",
                           ["side", "n", "p50", "p90", "p99", "req/s"],
                           [[k, v["n"], v["p50_ms"], v["p90_ms"], v["p99_ms"], v["requests_per_s"]]
                            for k, v in res.items()])
    print(f"wrote {out}", file=sys.stderr)
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
