"""End-to-end run on BANKING77: the proxy under uvicorn with the TF-IDF fast model, a policy tuned
at 95% accuracy, escalation through litellm to the stand-in LLM (wordllama embeddings + logistic
regression), Redis as cache, and N test messages sent through the OpenAI SDK, twice.

    python -m bench.e2e_banking77 --n 500 [--data DIR] [--redis-url URL] [--out JSON]

It checks that every answer is one of the 77 intents, that the fast share matches what
`slotgate eval` predicts for the policy, that the stand-in saw exactly the escalated messages,
and that the second pass is served entirely from the cache. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.live import ask_intents, free_port, serve_in_thread, slotgate

ROOT = Path(__file__).resolve().parent.parent


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    data: Path = args.data
    if not (data / "train.csv").is_file():
        sys.exit(f"BANKING77 not found at {data}: pass --data DIR (the folder with train.csv)")
    labels = json.loads((data / "categories.json").read_text())
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):  # one INFO line per request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    artifacts = build_artifacts(data, work, target=args.target_accuracy, seed=args.seed,
                                reuse=args.reuse_artifacts)
    sample = sample_messages(data / "test.csv", n=args.n, seed=args.seed)
    write_csv(work / "sample.csv", sample)
    slotgate("predict", "--model", artifacts["fast"], "--data", work / "sample.csv",
             "--label-column", "category", "--out", work / "sample-preds.jsonl")
    predicted = eval_json(work / "test-preds.jsonl", artifacts["policy"])
    on_sample = eval_json(work / "sample-preds.jsonl", artifacts["policy"])

    from standins.llm import last_user_text, start_standin

    standin = start_standin(model_path=artifacts["slow"])
    with redis(args.redis_url) as redis_url, proxy(artifacts, standin.api_base, redis_url, work,
                                                   namespace=f"e2e-{uuid.uuid4().hex[:8]}") as url:
        first = ask_all(url, sample, labels, concurrency=args.concurrency)
        standin_first = [last_user_text(c["body"]) for c in standin.calls()]
        second = ask_all(url, sample, labels, concurrency=args.concurrency)
        standin_total = len(standin.calls())
        health = prometheus_totals(url, ("slotgate_backend_errors_total",
                                         "slotgate_cache_errors_total"))
    standin.stop()

    n = len(sample)
    escalated_texts = sorted(r["text"] for r in first if r["route"] == "slow")
    fast = [r for r in first if r["route"] == "fast"]
    slow = [r for r in first if r["route"] == "slow"]
    fast_share = len(fast) / n
    p = predicted["coverage"]
    result = {
        "n": n,
        "fast_share": round(fast_share, 4),
        "predicted_fast_share": round(p, 4),
        "predicted_fast_share_ci": predicted["coverage_ci"],
        "fast_share_z": round((fast_share - p) / math.sqrt(p * (1 - p) / n), 3),
        "expected_fast_share_on_sample": round(on_sample["coverage"], 4),
        "accuracy": round(sum(r["correct"] for r in first) / n, 4),
        "fast_accuracy": round(sum(r["correct"] for r in fast) / max(1, len(fast)), 4),
        "slow_accuracy": round(sum(r["correct"] for r in slow) / max(1, len(slow)), 4),
        "target_accuracy": args.target_accuracy,
        "all_answers_valid": all(r["valid"] for r in first + second),
        "routes_first_pass": count(r["route"] for r in first),
        "routes_second_pass": count(r["route"] for r in second),
        "escalated": len(slow),
        "standin_calls": len(standin_first),
        "standin_saw_exactly_escalated": sorted(standin_first) == escalated_texts,
        "second_pass_cache_hits": sum(r["route"] == "cache" for r in second),
        "second_pass_standin_calls": standin_total - len(standin_first),
        "latency_ms_p50_first": percentile([r["ms"] for r in first], 50),
        "latency_ms_p50_second": percentile([r["ms"] for r in second], 50),
        "fast_backend_errors": health["slotgate_backend_errors_total"],  # each one escalated
        "cache_errors": health["slotgate_cache_errors_total"],
        "policy_threshold": predicted["threshold"],
        "redis": "given" if args.redis_url else "private redis-server",
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    default_data = Path(os.environ.get("SLOTGATE_DATA_DIR", ROOT.parent / "shared/data/banking77"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="test messages to send (distinct texts)")
    parser.add_argument("--data", type=Path, default=default_data, help="BANKING77 folder")
    parser.add_argument("--redis-url", default=None,
                        help="a Redis to use (a fresh namespace; nothing flushed); default: start "
                             "a private redis-server on a free port")
    parser.add_argument("--work", type=Path, default=ROOT / "var/e2e", help="artifact folder")
    parser.add_argument("--out", type=Path, default=None, help="also write the result JSON here")
    parser.add_argument("--target-accuracy", type=float, default=0.95)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse-artifacts", action="store_true",
                        help="reuse the models and policy already in --work")
    return parser.parse_args(argv)


def build_artifacts(data: Path, work: Path, *, target: float, seed: int,
                    reuse: bool) -> dict[str, Path]:
    """TF-IDF fast model on 70% of train.csv, its policy tuned on the other 30%, the stand-in's
    wordllama model on all of train.csv, and fast predictions for the whole test set."""
    paths = {"fast": work / "tfidf.joblib", "slow": work / "wordllama.joblib",
             "policy": work / "policy.json"}
    if reuse and all(p.is_file() for p in paths.values()) and (work / "test-preds.jsonl").is_file():
        return paths
    slotgate("train", "--question", "intent", "--data", data / "train.csv", "--label-column", "category", "--out",
             paths["fast"], "--holdout", 0.3, "--holdout-out", work / "tune.csv", "--seed", seed)
    slotgate("predict", "--model", paths["fast"], "--data", work / "tune.csv", "--label-column",
             "category", "--out", work / "tune-preds.jsonl")
    slotgate("tune", "--preds", work / "tune-preds.jsonl", "--out", paths["policy"],
             "--target-accuracy", target, "--name", "banking77-e2e", "--seed", seed)
    slotgate("predict", "--model", paths["fast"], "--data", data / "test.csv", "--label-column",
             "category", "--out", work / "test-preds.jsonl")
    slotgate("train", "--question", "intent", "--data", data / "train.csv", "--label-column", "category", "--kind",
             "wordllama", "--out", paths["slow"], "--seed", seed)
    return paths


def eval_json(preds: Path, policy: Path) -> dict[str, Any]:
    return dict(json.loads(slotgate("eval", "--preds", preds, "--policy", policy, "--json")
                           .strip().splitlines()[-1]))


def sample_messages(test_csv: Path, *, n: int, seed: int) -> list[dict[str, str]]:
    """``n`` test rows with distinct texts (a repeated text would be a cache hit, not a read)."""
    with test_csv.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    unique = list({r["text"]: r for r in rows}.values())
    return random.Random(seed).sample(unique, n)


def write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "category"])
        writer.writeheader()
        writer.writerows({"text": r["text"], "category": r["category"]} for r in rows)


@contextmanager
def redis(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed; install it or pass --redis-url")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def proxy(artifacts: dict[str, Path], api_base: str, redis_url: str, work: Path, *,
          namespace: str) -> Iterator[str]:
    """slotgate under uvicorn in a background thread, configured as `make serve` would be plus
    the stand-in as slow model and Redis as cache."""
    from router.settings import Settings

    settings = Settings(
        fast={"kind": "sklearn", "model_path": artifacts["fast"], "timeout_s": 5.0},
        policy={"files": [artifacts["policy"]], "default": "banking77-e2e"},
        slow={"model": "openai/standin", "api_base": api_base, "api_key": "sk-standin-e2e",
              "timeout_s": 30},
        cache={"redis_url": redis_url, "namespace": namespace},
        log={"decision_log_path": work / "decisions.jsonl"},
    )
    with serve_in_thread(settings) as (url, _):
        yield url


def ask_all(url: str, rows: list[dict[str, str]], labels: list[str], *,
            concurrency: int) -> list[dict[str, Any]]:
    replies = ask_intents(url, [row["text"] for row in rows], labels, concurrency=concurrency)
    return [{"text": row["text"], "answer": r["answer"], "route": r["facts"]["route"],
             "correct": r["answer"] == row["category"], "valid": r["answer"] in labels,
             "ms": r["ms"]} for row, r in zip(rows, replies, strict=True)]


def prometheus_totals(url: str, names: Sequence[str]) -> dict[str, float]:
    """Sums of the named counters (over all their labels) on the proxy's /metrics."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def count(values: Iterator[str] | Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))], 2)


def wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


if __name__ == "__main__":
    main()
