"""A cascade of fast tiers with one joint guarantee (``calibration.cascade``), measured on
re-draws of a labelled pool against each fast tier alone, MAPIE, and the slow model alone.

Tiers (``--fast``, ``--slow``): wordllama + logistic regression, then TF-IDF + logistic
regression (fast, cheapest first), then MiniLM + logistic regression standing in for the LLM, as
bench.cascade does. Every pool row is read out-of-fold once per model (``--folds`` fits on the
other folds; cached under var/bench/tiers); each re-draw then takes ``--labelled`` random rows as
the labelled data (half fit each fast tier's calibrator and order the cascade's candidates,
half test them) and holds back all the others. Costs are per decision (``--costs``, ms by default: a fast tier's one-row read on
this 2-core machine, an assumed LLM call for the slow model); a decision pays every tier that
read it, and the slow model when no tier accepted it.

Per target and re-draw, on the same rows: the joint thresholds; each fast tier alone (the
one-tier search of ``slotgate tune``); MAPIE's BinaryClassificationController for each fast tier
alone (it takes one label per row, so it cannot fit a cascade whose answer comes from whichever
tier accepts); the slow model alone. A draw *violates* when the accepted held-back answers are
less accurate than the target.

The cost promise (``--cost-share``, ``--cost-block``, ``--cost-delta``; ``calibration.block_cost``):
the cascade is also fit with it, as ``slotgate tune --cost-share`` fits it, and each tier alone
is held to it; the held-back rows, in their random order, are cut into fixed blocks. Its
violation rate is the share of blocks, over every draw, whose slow share exceeds the promise in
a draw that claimed it (the promise is P(a block exceeds the share) <= cost_delta, over draws
and blocks); the accuracy promise's violation rate is counted for the same rule.

Usage: python -m bench.tiers [--draws 100] [--labelled 4000] [--targets 0.90,0.95,0.98]
[--data F.csv --text-column text --label-column label] [--quick] [--out JSON]
The last stdout line is the JSON written to bench/results/tiers.json; a run on other data,
tiers, costs or pool (--data, --fast, --slow, --costs, --pool, --quick) writes
bench/results/local/tiers.json instead (not tracked), unless --out says where.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.common import ROOT, result_path
from bench.guarantee import default_data, read_pool

KINDS = ("tfidf", "wordllama", "minilm")
# ms per decision: one-row predict_proba medians measured on this machine (wordllama 0.19,
# TF-IDF 1.41, docs/cascade.md), and an LLM decision call for the slow model (assumed).
DEFAULT_COSTS = {"wordllama": 0.2, "tfidf": 1.4, "slow": 500.0}
WORK = ROOT / "var/bench/tiers"


def pool_reads(args: argparse.Namespace, kinds: list[str]) -> tuple[NDArray[np.int64],
                                                                     dict[str, NDArray[Any]]]:
    """Labels, and each model's out-of-fold probabilities of every pool row (cached)."""
    from bench.guarantee_methods import pool_oof

    texts, y = read_pool(args.data, text_column=args.text_column, label_column=args.label_column)
    if args.pool is not None and args.pool < len(y):
        keep = np.sort(np.random.default_rng(args.seed).permutation(len(y))[:args.pool])
        texts, y = texts[keep], y[keep]
    digest = hashlib.sha256(json.dumps([texts.tolist(), y.tolist(), args.folds, args.seed])
                            .encode()).hexdigest()[:16]
    reads = {}
    for kind in kinds:
        cached = args.work / f"oof-{kind}-{digest}.npy"
        if cached.is_file():
            reads[kind] = np.load(cached)
            continue
        print(f"reading the pool out-of-fold with {kind} ({args.folds} fits)", file=sys.stderr)
        if kind == "tfidf":
            x: NDArray[Any] = texts
        else:
            from router.backends.encoders import load_encoder

            x = np.asarray(load_encoder(kind)(list(texts)), dtype=np.float64)
        reads[kind] = pool_oof(x, y, n_classes=int(y.max()) + 1, seed=args.seed,
                               n_folds=args.folds)
        args.work.mkdir(parents=True, exist_ok=True)
        np.save(cached, reads[kind])
    return y, reads


