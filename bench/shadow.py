"""Cold start with no labels, through the live proxy: shadow mode, export, tune, live reload,
route the rest.

    python -m bench.shadow --n 3000 [--shadow-share 0.5] [--target 0.95] [--reuse]

The fast tier is slotgate's TF-IDF model (trained on BANKING77's train.csv); the slow model is
the stand-in LLM (``standins/llm.py``, wordllama embeddings + logistic regression, trained on
train.csv too) behind litellm. ``--n`` test.csv messages are shuffled; the first
``--shadow-share`` of them are sent with the server in shadow mode (``policy.shadow: true``, the
policy file not written yet): every decision is read by the fast tier and answered by the slow
model, which is served, both logged. Then ``slotgate export-log --reference slow`` labels the
logged reads with the slow model's answers and ``slotgate tune --cv 5`` (calibrator
cross-fitted, threshold on every shadow row) writes the policy file the server names; the server reloads it by itself (file watch, no restart) and routes the rest.
Nothing uses a human label except the last, informational, column (accuracy against
BANKING77's labels).

Last line, one JSON object: ``n_shadow``, ``target``, ``agreement_after`` (agreement with the
slow model on the decisions accepted after the switch; the stand-in's answer for those is
computed offline with its own model, so asking costs no counted call), ``fast_share_after``,
``slow_calls_after`` (calls the stand-in counted after the switch), and more.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import default_data_dir, is_default_data, result_path
from bench.live import ask_intents, serve_in_thread, slotgate
from policies.file import load_policy

ROOT = Path(__file__).resolve().parent.parent
POLICY_NAME = "banking77-shadow"


def build_models(data: Path, work: Path, *, reuse: bool) -> dict[str, Path]:
    paths = {"fast": work / "tfidf.joblib", "slow": work / "standin-wordllama.joblib"}
    if reuse and all(p.is_file() for p in paths.values()):
        return paths
    slotgate("train", "--question", "intent", "--data", data / "train.csv", "--label-column", "category",
             "--out", paths["fast"])
    slotgate("train", "--question", "intent", "--data", data / "train.csv", "--label-column", "category",
             "--kind", "wordllama", "--out", paths["slow"])
    return paths


def ask_all(url: str, texts: Sequence[str], labels: list[str], *, concurrency: int
            ) -> list[dict[str, Any]]:
    return [{"answer": r["answer"], "route": r["facts"]["route"], "shadow": r["facts"]["shadow"],
             "guarantee": r["facts"]["guarantee"], "escalated": r["facts"]["escalated"]}
            for r in ask_intents(url, texts, labels, concurrency=concurrency, timeout_s=120)]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--shadow-share", type=float, default=0.5)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=default_data_dir())
    parser.add_argument("--work", type=Path, default=ROOT / "var/bench-shadow")
    parser.add_argument("--reuse", action="store_true", help="reuse the trained models in --work")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/results/shadow.json on the default data, "
                             "bench/results/local/shadow.json on other data")
    args = parser.parse_args(argv)
    out: Path = args.out or result_path("shadow.json", recorded=is_default_data(args.data))
    if not (args.data / "test.csv").is_file():
        sys.exit(f"BANKING77 not found at {args.data}: pass --data DIR")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.perf_counter()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    for stale in ("decisions.jsonl", "policy.json", "shadow.jsonl"):
        (work / stale).unlink(missing_ok=True)
    models = build_models(args.data, work, reuse=args.reuse)
    labels = json.loads((args.data / "categories.json").read_text())
    with (args.data / "test.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    random.Random(args.seed).shuffle(rows)
    rows = rows[:args.n]
    n_shadow = round(args.shadow_share * len(rows))
    before, after = rows[:n_shadow], rows[n_shadow:]

    from router.http.state import app_state
    from router.settings import Settings
    from standins.llm import model_chooser, start_standin

    standin = start_standin(model_path=models["slow"])
    policy_path = work / "policy.json"
    settings = Settings(
        fast={"kind": "sklearn", "model_path": models["fast"], "timeout_s": 10.0},
        # Cold start: no labels, so no policy yet; every decision in shadow mode until the
        # file appears (written by `slotgate tune`, picked up by the file watch).
        policy={"files": [policy_path], "shadow": True, "watch": True},
        slow={"model": "openai/standin", "api_base": standin.api_base, "api_key": "sk-standin",
              "timeout_s": 60},
        log={"decision_log_path": work / "decisions.jsonl"},
    )
    try:
        with serve_in_thread(settings) as (url, app):
            shadow_replies = ask_all(url, [r["text"] for r in before], labels,
                                     concurrency=args.concurrency)
            calls_shadow = len(standin.calls())
            export = slotgate("export-log", "--log", work / "decisions.jsonl", "--reference",
                              "slow", "--out", work / "shadow.jsonl")
            switch_at = time.perf_counter()
            slotgate("tune", "--preds", work / "shadow.jsonl", "--out", policy_path, "--name",
                     POLICY_NAME, "--target-accuracy", args.target, "--delta", args.delta,
                     "--seed", args.seed, "--cv", 5)  # the fast model saw none of these rows
            registry = app_state(app).service.registry
            while POLICY_NAME not in registry.names():
                if time.perf_counter() - switch_at > 60:
                    sys.exit("the tuned policy was not reloaded within 60 s")
                time.sleep(0.05)
            reload_s = time.perf_counter() - switch_at
            after_replies = ask_all(url, [r["text"] for r in after], labels,
                                    concurrency=args.concurrency)
            slow_calls_after = len(standin.calls()) - calls_shadow
    finally:
        standin.stop()
    policy = load_policy(policy_path)
    slow_answer = model_chooser(models["slow"])
    accepted = [(row, reply) for row, reply in zip(after, after_replies, strict=True)
                if not reply["escalated"]]
    agree = [reply["answer"] == slow_answer(row["text"], labels) for row, reply in accepted]
    result = {
        "n": len(rows), "n_shadow": n_shadow, "n_after": len(after), "target": args.target,
        "delta": args.delta,
        "shadow_all_served_by_slow": all(r["shadow"] and r["escalated"] for r in shadow_replies),
        "slow_calls_shadow": calls_shadow,
        "export_labels": export.strip().split(": labels ", 1)[-1],  # no machine paths
        "policy": {k: getattr(policy, k) for k in ("guarantee", "threshold", "bound", "coverage",
                                                   "n_tune", "n_calibration", "shadow")},
        "reload_s": round(reload_s, 3),
        # The guarantee the accepted fast answers carry; the slow model's answers carry none.
        "guarantee_after": sorted({str(r["guarantee"]) for r in after_replies
                                   if not r["escalated"]}),
        "guarantee_escalated": sorted({str(r["guarantee"]) for r in after_replies
                                       if r["escalated"]}),
        "agreement_after": sum(agree) / len(agree) if agree else None,
        "fast_share_after": len(accepted) / len(after) if after else None,
        "slow_calls_after": slow_calls_after,
        "accuracy_after_vs_human_labels": sum(
            reply["answer"] == row["category"] for row, reply in zip(after, after_replies,
                                                                     strict=True)) / len(after),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "command": "python -m bench.shadow " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
