"""Long run: `slotgate serve` (a subprocess, the instant upstream as its slow model) under closed-
loop clients on one pooled httpx client, as the OpenAI SDK runs, plus "idle" clients that pause
about as long as httpx's pool idle expiry (5 s) between requests, so pooled connections are
reused right when a server with a short keep-alive would close them. Counts every error by
type, samples the server's RSS every 5 s, and writes bench/results/<out> as it goes.

    python -m bench.soak --clients 50 --seconds 1200 --warmup-s 180
    python -m bench.soak --keep-alive-s 5 --seconds 120   # uvicorn's old default: the race
    python -m bench.soak --escalate   # every decision escalates to the stand-in LLM (litellm)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import machine_info, write_json
from bench.load import API_KEY, body_for, rss_kib
from bench.peers import slotgate_server, upstream_server

RSS_FLAT = 0.02  # after warm-up, the last minute's mean RSS within 2% of the first minute's
SAMPLE_S = 5.0


class Soak:
    def __init__(self) -> None:
        self.ok = 0
        self.statuses: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.first_errors: list[str] = []
        self.rss: list[tuple[float, float]] = []  # (seconds since start, MiB)

    def error(self, what: str) -> None:
        self.errors[what.split(":")[0]] += 1
        if len(self.first_errors) < 10:
            self.first_errors.append(what[:300])


def escalated_body(i: int) -> tuple[str, str, bytes]:
    """``body_for``'s mix with a state of its own per request: no cache hit, every decision is
    a slow call (through the claim, its heartbeat and litellm)."""
    kind, path, body = body_for(i)
    if kind == "passthrough":
        return kind, path, body
    return kind, path, body.replace(b"customer message ", f"customer {i} message ".encode())


async def client(http: Any, url: str, soak: Soak, *, deadline: float, seed: int,
                 pause_s: tuple[float, float] | None, escalate: bool = False) -> None:
    import httpx

    rng = random.Random(seed)
    headers = {"content-type": "application/json", "authorization": f"Bearer {API_KEY}"}
    while time.monotonic() < deadline:
        i = rng.randrange(10**9)
        _, path, body = escalated_body(i) if escalate else body_for(i)
        try:
            r = await http.post(url + path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            soak.error(f"{type(exc).__name__}: {exc!r}")
        else:
            if r.status_code == 200:
                soak.ok += 1
            else:
                soak.statuses[str(r.status_code)] += 1
                soak.error(f"status {r.status_code}: {r.text[:200]}")
        if pause_s is not None:
            await asyncio.sleep(rng.uniform(*pause_s))


def flatness(rss: list[tuple[float, float]], *, warmup_s: float) -> dict[str, Any]:
    after = [(t, m) for t, m in rss if t >= warmup_s]
    if len(after) < 4:
        return {"rss_growth": None, "rss_flat": False}
    first = [m for t, m in after if t < after[0][0] + 60] or [after[0][1]]
    last = [m for t, m in after if t > after[-1][0] - 60] or [after[-1][1]]
    growth = statistics.fmean(last) / statistics.fmean(first) - 1
    return {"rss_mib_first_minute_after_warmup": round(statistics.fmean(first), 1),
            "rss_mib_last_minute": round(statistics.fmean(last), 1),
            "rss_mib_max_after_warmup": round(max(m for _, m in after), 1),
            "rss_growth": round(growth, 4), "rss_flat": abs(growth) <= RSS_FLAT}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    workdir = Path(tempfile.mkdtemp(prefix="slotgate-soak-"))
    settings: dict[str, Any] = {
        "fast": {"kind": "mock", "options": {"top_proba": 0.97}},
        "slow": {"model": "openai/standin", "api_base": "", "api_key": "sk-soak"},
        "log": {"decision_log_path": str(workdir / "decisions.jsonl")},
        "api_key_hashes": [hashlib.sha256(API_KEY.encode()).hexdigest()],
    }
    if args.keep_alive_s is not None:
        settings["keep_alive_s"] = args.keep_alive_s
    if args.max_index is not None:
        settings["log"]["max_index"] = args.max_index
        settings["cache"] = {"max_entries": args.max_index}  # bounded within warm-up too
    soak = Soak()
    result: dict[str, Any] = {}
    standin = None
    if args.escalate:  # the stand-in LLM answers decisions with one of their options
        from standins.llm import start_standin

        settings["fast"]["options"]["top_proba"] = 0.5  # below the 0.9 bar: escalated
        settings["policy"] = {"fallback_threshold": 0.9}
        standin = start_standin()
    with upstream_server() as upstream:
        settings["slow"]["api_base"] = standin.api_base if standin else f"{upstream.url}/v1"
        with slotgate_server(settings, workdir) as server:
            assert server.proc is not None
            pid, t0 = server.proc.pid, time.monotonic()
            deadline = t0 + args.seconds
            limits = httpx.Limits(max_connections=args.clients + args.idle_clients)
            async with httpx.AsyncClient(limits=limits, timeout=60.0) as http:  # expiry 5 s
                tasks = [asyncio.create_task(client(
                    http, server.url, soak, deadline=deadline, seed=i, pause_s=None,
                    escalate=args.escalate)) for i in range(args.clients)]
                tasks += [asyncio.create_task(client(
                    http, server.url, soak, deadline=deadline, seed=10_000 + i,
                    pause_s=(4.8, 5.2), escalate=args.escalate)) for i in range(args.idle_clients)]
                next_write = t0 + 60
                while time.monotonic() < deadline:
                    soak.rss.append((round(time.monotonic() - t0, 1), rss_kib(pid) / 1024))
                    if time.monotonic() >= next_write:
                        result = summary(args, soak, time.monotonic() - t0)
                        write_json(args.out, result)
                        next_write += 60
                    await asyncio.sleep(SAMPLE_S)
                await asyncio.gather(*tasks)
            elapsed = time.monotonic() - t0
            soak.rss.append((round(elapsed, 1), rss_kib(pid) / 1024))
            log_tail = server.tail(20_000)
            if standin is not None:
                result_calls = len(standin.calls())
                standin.stop()
    result = summary(args, soak, elapsed)
    if standin is not None:
        result["standin_calls"] = result_calls
    result["server_log_errors"] = [line for line in log_tail.splitlines()
                                   if " ERROR " in line or "Traceback" in line][:20]
    return result


def summary(args: argparse.Namespace, soak: Soak, elapsed_s: float) -> dict[str, Any]:
    n_errors = sum(soak.errors.values())
    return {
        "command": "python -m bench.soak " + " ".join(sys.argv[1:]),
        "clients": args.clients, "idle_clients": args.idle_clients, "escalate": args.escalate,
        "keep_alive_s": args.keep_alive_s or "default", "max_index": args.max_index or "default",
        "seconds": round(elapsed_s, 1),
        "warmup_s": args.warmup_s, "ok": soak.ok, "errors": n_errors,
        "errors_by_type": dict(soak.errors), "first_errors": soak.first_errors,
        "non_200": dict(soak.statuses), "requests_per_s": round(soak.ok / max(elapsed_s, 1e-9), 1),
        **flatness(soak.rss, warmup_s=args.warmup_s),
        "rss_mib_every_5s": [round(m, 1) for _, m in soak.rss],
        "ok_overall": n_errors == 0 and flatness(soak.rss, warmup_s=args.warmup_s)["rss_flat"],
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50, help="closed-loop clients")
    parser.add_argument("--idle-clients", type=int, default=10,
                        help="clients pausing 4.8-5.2 s between requests")
    parser.add_argument("--seconds", type=float, default=1200.0)
    parser.add_argument("--warmup-s", type=float, default=180.0)
    parser.add_argument("--keep-alive-s", type=int, default=None,
                        help="the server's keep_alive_s (default: the setting's default)")
    parser.add_argument("--max-index", type=int, default=None,
                        help="log.max_index: the decision index fills (and stops growing) "
                             "within warm-up when small")
    parser.add_argument("--escalate", action="store_true",
                        help="every decision escalates to the stand-in LLM (standins/llm.py)")
    parser.add_argument("--out", default="soak.json", help="file name under bench/results/")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    path = write_json(args.out, result)
    print(f"wrote {path}", file=sys.stderr)
    print(json.dumps({k: v for k, v in result.items() if k not in ("rss_mib_every_5s", "machine")}))
    return 0 if result["ok_overall"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
