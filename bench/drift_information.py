"""How much label-free evidence a novel class leaves in the fast tier's confidences: the
Kullback-Leibler divergence, per decision, between traffic with a share ``s`` of intents the
model never learnt and traffic without them, on the confidences' ranks against the tuning rows
(what the traffic detector bets on), and what it adds up to over ``bench.watch``'s slow drift
(the novel share rising linearly from 0 to 50% over 5,000 rows).

No bet gains more log-wealth, in expectation, than this divergence per decision from traffic
that follows these distributions (it is the growth rate of the log-optimal bet, which knows
both), and a detector whose false-trip average run length is ``arl`` needs about ``log(arl)``
of evidence to trip (Lorden's bound, for large ``arl``). So the rows by which the summed
divergence reaches ``log(arl)`` estimate the fewest rows any such detector needs. The distributions are estimated by histograms of
the ranks (40 bins, half a count added to each), on ``bench.watch``'s novel-class rows.

    python -m bench.drift_information [--out bench/results/drift_information.json]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS_DIR, ROOT, finite, machine_info, print_table, save_json

BINS = 40
SHARES = (0.025, 0.05, 0.1, 0.25)
ARL = 100_000.0  # the traffic detector's (router/monitoring/watch.py, alarm_alpha 0.05)


def divergence(known: np.ndarray, novel: np.ndarray, share: float) -> float:
    """KL(mix || known) in nats per decision, mix = (1 - share) known + share novel, on
    histograms of the ranks."""
    edges = np.linspace(0.0, 1.0, BINS + 1)
    k = np.histogram(known, edges)[0] + 0.5
    n = np.histogram(novel, edges)[0] + 0.5
    k, n = k / k.sum(), n / n.sum()
    mix = (1.0 - share) * k + share * n
    return float(np.sum(mix * np.log(mix / k)))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    default_data = Path(os.environ.get("SLOTGATE_DATA_DIR", ROOT.parent / "shared/data/banking77"))
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=default_data, help="BANKING77 folder")
    parser.add_argument("--work", type=Path, default=ROOT / "var/watch",
                        help="bench.watch's artifact folder (its novel-class model is reused)")
    parser.add_argument("--out", type=Path, default=None,
                        help="result JSON (default: bench/results/drift_information.json)")
    args = parser.parse_args(argv)
    if not (args.data / "train.csv").is_file():
        parser.error(f"--data: BANKING77 not found at {args.data} (the folder with train.csv)")
    from bench.watch import settings_of
    from bench.watch_data import crossfit, novel_split, score, write_csv

    args.work.mkdir(parents=True, exist_ok=True)
    _, fit, unseen, novel_rows = novel_split(args.data, n_novel=10, seed=0)
    built = crossfit(args.work, "novel", write_csv(args.work / "novel-fit.csv", fit),
                     target=0.95, audit_rate=0.1)
    reference = np.sort(np.asarray(settings_of(built.policy).reference))

    def ranks(rows: list[tuple[str, str]]) -> np.ndarray:
        confidence = score(built, rows).confidence
        return (np.searchsorted(reference, confidence) + 0.5) / (len(reference) + 1)

    known, novel = ranks(unseen), ranks(novel_rows)
    per_share = {str(s): finite(divergence(known, novel, s), 5) for s in SHARES}
    # the slow drift: share t / 10,000 at row t after the shift
    cumulative = np.cumsum([divergence(known, novel, t / 10_000) for t in range(1, 5001)])
    level = math.log(ARL)
    reached = np.flatnonzero(cumulative >= level)
    constant = divergence(known, novel, 0.25)
    summed = {str(t): finite(float(cumulative[t - 1]), 3) for t in (250, 500, 1000, 1500, 2000)}
    result: dict[str, Any] = {
        "known_rows": len(known), "novel_rows": len(novel), "bins": BINS,
        "known_mean_rank": finite(float(known.mean()), 4),
        "novel_mean_rank": finite(float(novel.mean()), 4),
        "kl_per_decision_by_share": per_share,
        "slow_drift_cumulative_kl": summed,
        "log_arl": finite(level, 3),
        "slow_drift_rows_to_log_arl_at_least": int(reached[0]) + 1 if reached.size else None,
        "novel_25_rows_to_log_arl_at_least": math.ceil(level / constant),
    }
    print_table("label-free evidence a novel class leaves (KL, nats)", ["what", "value"], [
        *((f"per decision at a novel share of {s}", f"{v or 0.0:.5f}") for s, v in per_share.items()),
        *((f"slow drift, summed over its first {t} rows", f"{v or 0.0:.3f}")
          for t, v in summed.items()),
        (f"rows before the sum can reach log(arl) = {level:.2f}: slow drift",
         result["slow_drift_rows_to_log_arl_at_least"]),
        ("the same at a constant 25% (novel_25)", result["novel_25_rows_to_log_arl_at_least"]),
    ])
    out = args.out or RESULTS_DIR / "drift_information.json"
    payload = {"machine": machine_info(), **result}
    save_json(out, payload)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
