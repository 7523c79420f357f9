"""BANKING77's 77-option question through the systemone backend against a stand-in server that
enforces the example server's 26-option cap and answers from a real model (TF-IDF + logistic
regression trained on train.csv): the combined grouped read against the chained group-then-option
read on the same test messages, with an exact McNemar test.

    .venv/bin/python -m bench.systemone_77 --n 500 [--data ../shared/data/banking77]

Prints a table; writes bench/results/systemone_77.json (on other data or another cap:
bench/results/local/); the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import default_data_dir, is_default_data, result_path
from policies.types import DecisionRequest, Option, OptionScores
from router.backends.grouping import split_groups
from router.backends.options import SystemOneOptions
from router.backends.systemone import SystemOneBackend
from standins.reader import Banking77Reader, read_test
from standins.systemone_server import SystemOneStandin

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTIONS = "Which banking intent does the customer's message express?"


def mcnemar(correct_a: np.ndarray, correct_b: np.ndarray) -> dict[str, Any]:
    """Exact McNemar through CAL's paired_comparison (scipy's binomtest underneath)."""
    from calibration.compare import paired_comparison

    result = paired_comparison(correct_a, correct_b)
    return {"a_only": result.a_only, "b_only": result.b_only, "p_value": result.p_value,
            "both_correct": result.both_correct, "neither": result.neither}


async def read_all(url: str, requests: list[DecisionRequest], *, grouping: str,
                   group_size: int | None, concurrency: int, server_cap: int
                   ) -> tuple[list[OptionScores], float]:
    options = SystemOneOptions(grouping=grouping, group_size=group_size,
                               max_options=None if server_cap == 26 else server_cap)
    backend = SystemOneBackend(url, options, max_concurrency=concurrency, timeout_s=30.0)
    start = time.perf_counter()
    try:
        scores = await backend.read(requests)
    finally:
        await backend.aclose()
    return scores, time.perf_counter() - start


def summarise(scores: list[OptionScores], labels: list[str]) -> dict[str, Any]:
    proba = np.array([s.proba for s in scores])
    names = scores[0].options
    truth = np.array([names.index(label) for label in labels])
    top = proba.argmax(axis=1)
    true_mass = proba[np.arange(len(labels)), truth]
    return {
        "correct": top == truth,
        "accuracy": float(np.mean(top == truth)),
        "mean_top_proba": float(proba.max(axis=1).mean()),
        "true_label_zero_share": float(np.mean(true_mass == 0)),
        "nll_clipped": float(-np.log(np.clip(true_mass, 1e-12, None)).mean()),
        "options_covered": int((proba > 0).sum(axis=1).min()),
        "max_sum_error": float(np.abs(proba.sum(axis=1) - 1).max()),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="test messages (seeded sample)")
    parser.add_argument("--data", type=Path, default=default_data_dir(),
                        help="folder with BANKING77 train.csv/test.csv (env SLOTGATE_DATA_DIR)")
    parser.add_argument("--seed", type=int, default=20260918)
    parser.add_argument("--group-size", type=int, default=None,
                        help="options per group (default: as few groups as the cap allows)")
    parser.add_argument("--server-cap", type=int, default=26,
                        help="options the stand-in server takes in one question (the vLLM "
                             "example server's: 26)")
    parser.add_argument("--noise", type=float, default=0.0, help="stand-in noise per draw")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/results/systemone_77.json on the default data and "
                             "cap, bench/results/local/systemone_77.json otherwise")
    args = parser.parse_args(argv)
    out: Path = args.out or result_path(
        "systemone_77.json", recorded=is_default_data(args.data) and args.server_cap == 26)

    texts, labels = read_test(args.data)
    rng = np.random.default_rng(args.seed)
    rows = sorted(rng.choice(len(texts), size=min(args.n, len(texts)), replace=False).tolist())
    texts, labels = [texts[i] for i in rows], [labels[i] for i in rows]
    started = time.perf_counter()
    reader = Banking77Reader(data_dir=args.data, noise=args.noise)
    train_s = time.perf_counter() - started
    # Case-sensitive ASCII order, as in the field report: related intents sit together.
    options = tuple(Option(name) for name in sorted(reader.intents))
    requests = [DecisionRequest("intent", INSTRUCTIONS, options, text, seed=args.seed)
                for text in texts]
    groups = split_groups(options, max_options=args.server_cap, group_size=args.group_size)

    results: dict[str, Any] = {}
    with SystemOneStandin(reader=reader, max_alternatives=args.server_cap) as server:
        for mode in ("combined", "chained"):
            before = server.stats.requests
            scores, wall_s = asyncio.run(read_all(server.url, requests, grouping=mode,
                                                  group_size=args.group_size,
                                                  concurrency=args.concurrency,
                                                  server_cap=args.server_cap))
            results[mode] = summarise(scores, labels)
            if mode == "chained":  # how often the first step kept the true intent in play
                chosen = [groups[s.raw["grouped"]["chosen_group"]] for s in scores]
                results[mode]["group_accuracy"] = float(np.mean(
                    [any(o.name == label for o in g) for g, label in zip(chosen, labels)]))
            results[mode]["http_requests"] = server.stats.requests - before
            results[mode]["wall_s"] = round(wall_s, 2)
            results[mode]["max_alternatives_sent"] = max(
                len(b["questions"]["intent"]["criteria"]) for b in server.stats.bodies[before:])
        assert server.stats.max_in_flight <= args.concurrency
    flat = np.array([reader.intent_proba(t) for t in texts])
    flat_top = [reader.intents[i] for i in flat.argmax(axis=1)]
    comparison = mcnemar(results["combined"].pop("correct"), results["chained"].pop("correct"))

    _print_table(results, comparison, len(texts), len(options), len(groups), args.server_cap)
    summary = {
        "n": len(texts),
        "combined_accuracy": results["combined"]["accuracy"],
        "chained_accuracy": results["chained"]["accuracy"],
        "mcnemar_p": comparison["p_value"],
        "options_covered": results["combined"]["options_covered"],
        "combined_only_correct": comparison["a_only"],
        "chained_only_correct": comparison["b_only"],
        "groups": [len(g) for g in groups],
        "chained_group_accuracy": results["chained"]["group_accuracy"],
        "flat_accuracy_no_cap": float(np.mean(np.array(flat_top) == np.array(labels))),
        "server_cap": args.server_cap,
        "noise": args.noise,
        "seed": args.seed,
        "train_s": round(train_s, 1),
        "modes": results,
        "model": "TF-IDF word 1-2-grams + LogisticRegression(C=10), BANKING77 train.csv",
        "data": str(args.data),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("n", "combined_accuracy", "chained_accuracy",
                                              "mcnemar_p", "options_covered")}))
    return summary


def _print_table(results: dict[str, Any], comparison: dict[str, Any], n: int, n_options: int,
                 groups: int, cap: int) -> None:
    print(f"BANKING77, {n} test messages, {n_options} options, server cap {cap} -> {groups} groups")
    print(f"{'read':<10}{'accuracy':>10}{'top p':>8}{'p(true)=0':>11}{'NLL':>8}{'options':>9}"
          f"{'requests':>10}{'wall s':>8}")
    for mode, r in results.items():
        print(f"{mode:<10}{r['accuracy']:>10.3f}{r['mean_top_proba']:>8.3f}"
              f"{r['true_label_zero_share']:>11.3f}{r['nll_clipped']:>8.2f}"
              f"{r['options_covered']:>9d}{r['http_requests']:>10d}{r['wall_s']:>8.1f}")
    print(f"discordant: combined only {comparison['a_only']}, chained only {comparison['b_only']}; "
          f"exact McNemar p = {comparison['p_value']:.4g}")


if __name__ == "__main__":
    main()
