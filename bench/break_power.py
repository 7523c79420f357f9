"""The smallest break of the accuracy promise the watch detects, by audit rate, and how many
decisions it takes: a table of audit rate x accepted accuracy -> median decisions to the
accuracy alarm, the share of runs that reach it within the horizon, and the false-alarm rate
where the promise holds (accepted accuracy at the target and above it).

The alarm is the proxy's own accuracy test (``PolicyWatch.shortfall``: alpha = alarm_alpha / 4),
fed 0/1 labels of accepted answers that are right with probability ``accuracy``. A label is
an audit of an accepted decision: with the policy accepting a share ``accept_share`` of the
decisions and auditing a share ``audit rate`` of those, the decisions up to the n-th label are
n plus a negative-binomial count of decisions without one (drawn, seeded, per run). Label-free
tests cannot see a break that leaves confidences as they were (``bench.watch``'s ``novel_5``:
no trip within 4,000 rows), so this is what a break of that size costs to detect.

    python -m bench.break_power [--runs 40] [--horizon 20000] [--out bench/results/break_power.json]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS_DIR, finite, machine_info, print_table, save_json

ACCURACIES = (0.96, 0.95, 0.945, 0.94, 0.93, 0.92, 0.90)
AUDIT_RATES = (0.1, 0.25, 0.5, 0.75, 1.0)


def labels_to_alarm(accuracy: float, *, target: float, alarm_alpha: float, cap: int,
                    seed: int) -> int | None:
    """Labels the watch's accuracy test takes to alarm (None: not within ``cap``)."""
    from router.monitoring.watch import PolicyWatch, WatchSettings

    watch = PolicyWatch(WatchSettings(policy_id="break", target_accuracy=target,
                                      alarm_alpha=alarm_alpha))
    draw = random.Random(seed)
    for n in range(1, cap + 1):
        if watch.label(draw.random() < accuracy) is not None:
            return n
    return None


def decisions_for(labels: int, *, rate: float, rng: np.random.Generator) -> int:
    """Decisions up to and including the ``labels``-th label when each is labelled with
    probability ``rate`` (accepted and audited), independently."""
    return labels + int(rng.negative_binomial(labels, rate)) if rate < 1.0 else labels


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--alarm-alpha", type=float, default=0.05)
    parser.add_argument("--accept-share", type=float, default=0.8,
                        help="share of decisions the policy accepts (bench.watch: 0.6 to 0.85)")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--horizon", type=int, default=20_000,
                        help="decisions per run at most (a miss counts as horizon + 1)")
    parser.add_argument("--out", type=Path, default=None,
                        help="result JSON (default: bench/results/break_power.json)")
    args = parser.parse_args(argv)
    for name in ("target", "alarm_alpha", "accept_share"):
        value = getattr(args, name)
        if not 0.0 < value < 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in (0, 1), got {value}")
    if args.runs < 1 or args.horizon < 1:
        parser.error("--runs and --horizon must be at least 1")
    cap = int(np.ceil(args.horizon * args.accept_share * max(AUDIT_RATES)))  # labels at most
    cells: list[dict[str, Any]] = []
    for accuracy in ACCURACIES:
        found = [labels_to_alarm(accuracy, target=args.target, alarm_alpha=args.alarm_alpha,
                                 cap=cap, seed=run) for run in range(args.runs)]
        for rate in AUDIT_RATES:
            rng = np.random.default_rng([run_seed(accuracy), int(rate * 1000)])
            rows = [None if n is None else decisions_for(n, rate=rate * args.accept_share,
                                                         rng=rng) for n in found]
            hits = [r for r in rows if r is not None and r <= args.horizon]
            cells.append({
                "accuracy": accuracy, "break_points": finite(100 * (args.target - accuracy), 2),
                "audit_rate": rate, "detected_share": finite(len(hits) / args.runs, 4),
                "decisions_median": float(np.median(
                    [args.horizon + 1 if r is None or r > args.horizon else r for r in rows])),
                "labels_median": float(np.median([cap + 1 if n is None else n for n in found])),
            })
    table_rows = []
    for accuracy in ACCURACIES:
        row: list[Any] = [f"{accuracy:.3f}"]
        for rate in AUDIT_RATES:
            cell = next(c for c in cells if c["accuracy"] == accuracy and c["audit_rate"] == rate)
            median = cell["decisions_median"]
            shown = f"> {args.horizon}" if median > args.horizon else f"{median:g}"
            row.append(f"{shown} ({cell['detected_share']:.2f})")
        table_rows.append(tuple(row))
    print_table(f"decisions to the accuracy alarm, median (share alarmed within {args.horizon}); "
                f"target {args.target}, accept share {args.accept_share}",
                ["accepted accuracy", *(f"audit rate {r:g}" for r in AUDIT_RATES)], table_rows)
    result = {"target": args.target, "alarm_alpha": args.alarm_alpha,
              "test_alpha": args.alarm_alpha / 4, "accept_share": args.accept_share,
              "runs": args.runs, "horizon": args.horizon, "cells": cells}
    out = args.out or RESULTS_DIR / "break_power.json"
    payload = {"machine": machine_info(), **result}
    save_json(out, payload)
    print(json.dumps(result))
    return result


def run_seed(accuracy: float) -> int:
    return round(accuracy * 100_000)


if __name__ == "__main__":
    main()
