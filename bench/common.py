"""Benchmark harness shared by bench/overhead.py and bench/cache.py: request bodies, a bounded
async load generator, interleaved rounds across paths (so noise hits all alike), percentiles,
the machine's description, JSON results and tables. The servers themselves: bench/peers.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# SLOTGATE_BENCH_RESULTS moves every result file elsewhere: the benchmarks' smoke test
# (tests/bench/test_entry_points.py) runs them without touching the committed results.
RESULTS_DIR = Path(os.environ.get("SLOTGATE_BENCH_RESULTS") or ROOT / "bench" / "results")
# Results of runs that back no documented figure (a user's --data, a --quick smoke run): git
# ignores this folder, so such a run never overwrites a tracked result.
LOCAL_RESULTS_DIR = RESULTS_DIR / "local"
RECORDED_DIR = RESULTS_DIR  # bench/results/ itself, whatever a test redirects RESULTS_DIR to


def default_data_dir() -> Path:
    """BANKING77's folder: $SLOTGATE_DATA_DIR, else ../shared/data/banking77 beside the checkout."""
    return Path(os.environ.get("SLOTGATE_DATA_DIR") or ROOT.parent / "shared/data/banking77")


def is_default_data(*paths: Path) -> bool:
    """Whether ``paths`` name BANKING77's default folder and nothing else."""
    return [p.resolve() for p in paths] == [default_data_dir().resolve()]


def result_path(name: str, *, recorded: bool) -> Path:
    """Where a benchmark writes ``name`` when no --out is given: bench/results/ for the recorded
    run (the documented command on the default data, whose figures the docs cite), else
    bench/results/local/."""
    return (RESULTS_DIR if recorded else LOCAL_RESULTS_DIR) / name


# ---------------------------------------------------------------- request bodies, settings
MODEL = "standin"
OPTIONS = ["card_lost", "card_arrival", "balance", "refund", "other"]


def chat_body(i: int, *, model: str = MODEL) -> bytes:
    return json.dumps({"model": model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": f"hello number {i}"}]}).encode()


def slotgate_chat_body(i: int) -> bytes:
    """A plain chat for slotgate's passthrough, which takes litellm's model string."""
    return chat_body(i, model=f"openai/{MODEL}")


def decision_body(i: int) -> bytes:
    """A decision whose state is distinct per ``i``: a new ``i`` misses the cache."""
    return json.dumps({
        "model": MODEL,
        "messages": [{"role": "user", "content": f"I lost my card, ticket {i}"}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "intent", "schema": {"type": "string", "enum": OPTIONS}}},
    }).encode()


def slotgate_settings(upstream_url: str, workdir: Path, api_key: str, *,
                      redis_url: str | None = None) -> dict[str, Any]:
    """slotgate's settings for a benchmark: its slow path is our upstream through litellm."""
    return {
        # A mock fast read sure of the first option: a decision costs the router, nothing else.
        "fast": {"kind": "mock", "options": {"top_proba": 0.97}},
        # No policy is tuned for the mock's questions: the fallback threshold answers them fast
        # (policy.unscoped would otherwise escalate every one to the upstream).
        "policy": {"unscoped": "threshold"},
        "slow": {"model": f"openai/{MODEL}", "api_base": f"{upstream_url}/v1",
                 "api_key": "sk-bench"},
        "cache": {"redis_url": redis_url},
        "log": {"decision_log_path": str(workdir / "decisions.jsonl")},
        # The LiteLLM proxy checks a master key on every request; slotgate checks one too.
        "api_key_hashes": [hashlib.sha256(api_key.encode()).hexdigest()],
    }


# ---------------------------------------------------------------- load generation
@dataclass(frozen=True)
class Target:
    """One way to reach the upstream: a name, a URL and a body per request index (bytes, built
    before the clock starts so the client's JSON encoding is not timed)."""

    name: str
    url: str
    body: Callable[[int], bytes]
    headers: dict[str, str] = field(default_factory=dict)
    # A response header holding the server's own timing in ms (LiteLLM's overhead), if any.
    timing_header: str | None = None


@dataclass
class LoadResult:
    latencies_ms: list[float]
    errors: int
    elapsed_s: float
    first_error: str | None = None
    header_ms: list[float] = field(default_factory=list)

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies_ms) / self.elapsed_s if self.elapsed_s > 0 else 0.0


async def run_load(session: Any, path: Target, *, concurrency: int, n_requests: int,
                   max_seconds: float, start_index: int = 0) -> LoadResult:
    """Closed loop: ``concurrency`` workers send requests back to back until ``n_requests`` are
    done or ``max_seconds`` pass. Non-2xx replies count as errors, not latencies. ``session`` is
    an aiohttp ClientSession: httpx's pool tops out near 500 req/s at concurrency 32 on this
    machine (aiohttp: 13,000+), which would measure the client instead of the servers."""
    bodies = [path.body(start_index + i) for i in range(n_requests)]
    headers = {"content-type": "application/json", **path.headers}
    latencies: list[float] = []
    header_ms: list[float] = []
    errors = 0
    first_error: str | None = None
    next_i = 0
    t0 = time.perf_counter()
    deadline = t0 + max_seconds

    async def worker() -> None:
        nonlocal next_i, errors, first_error
        while next_i < n_requests and time.perf_counter() < deadline:
            i = next_i
            next_i += 1
            t = time.perf_counter()
            try:
                async with session.post(path.url, data=bodies[i], headers=headers) as r:
                    payload = await r.read()
                    ok = r.status < 300
                    timing = r.headers.get(path.timing_header) if path.timing_header else None
                if not ok and first_error is None:
                    first_error = f"{r.status}: {payload[:300]!r}"
            except Exception as exc:  # noqa: BLE001 - any failure is counted, the run goes on
                ok, timing = False, None
                if first_error is None:
                    first_error = repr(exc)
            if ok:
                latencies.append((time.perf_counter() - t) * 1000.0)
                if timing is not None:
                    header_ms.append(float(timing))
            else:
                errors += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LoadResult(latencies, errors, time.perf_counter() - t0, first_error, header_ms)


