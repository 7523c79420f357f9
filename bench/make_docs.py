"""Writes docs/benchmarks.md from the JSON under bench/results/ (never typed by hand): the tables,
the machine each ran on, the command for each, ratios, medians and the profile's top costs.

    python -m bench.make_docs [--results bench/results] [--out docs/benchmarks.md]"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ANCHOR_LITELLM = ("LiteLLM's published figures: 2-12 ms median and 13-43 ms p99 overhead "
                  "(their proxy on 4-vCPU machines, several instances, against a fake endpoint).")
OVERHEAD_SETUP = (
    "One instant upstream on loopback (a fixed `chat.completion`, hand-rolled asyncio server). "
    "`direct` calls it; `slotgate_decision` is a JSON-schema enum decision whose fast read is a "
    "mock backend sure of its answer (`fast.kind: mock`, no upstream call: the router's own "
    "cost; every state is new, so every read misses the in-process cache and is logged); "
    "`slotgate_passthrough` is a plain chat through slotgate's slow path (litellm in-process) "
    "to the upstream; `litellm` is the LiteLLM proxy (its own venv, one worker, master key, no "
    "callbacks) to the upstream. slotgate checks an API key too. Added = path minus direct at "
    "the same percentile (an added p99 can come out negative when the machine's noise, not the "
    "path, sets the tail); req/s = median over rounds of a closed loop at that concurrency. The "
    "load generator (aiohttp, same machine) shares the 2 cores with the servers.")
GC_VARIANT = (
    "`slotgate_decision_gc_frozen` (with `--gc-freeze-variant`) is the same decision through a "
    "second slotgate whose process imported litellm and called `gc.freeze()` before serving: "
    "a what-if for moving start-up state out of the collector's reach (slotgate now does this "
    "itself at the end of start-up, router/http/startup_freeze.py).")
CACHE_SETUP = (
    "{n} distinct decisions are sent once to fill the cache, then read again and again (every "
    "read a hit), through slotgate with a private redis-server and through slotgate with the "
    "in-process cache; the LiteLLM proxy's passthrough to the instant upstream in the same run, "
    "interleaved. Headline throughputs are the best over the concurrencies; ratio = slotgate "
    "Redis-hit decisions/s over LiteLLM passthrough req/s (target >= 3).")


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()) or "-"
    return "-" if value is None else str(value)


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "|".join(
        " --- " if i == 0 else " ---: " for i in range(len(columns))) + "|\n"
    return head + "".join("| " + " | ".join(fmt(v) for v in row) + " |\n" for row in rows) + "\n"


def para(*text: str) -> str:
    return "".join(text) + "\n\n"


def machine(result: dict[str, Any]) -> str:
    m = result.get("machine", {})
    load_start = ", ".join(f"{x:.2f}" for x in m.get("loadavg_at_start", []))
    load_end = ", ".join(f"{x:.2f}" for x in result.get("loadavg_at_end", []))
    litellm = (f"; LiteLLM proxy {result['litellm_version']}" if "litellm_version" in result
               else "")
    return para(
        f"Machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), {m.get('mem_gib')} GiB, "
        f"Python {m.get('python')}{litellm}. "
        f"Load average (1/5/15 min) {load_start} at the start"
        + (f" and {load_end} at the end" if load_end else "") + ": the "
        "machine is shared with other engineers' work, so the absolute numbers are noisy; read "
        "the ratios, measured in the same run with the paths interleaved. "
        + (f"Mode `{result['mode']}`, " if result.get("mode") else "")
        + (f"{result['wall_s']} s wall." if result.get("wall_s") is not None else ""))


def overhead_section(r: dict[str, Any]) -> str:
    h = r["headline"]
    out = ["## Router overhead (`bench/overhead.py`)\n\n", para(f"Command: `{r['command']}`"),
           machine(r), para(OVERHEAD_SETUP + (" " + GC_VARIANT if "gc_frozen_p50_ms" in h else "")),
           table(["headline", "value"], [[k, v] for k, v in h.items()]),
           para(f"slotgate decision overhead at concurrency 1: p50 {fmt(h['slotgate_p50_ms'])} ms, "
                f"p99 {fmt(h['slotgate_p99_ms'])} ms (target <= 1 ms / <= 3 ms). LiteLLM proxy: "
                f"p50 {fmt(h['litellm_p50_ms'])} ms, p99 {fmt(h['litellm_p99_ms'])} ms, so "
                f"**{fmt(h['litellm_over_slotgate'], 1)}x** slotgate's p50 (target >= 5x). "
                f"{ANCHOR_LITELLM}")]
    for conc, res in r["by_concurrency"].items():
        out.append(f"### Concurrency {conc}\n\n")
        out.append(table(
            ["path", "n", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "req/s", "errors",
             "LiteLLM's self-reported overhead p50 ms"],
            [[name, v["n"], v["p50_ms"], v["p99_ms"], v["added_p50_ms"], v["added_p99_ms"],
              v["requests_per_s"], v["errors"], v.get("self_reported_overhead_p50_ms")]
             for name, v in res.items()]))
    gc_stats = r.get("slotgate_gc") or {}
    out.append(gc_section(gc_stats if "generations" not in gc_stats else {"slotgate": gc_stats}))
    if r.get("gc_probe") and "error" not in r["gc_probe"]:
        g = r["gc_probe"]
        out.append(para(
            f"What one full collection costs, measured apart (CPU time, so the machine's load "
            f"does not inflate it): a process holding slotgate's modules has "
            f"{g['objects_router_only']:,} tracked objects; importing litellm (which the slow "
            f"path does on first use, {g['litellm_import_s']:.1f} s) brings it to "
            f"{g['objects_with_litellm']:,}, and a full collection then takes "
            f"{g['full_collect_cpu_ms']:.0f} ms of CPU, during which no request moves; after "
            f"`gc.freeze()` it takes {g['full_collect_cpu_ms_after_freeze']:.1f} ms."))
    if r.get("profile"):
        out.append(profile_section(r["profile"], what="decisions at concurrency 32"))
    return "".join(out)


def gc_section(servers: dict[str, Any]) -> str:
    rows = []
    for name, stats in servers.items():
        if not stats:
            continue
        gen2 = stats["generations"]["2"]
        total_ms = sum(g["total_ms"] for g in stats["generations"].values())
        serving = stats.get("serving") or {}
        rows.append([name, gen2["count"], gen2["total_ms"], gen2["max_ms"], total_ms,
                     f"{100 * total_ms / 1000 / stats['wall_s']:.1f}%",
                     serving.get("gen2_count"), serving.get("gen2_total_ms"),
                     serving.get("gen2_max_ms")])
    if not rows:
        return ""
    return ("### Garbage-collector pauses in slotgate\n\n"
            + para("Recorded in the server by a `gc.callbacks` hook (bench/peers.py) over its "
                   "life up to the end of the measurement. A full (gen 2) collection walks every "
                   "live object, litellm's module state included, and stops every request. "
                   "Pauses are wall time: on a loaded machine they include time the process "
                   "waited for a CPU. The last three columns (runs after the PERF fixes) count "
                   "only the gen-2 pauses once the server was started and warm: start-up's, "
                   "while litellm is imported and before the heap is frozen, are left out.")
            + table(["server", "gen-2 collections", "gen-2 total ms", "gen-2 max ms",
                     "all GC ms", "share of wall", "gen-2 while serving", "their total ms",
                     "their max ms"], rows))


def profile_section(p: dict[str, Any], *, what: str) -> str:
    def rows(entries: list[dict[str, Any]]) -> list[list[str]]:
        return [[f"`{e['frame']}`", f"{100 * e['share']:.1f}%"] for e in entries]

    shares = {e["frame"]: e["share"] for e in p["self_by_package"]}
    logging_share = shares.get("logging", 0.0) + shares.get("secret_redaction", 0.0)
    return ("### Profile of slotgate (py-spy)\n\n"
            + para(f"{p['samples']} samples of the server while busy (py-spy leaves idle waits "
                   f"out), taken after the measurement under {what} alone, so the sampler never "
                   "skews the measured numbers. A frame's self time includes any garbage "
                   "collection that its allocations triggered (py-spy does not show GC apart).")
            + para(f"Named top costs: the HTTP stack (uvicorn, starlette, fastapi, pydantic) "
                   f"{100 * sum(shares.get(k, 0.0) for k in ('uvicorn', 'starlette', 'fastapi', 'pydantic')):.0f}%; "
                   f"slotgate's own code (router, policies, calibration) "
                   f"{100 * sum(shares.get(k, 0.0) for k in ('router', 'policies', 'calibration')):.0f}%; "
                   f"stdlib json {100 * shares.get('json', 0.0):.0f}%; the access log and the "
                   f"secret-redaction filter litellm attaches to uvicorn's loggers "
                   f"{100 * logging_share:.0f}%; the event loop (asyncio) "
                   f"{100 * shares.get('asyncio', 0.0):.0f}%.")
            + "Self time by package:\n\n" + table(["package", "share"], rows(p["self_by_package"]))
            + "Self time (the function on top of the stack):\n\n"
            + table(["function", "share"], rows(p["top_self"]))
            + "Inclusive time of slotgate's own functions:\n\n"
            + table(["function", "share"], rows(p["top_inclusive_project"])))


def cache_section(r: dict[str, Any]) -> str:
    h = r["headline"]
    out = ["## Cache throughput (`bench/cache.py`)\n\n", para(f"Command: `{r['command']}`"),
           machine(r), para(CACHE_SETUP.format(n=r["n_states"])),
           table(["headline", "value"], [[k, v] for k, v in h.items()])]
    for conc, res in r["by_concurrency"].items():
        out.append(f"### Concurrency {conc}\n\n")
        out.append(table(["path", "n", "p50 ms", "p99 ms", "req/s", "errors"],
                         [[k, v["n"], v["p50_ms"], v["p99_ms"], v["requests_per_s"], v["errors"]]
                          for k, v in res.items()]))
    out.append("### Redis round trips per decision\n\n")
    out.append(para("Decisions sent one at a time (`hit`, `miss`) or 32 at a time; commands "
                    "from `INFO commandstats` deltas, round trips in all from "
                    "`total_reads_processed` deltas (a pipeline is one), less the snapshots' "
                    "own. On the request path: the cache's own calls (one MGET per read; on a "
                    "miss also one SET pipeline), told apart by key in a MONITOR of the run "
                    "(command totals would count the decision log's per-decision key and "
                    "restart marker as cache SETs); the decision log's EXISTS + SET + XADD are "
                    "written behind the reply, batched (the rest of the round trips). Target: "
                    "one round trip for a hit."))
    out.append(table(["reads", "decisions", "round trips on the request path",
                      "round trips in all", "commands/decision", "commands", "routes"],
                     [[k, v["decisions"], v.get("request_path_round_trips_per_decision"),
                       v.get("round_trips_per_decision"), v["commands_per_decision"],
                       v["commands"], v["routes"]] for k, v in r["round_trips"].items()]))
    out.append(gc_section(r.get("slotgate_gc") or {}))
    if r.get("profile"):
        out.append(profile_section(r["profile"], what="Redis cache hits at concurrency 32"))
    return "".join(out)


def other_section(name: str, r: dict[str, Any]) -> str:
    h = r.get("headline") or {k: v for k, v in r.items() if not isinstance(v, dict | list)}
    return (f"## Other results: `{name}`\n\n"
            + para("Its top-level figures only (another engineer's benchmark; its own doc has "
                   "the full account).")
            + (para(f"Command: `{r['command']}`") if "command" in r else "")
            + table(["key", "value"], [[k, v] for k, v in h.items()]))


def cascade_section(r: dict[str, Any]) -> str:
    """The cost-accuracy frontier (CASCADE's bench/cascade.py): its table, notes, PNG, anchors."""
    def num(value: Any, spec: str = ".4f") -> str:
        return "-" if value is None else format(value, spec)

    rows = []
    for x in r["rows"]:
        live = x.get("live") or {}
        rows.append([x["tier"], x["point"], num(x["threshold"]), num(x["accuracy"]),
                     num(x["accepted_accuracy"]), num(x["escalation_rate"]),
                     num(x["slow_calls_per_1000"], ".0f"), num(live.get("escalation_rate")),
                     num(live.get("mean_ms"), ".1f"), num(live.get("p99_ms"), ".1f")])
    m = r["machine"]
    return ("\n## Cost-accuracy frontier on BANKING77 (`bench/cascade.py`)\n\n"
            + para(f"Command: `{r['command']}`") + para(
                f"Machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), load average "
                f"{m['loadavg_at_start'][0]:.1f} at the start; {r.get('wall_s')} s wall.")
            + "".join(para(note) for note in r["notes"])
            + table(["tier", "point", "threshold", "accuracy", "accepted accuracy",
                     "escalation", "slow calls / 1k", f"live escalation (n={r['n_live']})",
                     "live mean ms", "live p99 ms"], rows)
            + para(f"![cost-accuracy frontier](../{r['png']})")
            + "".join(para(line) for line in r.get("comparison", []))
            + para("Published anchors, not measured here: " + " ".join(r["anchors"])))


def host_path_section(runs: dict[str, Any]) -> str:
    """bench/host_path.py: each labelled run's single read and reads/s by callers, host time."""
    callers = sorted({c for r in runs.values() for c in r["curve"]}, key=int)
    rows = []
    for label, r in runs.items():
        s = r["single_ms"]
        prep = r.get("prepare_onepass") or {}
        rows.append([label, r.get("questions", 1), s["total"], s["host"], s["tokenize"]]
                    + [f"{r['curve'][c]['reads_per_s']:.1f} ({r['curve'][c]['host_ms_per_batch']:.2f})"
                       if c in r["curve"] else "-" for c in callers]
                    + [f"{prep['items_1_ms']:.3f} / {prep['items_32_ms']:.3f}" if prep else "-"])
    first = next(iter(runs.values()))
    return ("\n## The torch backend's host path (`bench/host_path.py`)\n\n"
            + para("The GPU read stood in by a sleep of the H200's measured reader time "
                   f"({first['model_ms']['single']} ms for 1 read, {first['model_ms']['batch32']} ms "
                   "for 32, linear between), so what `TorchBackend.read` adds around it is measured "
                   "on the CPU. Command of the last run: "
                   f"`{list(runs.values())[-1]['command']}`.")
            + machine(first)
            + table(["run", "questions", "single ms", "single host ms", "of which tokenizing"]
                    + [f"{c} callers: reads/s (host ms a batch)" for c in callers]
                    + ["prepare_onepass ms, 1 / 32 items (the reader's own, apart)"], rows))


def render(results_dir: Path) -> str:
    parts = ["# Benchmarks\n\n",
             para("Generated by `python -m bench.make_docs` from the JSON under `bench/results/`; "
                  "do not edit by hand. Set up the LiteLLM peer once with "
                  "`bash bench/setup_litellm_env.sh`; `--profile` needs py-spy (dev extra). "
                  "A run on other data than BANKING77's default folder, or a `--quick` run of a "
                  "benchmark whose figures come from its full run, writes under "
                  "`bench/results/local/` (git-ignored), never over these files. `make test` "
                  "runs each benchmark the README cites at a small size and checks what it "
                  "reports (tests/bench); `make bench-smoke` adds every `--quick` run.")]
    found = {p.name: json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))}
    if "overhead.json" in found:
        parts.append(overhead_section(found.pop("overhead.json")))
    if "cache.json" in found:
        parts.append(cache_section(found.pop("cache.json")))
    if "cascade.json" in found:
        parts.append(cascade_section(found.pop("cascade.json")))
    if "host_path.json" in found:
        parts.append(host_path_section(found.pop("host_path.json")))
    for name, r in found.items():
        parts.append(other_section(name, r))
    return "".join(parts).rstrip() + "\n"


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
