"""The live half of the cascade benchmark: `slotgate serve` (one process per fast tier) in front of
the stand-in LLM (its own process, answering with the MiniLM model) through litellm, on loopback.

Every operating point of a tier is served by the same proxy, selected per request with
``"slotgate": {"policy": NAME}``, and has its own API key, hence its own cache namespace: no
point reuses another's cached reads. The configurations are interleaved message by message and
sent one at a time, so each latency is one decision's, end to end, as the client saw it.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Point:
    """One operating point to send: a policy name on the proxy and the key of its namespace."""

    label: str
    policy: str

    @property
    def api_key(self) -> str:
        return f"sk-cascade-{self.label}"


@contextmanager
def process(cmd: Sequence[str], *, port: int, log: Path, ready_path: str,
            timeout_s: float = 120.0) -> Iterator[str]:
    """Start ``cmd`` (output to ``log``), wait until ``ready_path`` answers 200, stop it after."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    with log.open("w") as sink:
        proc = subprocess.Popen(list(cmd), cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    sys.exit(f"{cmd[0]} exited ({proc.returncode}) at start-up; see {log}")
                try:
                    if httpx.get(url + ready_path, timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit(f"{' '.join(cmd[:3])} not ready after {timeout_s} s; see {log}")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()  # SIGTERM: slotgate drains and flushes its decision log
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def standin(model: Path, work: Path) -> Any:
    from bench.live import free_port

    port = free_port()
    return process([sys.executable, str(ROOT / "standins/llm.py"), "--port", str(port),
                    "--model", str(model)], port=port, log=work / "standin.log",
                   ready_path="/v1/models")


def proxy(*, kind: str, model: Path, policies: Sequence[Path], points: Sequence[Point],
          standin_url: str, work: Path) -> Any:
    """`slotgate serve` with a YAML config: this fast tier, every policy, the stand-in as the
    slow model (litellm ``openai/`` provider), the in-process cache, one API key per point."""
    import yaml

    from bench.live import free_port

    port = free_port()
    config = {
        "host": "127.0.0.1", "port": port,
        "api_key_hashes": [hashlib.sha256(p.api_key.encode()).hexdigest() for p in points],
        # A generous read timeout: on a loaded machine a timed-out read would escalate and
        # count as the policy's escalation.
        "fast": {"kind": "sklearn" if kind == "tfidf" else "embedding",
                 "model_path": str(model), "timeout_s": 10.0},
        "policy": {"files": [str(p) for p in policies], "default": points[0].policy},
        "slow": {"model": "openai/standin", "api_base": f"{standin_url}/v1",
                 "api_key": "sk-standin-cascade", "timeout_s": 60},
        "cache": {"redis_url": None, "namespace": f"cascade-{kind}"},
        "log": {"decision_log_path": str(work / f"decisions-{kind}.jsonl")},
    }
    path = work / f"slotgate-{kind}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    exe = Path(sys.executable).parent / "slotgate"
    return process([str(exe), "serve", "--config", str(path)], port=port,
                   log=work / f"slotgate-{kind}.log", ready_path="/readyz")


def decision_body(text: str, labels: Sequence[str], policy: str) -> dict[str, Any]:
    return {"model": "banking77", "messages": [{"role": "user", "content": text}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "intent", "schema": {"type": "string", "enum": list(labels)}}},
            "slotgate": {"policy": policy}}


def send_interleaved(url: str, texts: Sequence[str], labels: Sequence[str],
                     points: Sequence[Point]) -> dict[str, list[dict[str, Any]]]:
    """Each text once per point, points rotated per text; sequential (concurrency 1)."""
    import json

    import httpx

    out: dict[str, list[dict[str, Any]]] = {p.label: [] for p in points}
    with httpx.Client(base_url=url, timeout=120) as client:

        def ask(text: str, point: Point) -> dict[str, Any]:
            body = decision_body(text, labels, point.policy)
            headers = {"Authorization": f"Bearer {point.api_key}"}
            start = time.perf_counter()
            response = client.post("/v1/chat/completions", json=body, headers=headers)
            ms = (time.perf_counter() - start) * 1000
            if response.status_code != 200:
                sys.exit(f"{point.label}: HTTP {response.status_code}: {response.text[:300]}")
            reply = response.json()
            answer = json.loads(reply["choices"][0]["message"]["content"])
            return {"answer": answer, "route": reply["slotgate"]["route"], "ms": ms}

        for i, text in enumerate(texts):
            shift = i % len(points)
            for point in [*points[shift:], *points[:shift]]:
                out[point.label].append(ask(text, point))
    return out


def latency_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean, p50 and p99 of the client-side latency, overall and per route."""
    import numpy as np

    def stats(ms: list[float]) -> dict[str, float | None]:
        if not ms:
            return {"mean_ms": None, "p50_ms": None, "p99_ms": None}
        values = np.asarray(ms)
        return {"mean_ms": round(float(values.mean()), 2),
                "p50_ms": round(float(np.percentile(values, 50)), 2),
                "p99_ms": round(float(np.percentile(values, 99)), 2)}

    by_route: dict[str, Any] = {}
    for route in sorted({r["route"] for r in rows}):
        by_route[route] = {"n": sum(r["route"] == route for r in rows),
                           **stats([r["ms"] for r in rows if r["route"] == route])}
    return {**stats([r["ms"] for r in rows]), "by_route": by_route}


def live_run(data: Path, work: Path, offline: dict[str, Any], *, n: int, seed: int
             ) -> dict[str, Any]:
    """Send ``n`` distinct test messages through the proxy at every operating point; attach the
    measured figures to ``offline["rows"]`` (key ``live``) and return the cross-checks."""
    import httpx

    from bench.cascade_frontier import (
        FAST_KINDS,
        SLOW_KIND,
        fixed_policy,
        policy_name,
        policy_path,
        read_labels,
        sample_expectation,
    )
    from bench.e2e_banking77 import prometheus_totals, sample_messages

    sample = sample_messages(data / "test.csv", n=n, seed=seed)
    first_row: dict[str, int] = {}
    for i, text in enumerate(offline["texts"]):
        first_row.setdefault(text, i)
    rows = [first_row[r["text"]] for r in sample]
    texts = [r["text"] for r in sample]
    warmup = read_labels(work / "tune.csv")[0][:3]  # train.csv messages: never in the sample
    options = offline["options"]
    checks: dict[str, Any] = {}
    by_label = {r["label"]: r for r in offline["rows"]}
    with standin(work / f"{SLOW_KIND}.joblib", work) as standin_url:
        # The stand-in loads MiniLM on its first call: do that here, outside any timeout.
        body = decision_body(warmup[0], options, "none")
        del body["slotgate"]
        httpx.post(f"{standin_url}/v1/chat/completions", json=body, timeout=600).raise_for_status()
        checks["standin_direct"] = standin_direct(standin_url, texts[:20], options)
        for position, kind in enumerate(FAST_KINDS):
            fast = offline["tiers"][kind]
            names = [policy_name(kind, t) for t in offline["targets"]]
            files = [policy_path(work, kind, t) for t in offline["targets"]]
            names.append(f"{kind}-fast-alone")
            files.append(fixed_policy(work / f"policy-{kind}-fast-alone.json", name=names[-1],
                                      accept_all=True, fingerprint=fast.fingerprint,
                                      options=options))
            if position == 0:  # slow alone once: it reads the first tier, then always escalates
                names.append("slow-alone")
                files.append(fixed_policy(work / "policy-slow-alone.json", name="slow-alone",
                                          accept_all=False, fingerprint=fast.fingerprint,
                                          options=options))
            points = [Point(name, name) for name in names]
            with proxy(kind=kind, model=work / f"{kind}.joblib", policies=files, points=points,
                       standin_url=standin_url, work=work) as url:
                send_interleaved(url, warmup, options, points)
                httpx.delete(f"{standin_url}/calls", timeout=10)
                started = time.monotonic()
                results = send_interleaved(url, texts, options, points)
                wall_s = time.monotonic() - started
                standin_calls = len(httpx.get(f"{standin_url}/calls", timeout=30).json())
                totals = prometheus_totals(url, ("slotgate_backend_errors_total",
                                                 "slotgate_queue_rejections_total"))
            slow_routes = sum(r["route"] == "slow" for res in results.values() for r in res)
            checks[kind] = {"requests": sum(map(len, results.values())), "wall_s": round(wall_s, 1),
                            "standin_calls": standin_calls, "slow_routes": slow_routes,
                            "standin_calls_equal_slow_routes": standin_calls == slow_routes,
                            **{k.removeprefix("slotgate_"): v for k, v in totals.items()}}
            for label, res in results.items():
                row = by_label[label]
                expected = sample_expectation(offline["accepted"][label], fast, offline["slow"],
                                              rows)
                row["live"] = summarize(res, expected, [offline["labels"][i] for i in rows],
                                        full_rate=row["escalation_rate"])
    return {"n": len(texts), "checks": checks}


def standin_direct(url: str, texts: Sequence[str], options: Sequence[str]) -> dict[str, Any]:
    """The stand-in's own latency, called directly (no proxy, no litellm), for scale."""
    import httpx

    timings = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for text in texts:
            body = decision_body(text, options, "none")
            del body["slotgate"]
            start = time.perf_counter()
            client.post("/v1/chat/completions", json=body).raise_for_status()
            timings.append({"route": "direct", "ms": (time.perf_counter() - start) * 1000})
        client.delete("/calls")
    summary = latency_summary(timings)
    summary.pop("by_route")
    return {"n": len(texts), **summary}


def summarize(res: Sequence[dict[str, Any]], expected: dict[str, Any], labels: Sequence[str], *,
              full_rate: float) -> dict[str, Any]:
    """One point's measured figures beside what the offline run predicts for the same rows."""
    import math

    n = len(res)
    escalated = sum(r["route"] == "slow" for r in res)
    rate = escalated / n
    spread = math.sqrt(full_rate * (1 - full_rate) / n)
    routes: dict[str, int] = {}
    for r in res:
        routes[r["route"]] = routes.get(r["route"], 0) + 1
    return {
        "n": n,
        "routes": routes,
        "escalation_rate": round(rate, 4),
        "expected_escalation_rate_on_sample": round(expected["escalation_rate"], 4),
        # The sample against the full test set: sampling error only, if the proxy routes as
        # the offline policy does.
        "escalation_z_vs_full_test": round((rate - full_rate) / spread, 2) if spread else None,
        "answers_equal_offline": round(sum(r["answer"] == a for r, a in
                                           zip(res, expected["answers"], strict=True)) / n, 4),
        "accuracy": round(sum(r["answer"] == y for r, y in zip(res, labels, strict=True)) / n, 4),
        "slow_calls_per_1000": round(1000 * rate, 1),
        **latency_summary(res),
    }