@dataclass
class PathStats:
    latencies_ms: list[float] = field(default_factory=list)
    rounds_rps: list[float] = field(default_factory=list)
    header_ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None


async def interleaved(paths: Sequence[Target], *, concurrency: int, rounds: int,
                      per_round: int, segment_s: float, warmup: int = 50, seed: int = 0,
                      index_base: int = 0, deadline: float | None = None,
                      ) -> dict[str, PathStats]:
    """Runs ``rounds`` rounds; in each, every path gets ``per_round`` requests (at most
    ``segment_s`` seconds) in a shuffled order, so machine noise (other tenants, CPU frequency)
    falls on all paths alike. Request indices start at ``index_base`` (distinct bases keep
    decision states distinct across calls). Past ``deadline`` (time.monotonic()) no further
    round starts, though the first always runs: a loaded machine shortens the run, not the
    bound."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=30.0)
    clients = {p.name: aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) for p in paths}
    stats = {p.name: PathStats() for p in paths}
    rng = random.Random(seed)
    try:
        for p in paths:  # warm connections, JITs of caches, lazy imports on the servers
            await run_load(clients[p.name], p, concurrency=concurrency, n_requests=warmup,
                           max_seconds=segment_s, start_index=index_base + 900_000)
        for r in range(rounds):
            if r > 0 and deadline is not None and time.monotonic() > deadline:
                break
            order = list(paths)
            rng.shuffle(order)
            for p in order:
                res = await run_load(clients[p.name], p, concurrency=concurrency,
                                     n_requests=per_round, max_seconds=segment_s,
                                     start_index=index_base + r * per_round)
                s = stats[p.name]
                s.latencies_ms.extend(res.latencies_ms)
                s.rounds_rps.append(res.requests_per_s)
                s.header_ms.extend(res.header_ms)
                s.errors += res.errors
                s.first_error = s.first_error or res.first_error
    finally:
        for c in clients.values():
            await c.close()
    return stats


def split_deadlines(deadline: float | None, n_parts: int) -> list[float | None]:
    """Evenly spaced intermediate deadlines from now to ``deadline`` (None: no deadline)."""
    if deadline is None:
        return [None] * n_parts
    now = time.monotonic()
    step = max(0.0, deadline - now) / n_parts
    return [now + step * (k + 1) for k in range(n_parts)]


async def profile_load(path: Target, *, concurrency: int, seconds: float) -> LoadResult:
    """Load on one path for ``seconds`` (while a profiler samples the server)."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        return await run_load(session, path, concurrency=concurrency, n_requests=int(seconds * 3000),
                              max_seconds=seconds, start_index=20_000_000)


def summarize(latencies_ms: Sequence[float]) -> dict[str, float]:
    import numpy as np

    if not latencies_ms:
        return {"n": 0, "p50_ms": float("nan"), "p90_ms": float("nan"),
                "p99_ms": float("nan"), "mean_ms": float("nan")}
    a = np.asarray(latencies_ms, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"n": int(a.size), "p50_ms": float(p50), "p90_ms": float(p90),
            "p99_ms": float(p99), "mean_ms": float(a.mean())}


def median(values: Sequence[float]) -> float:
    import numpy as np

    return float(np.median(values)) if values else float("nan")


# ---------------------------------------------------------------- reporting
def machine_info() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    return {"nproc": os.cpu_count(), "cpu_model": cpu, "mem_gib": round(mem_kb / 2**20, 1),
            "loadavg_at_start": list(os.getloadavg()), "python": platform.python_version(),
            "platform": platform.platform()}


def write_json(name: str, payload: dict[str, Any], *, recorded: bool = True) -> Path:
    """``payload`` as JSON at ``result_path(name, recorded=recorded)``; returns the path."""
    import orjson

    out = result_path(name, recorded=recorded)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return out


def save_json(out: Path, payload: dict[str, Any]) -> Path:
    """``payload`` as JSON at ``out`` (a benchmark's --out, or its default under bench/results/,
    which goes through ``write_json``: a test that redirects ``RESULTS_DIR`` redirects it)."""
    if out.parent in (RECORDED_DIR, RESULTS_DIR):
        return write_json(out.name, payload)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    return out


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right" if c != columns[0] else "left")
    for row in rows:
        table.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row))
    Console(stderr=True, width=160).print(table)


def finite(value: float, digits: int = 3) -> float | None:
    """``value`` rounded, or None where it is NaN/inf (no samples): JSON has no NaN."""
    return round(value, digits) if math.isfinite(value) else None
