"""A three-tier cascade in the proxy, end to end on BANKING77: `slotgate serve`'s app under
uvicorn with wordllama (the first fast tier), TF-IDF (the second) and the stand-in LLM behind
litellm (MiniLM embeddings + logistic regression, ``--slow-kind``) as the slow model; N test
messages sent through the OpenAI SDK.

    python -m bench.tiers_live [--n 500] [--data DIR] [--work var/tiers-live] [--out JSON]

The artifacts are made with the CLI a user runs (docs/cascade.md): `train --cv 5` for both fast
tiers, one `tune` over both out-of-fold files with each tier's cost, `predict` and `eval` on the
sent messages. The proxy must route every message as `slotgate eval` applies the cascade to the
same rows (the same tier answers: the same models, calibrators and thresholds), the stand-in
must see exactly the escalated messages, and every reply names its tier. The last line printed
is one JSON object; the README's three-tier figures come from it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.e2e_banking77 import count, percentile, sample_messages, write_csv
from bench.live import ask_intents, serve_in_thread, slotgate

ROOT = Path(__file__).resolve().parent.parent
# Per read (ms): the one-row reads `python -m bench.tiers` measured (docs/cascade.md); the slow
# model's is the round trip the tiers benchmark assumes for a hosted LLM.
COSTS = {"embedding": 0.2, "tfidf": 1.4, "slow": 500.0}
FAST_TIERS = {"embedding": "wordllama", "tfidf": "tfidf"}  # name in the settings -> train --kind


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    data, work = args.data, args.work
    if not (data / "train.csv").is_file():
        sys.exit(f"BANKING77 not found at {data}: pass --data DIR (the folder with train.csv)")
    work.mkdir(parents=True, exist_ok=True)
    labels = json.loads((data / "categories.json").read_text())
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "openai", "LiteLLM"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.perf_counter()
    policy = build_artifacts(data, work, target=args.target_accuracy, seed=args.seed,
                             reuse=args.reuse_artifacts, slow_kind=args.slow_kind)
    sample = sample_messages(data / "test.csv", n=args.n, seed=args.seed)
    write_csv(work / "sample.csv", sample)
    for name, kind in FAST_TIERS.items():
        slotgate("predict", "--model", work / f"{kind}.joblib", "--data", work / "sample.csv",
                 "--label-column", "category", "--out", work / f"sample-{name}.jsonl")
    predicted = json.loads(slotgate(
        "eval", "--policy", policy, *preds_flags(work, "sample"), "--json").strip().splitlines()[-1])

    from router.settings import Settings
    from standins.llm import last_user_text, start_standin

    standin = start_standin(model_path=work / f"slow-{args.slow_kind}.joblib")
    settings = Settings(
        fast={"name": "embedding", "kind": "sklearn", "model_path": work / "wordllama.joblib",
              "timeout_s": 5.0},
        tiers=[{"name": "tfidf", "kind": "sklearn", "model_path": work / "tfidf.joblib",
                "timeout_s": 5.0}],
        policy={"files": [policy]},
        slow={"model": "openai/standin", "api_base": standin.api_base,
              "api_key": "sk-standin-tiers", "timeout_s": 30},
        log={"decision_log_path": work / "decisions.jsonl"})
    with serve_in_thread(settings) as (url, _):
        replies = ask_intents(url, [row["text"] for row in sample], labels,
                              concurrency=args.concurrency)
    asked = sorted(last_user_text(call["body"]) for call in standin.calls())
    standin.stop()

    rows = [{"text": row["text"], "answer": r["answer"], "route": r["facts"]["route"],
             "tier": r["facts"].get("tier"), "tiers": r["facts"].get("tiers"),
             "correct": r["answer"] == row["category"], "ms": r["ms"]}
            for row, r in zip(sample, replies, strict=True)]
    result = summary(rows, predicted, asked=asked, names=list(FAST_TIERS))
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return result


def summary(rows: list[dict[str, Any]], predicted: dict[str, Any], *, asked: list[str],
            names: list[str]) -> dict[str, Any]:
    """What the proxy did against what `eval` predicts for the same rows."""
    n = len(rows)
    by = {name: [r for r in rows if r["tier"] == name] for name in names}
    slow = [r for r in rows if r["route"] == "slow"]
    accepted = [r for r in rows if r["tier"] is not None]
    eval_tiers = {t["name"]: t for t in predicted["tiers"]}
    costs = [sum(COSTS[t["tier"]] for t in r["tiers"] or ()) + (COSTS["slow"] if r["route"] ==
                                                               "slow" else 0.0) for r in rows]
    tiers = {}
    for name in names:
        mine = by[name]
        tiers[name] = {
            "answered": len(mine),
            "answered_by_eval": eval_tiers[name]["n_answered"],
            "threshold": eval_tiers[name]["threshold"],
            "read": sum(any(t["tier"] == name for t in r["tiers"] or ()) for r in rows),
            "accepted_accuracy": round(sum(r["correct"] for r in mine) / len(mine), 4)
            if mine else None,
            "latency_ms_p50": percentile([r["ms"] for r in mine], 50) if mine else None,
        }
    return {
        "n": n,
        "target_accuracy": predicted["target_accuracy"],
        "delta": predicted["delta"],
        "tiers": tiers,
        "slow": {"answered": len(slow), "answered_by_eval": n - predicted["n_accepted"],
                 "accuracy": round(sum(r["correct"] for r in slow) / len(slow), 4)
                 if slow else None,
                 "latency_ms_p50": percentile([r["ms"] for r in slow], 50) if slow else None},
        "routes": count(r["route"] for r in rows),
        "accepted_accuracy": round(sum(r["correct"] for r in accepted) / len(accepted), 4)
        if accepted else None,
        "accuracy": round(sum(r["correct"] for r in rows) / n, 4),
        "routed_as_eval": all(tiers[name]["answered"] == tiers[name]["answered_by_eval"]
                              for name in names),
        "every_reply_names_its_tiers": all(r["tiers"] for r in rows),
        "standin_saw_exactly_escalated": asked == sorted(r["text"] for r in slow),
        "expected_cost": round(sum(costs) / n, 3),
        "expected_cost_by_eval": round(predicted["expected_cost"], 3),
        "slow_only_cost": COSTS["slow"],
        "costs": COSTS,
    }


def build_artifacts(data: Path, work: Path, *, target: float, seed: int, reuse: bool,
                    slow_kind: str) -> Path:
    """Both fast tiers trained on train.csv with their out-of-fold reads, the stand-in's model
    (``slow_kind``), and the cascade policy tuned on the out-of-fold reads of both tiers."""
    policy = work / "cascade.json"
    models = [*(work / f"{kind}.joblib" for kind in FAST_TIERS.values()),
              work / f"slow-{slow_kind}.joblib"]
    if reuse and policy.is_file() and all(m.is_file() for m in models):
        return policy
    common = ("--question", "intent", "--data", data / "train.csv", "--label-column", "category",
              "--seed", seed)
    for name, kind in FAST_TIERS.items():
        slotgate("train", *common, "--kind", kind, "--cv", 5, "--oof-out",
                 work / f"oof-{name}.jsonl", "--out", work / f"{kind}.joblib")
    slotgate("train", *common, "--kind", slow_kind, "--out", work / f"slow-{slow_kind}.joblib")
    slotgate("tune", *preds_flags(work, "oof"),
             *[flag for name in FAST_TIERS for flag in ("--tier", f"{name}={COSTS[name]}")],
             "--slow-cost", COSTS["slow"], "--target-accuracy", target, "--seed", seed,
             "--name", "intents", "--out", policy)
    return policy


def preds_flags(work: Path, stem: str) -> list[Any]:
    return [flag for name in FAST_TIERS for flag in ("--preds", work / f"{stem}-{name}.jsonl")]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    default_data = Path(os.environ.get("SLOTGATE_DATA_DIR", ROOT.parent / "shared/data/banking77"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="test messages to send (distinct)")
    parser.add_argument("--data", type=Path, default=default_data, help="BANKING77 folder")
    parser.add_argument("--work", type=Path, default=ROOT / "var/tiers-live",
                        help="artifact folder")
    parser.add_argument("--out", type=Path, default=None, help="also write the result JSON here")
    parser.add_argument("--target-accuracy", type=float, default=0.95)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow-kind", choices=("minilm", "wordllama", "tfidf"),
                        default="minilm", help="the stand-in LLM's model (`train --kind`)")
    parser.add_argument("--reuse-artifacts", action="store_true",
                        help="reuse the models and policy already in --work")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
