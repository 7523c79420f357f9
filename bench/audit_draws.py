"""Audit draws experiment: at the same audit budget, does drawing audits where the risk is (the
accepted answers least sure, each weighed by its draw probability) reach the accuracy alarm
sooner than a uniform draw? Both tests bet on BANKING77's bench.watch scenarios (the proxy's
PolicyWatch for the uniform draw and its betting accuracy test; an inverse-probability-weighted
version of that test for the risk-weighted draw), audits answered at once with the true label,
no action taken (the delay of the accuracy alarm alone).

    python -m bench.audit_draws [--replays 20] [--out bench/results/audit_draws.json]

Not shipped: the proxy draws audits uniformly until this pays (docs/monitoring.md).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.drift import delay
from bench.drift_data import Scored
from bench.watch import build_scenarios
from bench.watch import parse_args as watch_args
from calibration.betting import JumperBet
from calibration.monitoring import SHORTFALL_FRACTIONS

SCENARIOS = ("crossfit_random", "split_random", "intent_blocks", "rare_shift", "novel_25",
             "slow_drift")


class WeightedShortfallTest(JumperBet):
    """The betting accuracy test on every accepted decision, labelled or not: the error of
    decision i is estimated by ``Z = audited * wrong / pi`` (``pi`` its draw probability), and
    each decision bets ``1 + lam (Z - (1 - target))``. ``E[Z | past]`` is the error rate, so
    while it is at most ``1 - target`` every bet has conditional mean at most 1 (Ville)."""

    def __init__(self, target: float, *, alpha: float, jump: float = 0.01) -> None:
        largest = 1.0 / (1.0 - target)
        super().__init__(tuple(f * largest for f in SHORTFALL_FRACTIONS), alpha=alpha,
                         jump=jump)
        self.allowed = 1.0 - target

    def update(self, *, audited: bool, wrong: bool, pi: float) -> bool:
        z = (1.0 / pi) if audited and wrong else 0.0
        self._bet(z - self.allowed)
        return self.alarm


def draw_probability(accepted_reference: NDArray[np.float64], *, rate: float,
                     floor: float) -> Any:
    """pi(confidence) of an accepted answer: proportional to its risk (1 - confidence), at
    least ``floor`` times the average, scaled so the accepted tuning rows are audited at
    ``rate`` on average; at most 1."""
    risk = max(1e-9, float(np.mean(1.0 - accepted_reference)))

    def raw(c: float) -> float:
        return max(floor, (1.0 - c) / risk)

    norm = float(np.mean([raw(float(c)) for c in accepted_reference]))
    return lambda c: min(1.0, rate * raw(c) / norm)


def replay_both(rows: Scored, order: NDArray[np.int64], settings: Any, *, rate: float,
                floor: float, seed: int) -> dict[str, Any]:
    from router.monitoring.fingerprint import normalised
    from router.monitoring.watch import PolicyWatch

    uniform = PolicyWatch(replace(settings, on_alarm="alert_only", audit_rate=rate, seed=seed))
    pi_of = draw_probability(np.asarray(settings.accepted_reference), rate=rate, floor=floor)
    weighted = WeightedShortfallTest(settings.target_accuracy, alpha=settings.alarm_alpha / 2)
    draws = random.Random(f"weighted:{seed}")
    # Uniform draws at the rate, each label fed to the watch's per-label test (trusted labels')
    uniform_draws = random.Random(f"uniform:{seed}")
    out: dict[str, Any] = {"uniform_row": None, "weighted_row": None, "uniform_audits": 0,
                           "weighted_audits": 0}
    for position, i in enumerate(order):
        accepted = bool(rows.accepted[i])
        counted, _ = uniform.take(float(rows.confidence[i]), accepted=accepted,
                                  key=normalised(rows.texts[i]), now=0.0)
        if not (accepted and counted):
            continue
        if uniform_draws.random() < rate:
            out["uniform_audits"] += 1
            uniform.label(bool(rows.correct[i]))
            if out["uniform_row"] is None and "accuracy" in uniform.alarms:
                out["uniform_row"] = position
        pi = pi_of(float(rows.confidence[i]))
        audited = draws.random() < pi
        out["weighted_audits"] += int(audited)
        if weighted.update(audited=audited, wrong=not rows.correct[i], pi=pi) and (
                out["weighted_row"] is None):
            out["weighted_row"] = position
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--floor", type=float, default=0.25,
                        help="least draw probability, as a share of --rate")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args, rest = parser.parse_known_args(argv)
    wargs = watch_args([*rest, *(["--work", str(args.work)] if args.work else [])])
    results: dict[str, Any] = {}
    for scenario in build_scenarios(wargs):
        if scenario.name not in SCENARIOS:
            continue
        rng = np.random.default_rng(sum(map(ord, scenario.name)))
        runs, shift_at, n_rows = [], None, 0
        for r in range(args.replays):
            order, shift_at = scenario.order(rng)
            n_rows = len(order)
            runs.append(replay_both(scenario.rows, order, scenario.settings, rate=args.rate,
                                    floor=args.floor, seed=r))
        entry: dict[str, Any] = {"kind": scenario.kind, "replays": args.replays}
        for name in ("uniform", "weighted"):
            rows_at = [run[f"{name}_row"] for run in runs]
            entry[f"{name}_audits_mean"] = round(float(np.mean(
                [run[f"{name}_audits"] for run in runs])), 1)
            if scenario.kind == "benign":
                entry[f"{name}_false_alarm_rate"] = float(np.mean([x is not None for x in rows_at]))
            else:
                assert shift_at is not None
                entry[f"{name}_delay_median"] = float(np.median(
                    [delay(x, shift_at, n_rows - shift_at) for x in rows_at]))
        results[scenario.name] = entry
        print(scenario.name, json.dumps(entry), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rate": args.rate, "floor": args.floor,
                                        "scenarios": results}, indent=2) + "\n")
    print(json.dumps({"scenarios": results}))
    return results


if __name__ == "__main__":
    main()