def outcome(answered: NDArray[np.int64], correct: NDArray[np.bool_], slow_correct: NDArray[np.bool_],
            cost: NDArray[np.float64], target: float) -> dict[str, Any]:
    """What one routing did on the held-back rows (``answered``: tier index, len(tiers) = slow)."""
    n_fast = correct.shape[1]
    accepted = answered < n_fast
    hits = correct[np.flatnonzero(accepted), answered[accepted]]
    accuracy = float(hits.mean()) if accepted.any() else None
    overall = (hits.sum() + slow_correct[~accepted].sum()) / len(answered)
    return {"violated": accuracy is not None and accuracy < target, "accepted_accuracy": accuracy,
            "coverage_by_tier": [float(np.mean(answered == k)) for k in range(n_fast + 1)],
            "cost": float(cost.mean()), "accuracy": float(overall)}


def with_cost_promise(routing: dict[str, Any], promise: Any, *, tuned: NDArray[np.int64],
                      held: NDArray[np.int64], n_tiers: int, passed: bool) -> dict[str, Any]:
    """``routing``'s outcome with the cost promise's figures: whether the tuning rows claimed
    it (``tuned``: the tier answering each threshold row), and the held-back rows' fixed blocks
    (``held``: the tier answering each), those past the promised share counted where claimed."""
    bound = promise.bound(int((tuned == n_tiers).sum()), len(tuned), n_tiers=n_tiers)
    claimed = passed and bound.kept
    slow = held == n_tiers
    per_block = slow[: len(slow) // promise.block * promise.block].reshape(-1, promise.block)
    over = int((per_block.sum(axis=1) > promise.allowed).sum())
    return {**routing, "claimed": claimed, "blocks": len(per_block),
            "blocks_over": over if claimed else 0,
            "violated": routing["violated"] and claimed}


def one_draw(reads: dict[str, NDArray[Any]], y: NDArray[np.int64], *, fast: list[str],
             slow: str, costs: dict[str, float], labelled: int, targets: list[float],
             delta: float, calibrator: str, seed: int, mapie: bool,
             cost: tuple[float, int, float] | None = None) -> dict[str, Any]:
    """Every method's outcome per target on one re-draw of labelled and held-back rows
    (``cost``: the cost promise's share, block and delta; None: none)."""
    from bench.guarantee_methods import Scored, mapie_threshold
    from calibration.block_cost import BlockCostPromise
    from calibration.calibrators import make_calibrator
    from calibration.cascade import CascadeThresholds
    from policies.fitting import answer_confidence

    order = np.random.default_rng(seed).permutation(len(y))
    cal, tune, held = order[:labelled // 2], order[labelled // 2:labelled], order[labelled:]
    parts = {"cal": cal, "tune": tune, "held": held}
    conf = {part: np.empty((len(rows), len(fast))) for part, rows in parts.items()}
    correct = {part: np.empty(conf[part].shape, dtype=bool) for part in conf}
    for k, kind in enumerate(fast):
        fitted = make_calibrator(calibrator).fit(reads[kind][cal], y[cal])
        for part, rows in parts.items():
            answers, confidence = answer_confidence(reads[kind][rows],
                                                    fitted.transform(reads[kind][rows]))
            conf[part][:, k], correct[part][:, k] = confidence, answers == y[rows]
    slow_correct = reads[slow][held].argmax(axis=1) == y[held]
    slow_cost = costs["slow"]
    promise = None if cost is None else BlockCostPromise(share=cost[0], block=cost[1],
                                                         delta=cost[2])
    out: dict[str, Any] = {}
    for target in targets:
        per: dict[str, Any] = {}
        joint = CascadeThresholds(target_accuracy=target, delta=delta,
                                  tier_costs=[costs[k] for k in fast], slow_cost=slow_cost
                                  ).fit(conf["tune"], correct["tune"],
                                        order_confidence=conf["cal"], order_correct=correct["cal"])
        per["cascade"] = outcome(joint.route(conf["held"]), correct["held"], slow_correct,
                                 joint.costs(conf["held"]), target)
        per["cascade"]["passed"] = joint.passed_
        if promise is not None:
            paired = CascadeThresholds(
                target_accuracy=target, delta=delta, tier_costs=[costs[k] for k in fast],
                slow_cost=slow_cost, cost_level=promise.level,
                cost_cap=promise.max_escalation(promise.delta - promise.level),
            ).fit(conf["tune"], correct["tune"], order_confidence=conf["cal"],
                  order_correct=correct["cal"])
            held_route = paired.route(conf["held"])
            per["cascade + cost promise"] = with_cost_promise(
                outcome(held_route, correct["held"], slow_correct, paired.costs(conf["held"]),
                        target),
                promise, tuned=paired.route(conf["tune"]), held=held_route,
                n_tiers=len(fast), passed=paired.passed_)
        label_free = CascadeThresholds(target_accuracy=target, delta=delta,
                                       tier_costs=[costs[k] for k in fast], slow_cost=slow_cost
                                       ).fit(conf["tune"], correct["tune"])
        per["cascade, label-free order"] = outcome(
            label_free.route(conf["held"]), correct["held"], slow_correct,
            label_free.costs(conf["held"]), target)
        for k, kind in enumerate(fast):
            alone = CascadeThresholds(target_accuracy=target, delta=delta,
                                      tier_costs=[costs[kind]], slow_cost=slow_cost
                                      ).fit(conf["tune"][:, [k]], correct["tune"][:, [k]])
            held_k = conf["held"][:, [k]]
            per[kind] = outcome(alone.route(held_k), correct["held"][:, [k]], slow_correct,
                                alone.costs(held_k), target)
            if promise is not None:  # one tier: the rule chosen for accuracy, held to the promise
                per[f"{kind} + cost promise"] = with_cost_promise(
                    per[kind], promise, tuned=alone.route(conf["tune"][:, [k]]),
                    held=alone.route(held_k), n_tiers=1, passed=alone.passed_)
            if mapie:
                threshold = mapie_threshold(
                    Scored(conf["tune"][:, k], correct["tune"][:, k], conf["held"][:, k],
                           correct["held"][:, k]), target=target, delta=delta)
                answered = (np.ones(len(held), dtype=np.int64) if threshold is None
                            else (held_k[:, 0] < threshold).astype(np.int64))
                per[f"MAPIE {kind}"] = outcome(answered, correct["held"][:, [k]], slow_correct,
                                               (costs[kind] + slow_cost * answered
                                                ).astype(np.float64), target)
        out[f"{target:g}"] = per
    return out


def summary(draws: list[dict[str, Any]], *, names: list[str], fast: list[str], delta: float,
            slow_cost: float) -> dict[str, Any]:
    """The report: per target, the cascade's figures against each fast tier alone and MAPIE."""
    targets: dict[str, Any] = {}
    for key in draws[0]:
        def stats(method: str, key: str = key) -> dict[str, Any]:
            rows = [draw[key][method] for draw in draws]
            coverage = np.mean([r["coverage_by_tier"] for r in rows], axis=0)
            return {"violation_rate": float(np.mean([r["violated"] for r in rows])),
                    "expected_cost": round(float(np.mean([r["cost"] for r in rows])), 3),
                    "coverage": round(1.0 - float(coverage[-1]), 4),
                    "accuracy": round(float(np.mean([r["accuracy"] for r in rows])), 4),
                    "coverage_by_tier": [round(float(c), 4) for c in coverage]}

        cascade = stats("cascade")
        alone = {kind: stats(kind) for kind in fast}
        best = min(fast, key=lambda kind: alone[kind]["expected_cost"])
        saving = alone[best]["expected_cost"] - cascade["expected_cost"]
        methods = [m for m in draws[0][key] if m.startswith("MAPIE ")]
        targets[key] = {
            "redraws": len(draws), "delta": delta,
            "violation_rate": cascade["violation_rate"],
            "coverage_by_tier": dict(zip(names, cascade["coverage_by_tier"], strict=True)),
            "expected_cost": cascade["expected_cost"],
            "best_single_tier_cost": alone[best]["expected_cost"],
            "slow_only_cost": slow_cost,
            "best_single_tier": best,
            "saving_vs_best_single_tier": round(saving, 3),
            "saving_vs_best_single_tier_pct": round(100 * saving / alone[best]["expected_cost"],
                                                    2),
            "no_vector_passed_rate": float(np.mean([not d[key]["cascade"]["passed"]
                                                    for d in draws])),
            "accuracy": cascade["accuracy"],
            "label_free_order": {k: v for k, v in stats("cascade, label-free order").items()
                                 if k != "coverage_by_tier"},
            "single_tiers": {kind: {k: v for k, v in alone[kind].items()
                                    if k != "coverage_by_tier"} for kind in fast},
            "mapie": {m.removeprefix("MAPIE "): {k: v for k, v in stats(m).items()
                                                 if k != "coverage_by_tier"} for m in methods},
        }
        if saving <= 0:
            targets[key]["note"] = (
                f"the cascade costs {-saving:.3f} ({-100 * saving / alone[best]['expected_cost']:.1f}"
                f"%) more than {best} alone: it answers {cascade['coverage']:.1%} of decisions "
                f"without the slow model against {alone[best]['coverage']:.1%}. Its walk tests a "
                f"larger family of vectors in an order estimated from labelled rows, so with "
                f"few rows near a high target it stops earlier than the one-tier walk, whose "
                f"order is exact (docs/cascade.md)")
        if "cascade + cost promise" in draws[0][key]:
            targets[key]["cost_promise"] = cost_summary(draws, key, fast=fast, delta=delta)
    return targets


def cost_summary(draws: list[dict[str, Any]], key: str, *, fast: list[str], delta: float
                 ) -> dict[str, Any]:
    """Both promises' violation rates over the draws, for the cascade fit with the cost
    promise and each tier alone held to it; coverage and cost over the draws that claimed the
    pair (the others tune nothing: ``tune`` refuses them), beside the accuracy promise alone's
    on the same draws."""
    def rates(method: str, alone: str) -> dict[str, Any]:
        rows = [draw[key][method] for draw in draws]
        claimed = [(row, draw[key][alone]) for row, draw in zip(rows, draws, strict=True)
                   if row["claimed"]]
        blocks = sum(r["blocks"] for r in rows)

        def mean(field: str, pick: int) -> float | None:
            values = [(1.0 - pair[pick]["coverage_by_tier"][-1]) if field == "coverage"
                      else pair[pick][field] for pair in claimed]
            return round(float(np.mean(values)), 4) if values else None

        return {"claimed_rate": float(np.mean([r["claimed"] for r in rows])),
                "accuracy_violation_rate": float(np.mean([r["violated"] for r in rows])),
                "block_violation_rate": (sum(r["blocks_over"] for r in rows) / blocks
                                         if blocks else None),
                "blocks": blocks,
                "coverage_when_claimed": mean("coverage", 0),
                "coverage_accuracy_alone": mean("coverage", 1),
                "expected_cost_when_claimed": mean("cost", 0),
                "expected_cost_accuracy_alone": mean("cost", 1)}

    return {"cascade": rates("cascade + cost promise", "cascade"),
            "single_tiers": {kind: rates(f"{kind} + cost promise", kind) for kind in fast},
            "accuracy_delta": delta}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, nargs="+", default=None,
                        help="labelled CSV/JSONL files, or a folder with train.csv and test.csv "
                             "(default: BANKING77)")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--label-column", default="category")
    parser.add_argument("--fast", default="wordllama,tfidf", help="fast tiers, comma-separated")
    parser.add_argument("--slow", default="minilm", choices=KINDS,
                        help="the model standing in for the LLM")
    parser.add_argument("--costs", default=None,
                        help="per-decision cost of each fast tier and 'slow', e.g. "
                             "'wordllama=0.2,tfidf=1.4,slow=500' (the default)")
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--labelled", type=int, default=None,
                        help="labelled rows per draw (default 4000, at most half the pool)")
    parser.add_argument("--pool", type=int, default=None, help="use a seeded subset of the pool")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--targets", default="0.90,0.95,0.98")
    parser.add_argument("--delta", type=float, default=0.05)
    parser.add_argument("--calibrator", default="temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-mapie", action="store_true", help="skip the MAPIE comparison")
    parser.add_argument("--cost-share", type=float, default=0.15,
                        help="the cost promise's slow share of each block (default 0.15)")
    parser.add_argument("--cost-block", type=int, default=1000,
                        help="decisions in one block of the cost promise")
    parser.add_argument("--cost-delta", type=float, default=0.05,
                        help="allowed chance that a block breaks the cost promise")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 10 draws on a 3,000-row subset of the pool")
    parser.add_argument("--work", type=Path, default=WORK, help="cache of out-of-fold reads")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    # Only the default run (BANKING77, the default tiers and costs) writes the tracked result.
    local = (args.quick or args.data is not None or args.pool is not None
             or args.costs is not None or args.fast != "wordllama,tfidf" or args.slow != "minilm")
    if args.out is None:
        args.out = result_path("tiers.json", recorded=not local)
    args.data = args.data or default_data()
    if args.quick:
        args.draws, args.pool = min(args.draws, 10), args.pool or 3000
    args.fast = [kind.strip() for kind in args.fast.split(",") if kind.strip()]
    for kind in [*args.fast, args.slow]:
        if kind not in KINDS:
            parser.error(f"--fast/--slow: {kind!r} is not one of {KINDS}")
    given = dict(item.split("=", 1) for item in args.costs.split(",")) if args.costs else {}
    try:
        args.costs = {kind: float(given.get(kind, DEFAULT_COSTS.get(kind, np.nan)))
                      for kind in [*args.fast, "slow"]}
    except ValueError as exc:
        parser.error(f"--costs: {exc}")
    missing = [kind for kind, cost in args.costs.items() if not np.isfinite(cost)]
    if missing:
        parser.error(f"--costs: no cost for {missing} (e.g. --costs {missing[0]}=1.0)")
    if args.draws < 1:
        parser.error(f"--draws must be at least 1, got {args.draws}")
    from calibration.block_cost import BlockCostPromise

    try:
        BlockCostPromise(share=args.cost_share, block=args.cost_block, delta=args.cost_delta)
    except ValueError as exc:
        parser.error(f"--{str(exc).split()[0].replace('_', '-')}: {exc}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from joblib import Parallel, delayed

    args = parse_args(argv)
    started = time.perf_counter()
    fast = sorted(args.fast, key=lambda kind: args.costs[kind])  # the cascade reads cheapest first
    y, reads = pool_reads(args, sorted({*fast, args.slow}))
    labelled = args.labelled if args.labelled is not None else min(4000, len(y) // 2 - 1)
    if not 0 < labelled < len(y) // 2:
        sys.exit(f"--labelled must be in (0, {len(y) // 2}), got {labelled}")
    targets = [float(t) for t in args.targets.split(",")]
    work = (delayed(one_draw)(reads, y, fast=fast, slow=args.slow, costs=args.costs,
                              labelled=labelled, targets=targets, delta=args.delta,
                              calibrator=args.calibrator, seed=args.seed + 1000 + draw,
                              mapie=not args.no_mapie,
                              cost=(args.cost_share, args.cost_block, args.cost_delta))
            for draw in range(args.draws))
    draws = list(Parallel(n_jobs=1)(work))
    names = [*fast, f"{args.slow} (slow)"]
    report = {"tiers": names,
              "cost_promise": {"share": args.cost_share, "block": args.cost_block,
                               "delta": args.cost_delta},
              "targets": summary(draws, names=names, fast=fast, delta=args.delta,
                                 slow_cost=args.costs["slow"])}
    show(report, costs=args.costs, elapsed_s=time.perf_counter() - started, rows=len(y),
         labelled=labelled)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    print(json.dumps(report))
    return report


def show(report: dict[str, Any], *, costs: dict[str, float], elapsed_s: float, rows: int,
         labelled: int) -> None:
    print(f"pool {rows} rows, {labelled} labelled per draw; costs {costs}; {elapsed_s:.0f} s",
          file=sys.stderr)
    for key, per in report["targets"].items():
        print(f"target {key}: cascade cost {per['expected_cost']} (violations "
              f"{per['violation_rate']:.3f}, coverage {per['coverage_by_tier']}); best single "
              f"tier {per['best_single_tier']} {per['best_single_tier_cost']} (saving "
              f"{per['saving_vs_best_single_tier_pct']}%); slow only {per['slow_only_cost']}; "
              f"singles {per['single_tiers']}; MAPIE {per['mapie']}", file=sys.stderr)
        if "note" in per:
            print(f"target {key}: {per['note']}", file=sys.stderr)
        if "cost_promise" in per:
            paired = per["cost_promise"]["cascade"]
            print(f"target {key}, with the cost promise {report['cost_promise']}: claimed in "
                  f"{paired['claimed_rate']:.2f} of draws; accuracy violations "
                  f"{paired['accuracy_violation_rate']:.3f} (delta {per['delta']}), blocks past "
                  f"the share {paired['block_violation_rate']} of {paired['blocks']}; "
                  f"coverage where claimed {paired['coverage_when_claimed']} (accuracy alone "
                  f"{paired['coverage_accuracy_alone']}); singles "
                  f"{per['cost_promise']['single_tiers']}", file=sys.stderr)


if __name__ == "__main__":
    main()
