"""Writes docs/benchmarks.md from the JSON under bench/results/ (never typed by hand): the tables,
the machine each ran on, the command for each, ratios and medians.

    python bench/make_docs.py [--results bench/results] [--out docs/benchmarks.md]"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ANCHOR_LITELLM = ("LiteLLM's published figures: 2-12 ms median and 13-43 ms p99 overhead "
                  "(their proxy on 4-vCPU machines, several instances, against a fake endpoint).")


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()) or "-"
    return "-" if value is None else str(value)


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "|".join(
        " --- " if i == 0 else " ---: " for i in range(len(columns))) + "|\n"
    return head + "".join("| " + " | ".join(fmt(v) for v in row) + " |\n" for row in rows)


def machine(result: dict[str, Any]) -> str:
    m = result.get("machine", {})
    load_start = ", ".join(f"{x:.2f}" for x in m.get("loadavg_at_start", []))
    load_end = ", ".join(f"{x:.2f}" for x in result.get("loadavg_at_end", []))
    return (f"Machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), {m.get('mem_gib')} GiB, "
            f"Python {m.get('python')}; LiteLLM proxy {result.get('litellm_version', '?')}. "
            f"Load average (1/5/15 min) at start {load_start}, at end {load_end}: the machine is "
            f"shared, so read the ratios, measured in the same run with the paths interleaved, "
            f"rather than the absolute numbers. Mode `{result.get('mode')}`, "
            f"{result.get('wall_s')} s wall.\n")


def overhead_section(r: dict[str, Any]) -> str:
    h = r["headline"]
    out = ["## Router overhead (`bench/overhead.py`)\n",
           f"Command: `{r['command']}`\n",
           machine(r),
           ("One instant upstream on loopback (a fixed `chat.completion`). `direct` calls it; "
           "`slotgate_decision` is a JSON-schema enum decision whose fast read is a mock backend "
           "sure of its answer (no upstream call: the router's own cost, every state new so "
           "every read misses the cache); `slotgate_passthrough` is a plain chat through "
           "slotgate's slow path (litellm in-process) to the upstream; `litellm` is the LiteLLM "
           "proxy (one worker, master key, no callbacks) to the upstream. Added = path minus "
           "direct at the same percentile. req/s = median over rounds, closed loop.\n"),
           table(["headline", "value"], [[k, v] for k, v in h.items()]),
           (f"\nslotgate decision overhead p50 {fmt(h['slotgate_p50_ms'])} ms, p99 "
           f"{fmt(h['slotgate_p99_ms'])} ms (target <= 1 ms / <= 3 ms); LiteLLM proxy p50 "
           f"{fmt(h['litellm_p50_ms'])} ms, p99 {fmt(h['litellm_p99_ms'])} ms: "
           f"**{fmt(h['litellm_over_slotgate'], 1)}x** (target >= 5x). {ANCHOR_LITELLM}\n")]
    for conc, res in r["by_concurrency"].items():
        out.append(f"\n### Concurrency {conc}\n\n")
        rows = []
        for name, v in res.items():
            rows.append([name, v["n"], v["p50_ms"], v["p99_ms"], v["added_p50_ms"],
                         v["added_p99_ms"], v["requests_per_s"], v["errors"],
                         v.get("self_reported_overhead_p50_ms")])
        out.append(table(["path", "n", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms",
                          "req/s", "errors", "self-reported overhead p50 ms"], rows))
    if r.get("profile"):
        out.append(profile_section(r["profile"], what="decisions at concurrency 32"))
    return "".join(out)


def profile_section(p: dict[str, Any], *, what: str) -> str:
    def rows(entries: list[dict[str, Any]]) -> list[list[str]]:
        return [[f"`{e['frame']}`", f"{100 * e['share']:.1f}%"] for e in entries]

    return ("\n### Profile of slotgate under this load (py-spy)\n\n"
            f"{p['samples']} samples of the server while busy (py-spy leaves idle waits out), "
            f"taken after the measurement under {what} alone. Self time by package:\n\n"
            + table(["package", "share"], rows(p["self_by_package"]))
            + "\nSelf time (the function on top of the stack):\n\n"
            + table(["function", "share"], rows(p["top_self"]))
            + "\nInclusive time of slotgate's own functions:\n\n"
            + table(["function", "share"], rows(p["top_inclusive_project"])))


def cache_section(r: dict[str, Any]) -> str:
    h = r["headline"]
    out = ["\n## Cache throughput (`bench/cache.py`)\n",
           f"Command: `{r['command']}`\n",
           machine(r),
           (f"{r['n_states']} distinct decisions are sent once to fill the cache, then read "
           "again and again (every read a hit), through slotgate with a private redis-server and "
           "through slotgate with the in-process cache; the LiteLLM proxy's passthrough to the "
           "instant upstream in the same run, interleaved. Headline throughputs are the best "
           "over the concurrencies; ratio = slotgate Redis-hit decisions/s over LiteLLM "
           "passthrough req/s (target >= 3).\n"),
           table(["headline", "value"], [[k, v] for k, v in h.items()])]
    for conc, res in r["by_concurrency"].items():
        out.append(f"\n### Concurrency {conc}\n\n")
        out.append(table(["path", "n", "p50 ms", "p99 ms", "req/s", "errors"],
                         [[k, v["n"], v["p50_ms"], v["p99_ms"], v["requests_per_s"], v["errors"]]
                          for k, v in res.items()]))
    out.append("\n### Redis round trips per decision\n\nDecisions sent one at a time; commands "
               "from `INFO commandstats` deltas, round trips from `total_reads_processed` deltas "
               "(a pipeline is one), less the snapshots' own (target: one round trip for a hit).\n\n")
    out.append(table(["reads", "decisions", "round trips/decision", "commands/decision",
                      "commands", "routes"],
                     [[k, v["decisions"], v.get("round_trips_per_decision"),
                       v["commands_per_decision"], v["commands"], v["routes"]]
                      for k, v in r["round_trips"].items()]))
    if r.get("profile"):
        out.append(profile_section(r["profile"], what="Redis cache hits at concurrency 32"))
    return "".join(out)


def other_section(name: str, r: dict[str, Any]) -> str:
    h = r.get("headline") or {k: v for k, v in r.items() if not isinstance(v, dict | list)}
    return (f"\n## `{name}`\n\n" + (f"Command: `{r['command']}`\n\n" if "command" in r else "")
            + table(["key", "value"], [[k, v] for k, v in h.items()]))


def render(results_dir: Path) -> str:
    parts = ["# Benchmarks\n\n",
             ("Generated by `python bench/make_docs.py` from the JSON under `bench/results/`; "
             "do not edit by hand. Set up the LiteLLM peer once with "
             "`bash bench/setup_litellm_env.sh`.\n\n")]
    found = {p.name: json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))}
    if "overhead.json" in found:
        parts.append(overhead_section(found.pop("overhead.json")))
    if "cache.json" in found:
        parts.append(cache_section(found.pop("cache.json")))
    for name, r in found.items():
        parts.append(other_section(name, r))
    return "".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()
    args.out.write_text(render(args.results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
