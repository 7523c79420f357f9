"""The smallest break of the accuracy promise the watch detects, by audit rate and by test: a
per-decision simulation on the README policy's own calibrated probabilities.

The policy is the Makefile's var/policy.json recipe (TF-IDF trained on BANKING77's train.csv,
5-fold out-of-fold reads, tuned at target 0.95), built into ``--work``; its reads of test.csv
(never seen in training or tuning) give each decision a calibrated confidence and the policy's
verdict. A run draws decisions from those reads (with replacement, seeded); an accepted answer is
wrong with a probability set by the stream's accepted accuracy and its break profile:

- ``even``: every accepted answer's calibrated risk ``1 - c`` shifted by the same amount;
- ``low``: only the least sure quarter of the accepted answers shifted (where a real shift puts
  its errors: a class the model half knows).

Both profiles have the stated accepted accuracy exactly in expectation, so the rows at and above
the target are false alarms. The tests, on the same streams (common random numbers: one draw
decides a uniform audit and a weighted one) and the same horizon:

- ``uniform``: today's proxy, audits drawn uniformly at the audit rate, each label fed to the
  betting accuracy test (``AccuracyShortfallTest``);
- ``ipw_uniform``, ``ppi_uniform``: the per-decision weighted test
  (``calibration.weighted_audits.WeightedShortfallTest``) on uniform draws, without (``eta`` 0)
  and with (``eta`` 1) the confidence as a control variate;
- ``ipw_weighted``, ``ppi_weighted``: the same on audits drawn by ``AuditDesign`` (probability
  ~ each stratum's spread of error around its prediction, learnt from the run's own labels, a
  ``--floor`` share of the rate at least; the strata from the policy's accepted tuning rows), at
  the same expected audit share (``Designs``: one learning design per run, redrawn every
  ``REDESIGN`` decisions from the labels before them);
- ``audit_draws``: bench.audit_draws' attempt, on its own draws (probability ~ 1 - c, a
  ``--floor`` share of the average at least) and its test (the per-label test's stakes and
  jumps, on every decision's inverse-probability-weighted error).

Each test runs at ``3 alarm_alpha / 8``, the share the live watch gives its test on every audit
since it started (``router.monitoring.watch``). The tests' wealth is computed for all runs at once (``Jumpers``: the jumper's arithmetic on numpy
arrays; tests/bench/test_break_power.py checks it against the library classes step by step).

    python -m bench.break_power [--quick] [--runs 500] [--edge-runs 1000] [--horizon 20000]
        [--data DIR] [--work var/break_power] [--out bench/results/break_power.json]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.audit_draws import draw_probability
from bench.common import (
    ROOT,
    default_data_dir,
    finite,
    is_default_data,
    machine_info,
    print_table,
    result_path,
    save_json,
)
from bench.many_runs import Designs, Jumpers
from calibration.monitoring import SHORTFALL_FRACTIONS
from calibration.weighted_audits import (
    DESIGN_PRIOR_LABELS,
    Q_CAP,
    RISK_EDGES,
    WEIGHTED_GAPS,
    WEIGHTED_JUMP,
    AuditDesign,
)

ACCURACIES = (0.96, 0.95, 0.94, 0.93, 0.92, 0.90)
AUDIT_RATES = (0.1, 0.25, 0.5, 0.75, 1.0)
PROFILES = ("low", "even")
# name -> (the draws its labels come from, eta); eta nan: not the PPI test (``uniform``: the
# proxy's per-label test; ``audit_draws``: bench.audit_draws' weighted test).
METHODS: dict[str, tuple[str, float]] = {
    "uniform": ("uniform", math.nan), "ipw_uniform": ("uniform", 0.0),
    "ppi_uniform": ("uniform", 1.0), "ipw_weighted": ("weighted", 0.0),
    "ppi_weighted": ("weighted", 1.0), "audit_draws": ("audit_draws", math.nan)}
WEIGHTED = ("ipw_uniform", "ppi_uniform", "ipw_weighted", "ppi_weighted")
LOW_SHARE = 0.25  # the ``low`` profile's share of accepted answers that take the break
CHUNK = 500  # decisions drawn at once
# The learning designs draw from probabilities set afresh every this many decisions (from every
# label before them); the live design sets them at each label.
REDESIGN = 25


@dataclass(frozen=True)
class Reads:
    """The policy's view of test.csv: each read's calibrated confidence and verdict."""

    confidence: NDArray[np.float64]
    accepted: NDArray[np.bool_]
    accepted_reference: tuple[float, ...]  # the policy's accepted tuning rows' confidences

    @property
    def accept_share(self) -> float:
        return float(self.accepted.mean())


def build_reads(data: Path, work: Path, *, target: float) -> Reads:
    """Train and tune as the Makefile's var/policy.json does (once, into ``work``), then read
    test.csv through it."""
    from bench.watch_data import crossfit, read_csv, score
    from policies.file import load_policy
    from router.monitoring.watch_settings import WatchSettings

    work.mkdir(parents=True, exist_ok=True)
    built = crossfit(work, "banking77", data / "train.csv", target=target, audit_rate=0.25)
    scored = score(built, read_csv(data / "test.csv"))
    reference = WatchSettings.of(load_policy(built.policy)).accepted_reference
    if reference is None:
        raise RuntimeError(f"{built.policy} keeps no drift reference: cannot stratify audits")
    return Reads(scored.confidence, scored.accepted, reference)


def wrong_probability(reads: Reads, accuracy: float, profile: str) -> NDArray[np.float64]:
    """Each read's probability of a wrong fast answer: its calibrated risk, shifted (all
    accepted answers, or the least sure ``LOW_SHARE`` of them) so the accepted answers' mean
    accuracy is ``accuracy``."""
    risk = np.clip(1.0 - reads.confidence, 0.0, 1.0)
    accepted = reads.accepted
    shifted = accepted.copy()
    if profile == "low":
        cut = np.quantile(reads.confidence[accepted], LOW_SHARE)
        shifted &= reads.confidence <= cut
    elif profile != "even":
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")

    def mean_error(d: float) -> float:
        p = np.where(shifted, np.clip(risk + d, 0.0, 1.0), risk)
        return float(p[accepted].mean())

    lo, hi = -1.0, 1.0
    if not mean_error(lo) <= 1.0 - accuracy <= mean_error(hi):
        raise ValueError(f"accuracy {accuracy} cannot be reached by the {profile} profile")
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if mean_error(mid) < 1.0 - accuracy else (lo, mid)
    return np.where(shifted, np.clip(risk + hi, 0.0, 1.0), risk)


@dataclass(frozen=True)
class Setting:
    target: float
    alpha: float  # each test's
    rate: float
    floor: float
    horizon: int
    runs: int


def simulate(reads: Reads, p_wrong: NDArray[np.float64], setting: Setting, *,
             seed: int) -> dict[str, dict[str, NDArray[np.int64]]]:
    """Every method on the same ``runs`` streams of ``horizon`` decisions: per method, the
    decision count at the alarm (-1: none) and the labels it had then (at the horizon if none)."""
    rng = np.random.default_rng(seed)
    runs, allowed, rate = setting.runs, 1.0 - setting.target, setting.rate
    uniform = AuditDesign(floor=1.0)
    learnt = Designs(AuditDesign(reads.accepted_reference, floor=setting.floor), runs)
    strata = np.array([AuditDesign.stratum(c) for c in reads.confidence])
    old_pi = draw_probability(np.asarray(reads.accepted_reference), rate=rate,
                              floor=setting.floor)
    fixed_pi = {"uniform": np.full(reads.confidence.size, uniform.probabilities(rate)[0]),
                "audit_draws": np.array([old_pi(float(c)) for c in reads.confidence])}
    raw_risk = np.clip(1.0 - reads.confidence, 0.0, 1.0)
    risk = np.minimum(Q_CAP, raw_risk)
    per_label = Jumpers(runs, [f / allowed for f in SHORTFALL_FRACTIONS], alpha=setting.alpha)
    old = Jumpers(runs, [f / allowed for f in SHORTFALL_FRACTIONS], alpha=setting.alpha)
    per_decision = Jumpers(runs * len(WEIGHTED), np.ones((runs * len(WEIGHTED),
                                                          len(WEIGHTED_GAPS))),
                           alpha=setting.alpha, jump=WEIGHTED_JUMP)
    variance = np.ones(runs * len(WEIGHTED))
    stakes = np.ones((runs * len(WEIGHTED), len(WEIGHTED_GAPS)))
    for j, m in enumerate(WEIGHTED):  # the uniform draws' stakes are fixed
        kind, eta = METHODS[m]
        if kind == "uniform":
            fixed, most = uniform.scale(rate, eta=eta, allowed=allowed)
            variance[j * runs:(j + 1) * runs] = fixed
            stakes[j * runs:(j + 1) * runs] = np.minimum(WEIGHTED_GAPS, fixed / (allowed + most))
    labels = {kind: np.zeros(runs, dtype=np.int64) for kind in ("uniform", "weighted",
                                                                "audit_draws")}
    labels_at = {m: np.full(runs, -1, dtype=np.int64) for m in METHODS}
    alarms = {"uniform": per_label.alarm_at, "audit_draws": old.alarm_at,
              **{m: per_decision.alarm_at[j * runs:(j + 1) * runs]
                 for j, m in enumerate(WEIGHTED)}}
    rows = np.arange(runs)[:, None]
    step = 0
    while step < setting.horizon:
        probs = learnt.probabilities(rate)  # from every label before this block
        for j, m in enumerate(WEIGHTED):
            kind, eta = METHODS[m]
            if kind == "weighted":
                v, loss = learnt.scale(probs, eta=eta, allowed=allowed)
                variance[j * runs:(j + 1) * runs] = v
                stakes[j * runs:(j + 1) * runs] = np.minimum(
                    np.asarray(WEIGHTED_GAPS)[None, :], (v / (allowed + loss))[:, None])
        per_decision.stakes = stakes
        size = min(REDESIGN, setting.horizon - step)
        idx = rng.integers(0, len(reads.confidence), size=(runs, size))
        wrong = rng.random((runs, size)) < p_wrong[idx]
        draw = rng.random((runs, size))  # one draw: each design audits below its pi
        accepted = reads.accepted[idx]
        pis = {**{kind: pi[idx] for kind, pi in fixed_pi.items()},
               "weighted": probs[rows, strata[idx]]}
        drawn = {kind: accepted & (draw < pi) for kind, pi in pis.items()}
        z = [METHODS[m][1] * risk[idx] + drawn[METHODS[m][0]] * (
            wrong - METHODS[m][1] * risk[idx]) / pis[METHODS[m][0]] for m in WEIGHTED]
        edge_weighted = (np.concatenate(z, axis=0) - allowed) / variance[:, None]
        edge_old = drawn["audit_draws"] * wrong / pis["audit_draws"] - allowed
        edge_label = setting.target - (~wrong).astype(np.float64)
        accepted_all = np.tile(accepted, (len(WEIGHTED), 1))
        first = step
        for t in range(size):
            step += 1
            per_label.bet(edge_label[:, t], drawn["uniform"][:, t], step)
            old.bet(edge_old[:, t], accepted[:, t], step)
            per_decision.bet(edge_weighted[:, t], accepted_all[:, t], step)
        got = drawn["weighted"]
        run_of, at = np.nonzero(got)
        learnt.learn(run_of, strata[idx[run_of, at]], wrong[run_of, at], raw_risk[idx[run_of, at]])
        cumulative = {kind: labels[kind][:, None] + np.cumsum(d, axis=1)
                      for kind, d in drawn.items()}
        for m, alarm_at in alarms.items():  # the labels each alarm of this block came with
            new = (alarm_at > first) & (labels_at[m] < 0)
            labels_at[m][new] = cumulative[METHODS[m][0]][new, alarm_at[new] - first - 1]
        for kind in labels:
            labels[kind] = cumulative[kind][:, -1]
        if all((a >= 0).all() for a in alarms.values()):
            break
    # no alarm: the labels the run had at its end
    return {m: {"decision": alarms[m].copy(),
                "labels": np.where(alarms[m] < 0, labels[METHODS[m][0]], labels_at[m])}
            for m in METHODS}


def summarise(found: dict[str, NDArray[np.int64]], horizon: int) -> dict[str, Any]:
    decision, labels = found["decision"], found["labels"]
    hit = decision >= 0
    return {"detected_share": finite(float(hit.mean()), 4),
            "decisions_median": float(np.median(np.where(hit, decision, horizon + 1))),
            "labels_median": float(np.median(np.where(hit, labels, labels + 1))),
            "labels_mean_per_decision": finite(float(labels.sum() / np.where(
                hit, decision, horizon).sum()), 4)}


def binomial_tolerance(bound: float, runs: int) -> float:
    """The bound plus three binomial standard errors at ``runs`` runs: the most a false-alarm
    rate measured over that many runs may show when the true rate is ``bound``."""
    return bound + 3.0 * math.sqrt(bound * (1.0 - bound) / runs)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 20 runs, 3,000 decisions, audit rate 0.25 only")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--alarm-alpha", type=float, default=0.05)
    parser.add_argument("--audit-rate", type=float, default=0.25,
                        help="the rate the targets and the false-alarm check are measured at")
    parser.add_argument("--floor", type=float, default=0.25,
                        help="least weighted draw probability, as a share of the audit rate")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--edge-runs", type=int, default=1000,
                        help="runs at accuracy exactly the target (the false-alarm check)")
    parser.add_argument("--horizon", type=int, default=20_000,
                        help="decisions per run at most (a miss counts as horizon + 1)")
    parser.add_argument("--data", type=Path, default=None, help="BANKING77's folder")
    parser.add_argument("--work", type=Path, default=ROOT / "var" / "break_power",
                        help="where the model and policy are built (once)")
    parser.add_argument("--out", type=Path, default=None,
                        help="result JSON (default: bench/results/break_power.json)")
    args = parser.parse_args(argv)
    check_stream_args(parser, args)
    if args.quick:
        args.runs, args.edge_runs, args.horizon = 20, 50, 3000
    args.data = args.data or default_data_dir()
    return args


def check_stream_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options a stream simulation shares (this one's, bench.auditor_evidence's), checked:
    a bad one exits 2 naming it."""
    for name in ("target", "alarm_alpha", "audit_rate"):
        value = getattr(args, name)
        if not 0.0 < value < 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in (0, 1), got {value}")
    if not 0.0 <= args.floor <= 1.0:
        parser.error(f"--floor must be in [0, 1], got {args.floor}")
    if min(args.runs, args.edge_runs, args.horizon) < 1:
        parser.error("--runs, --edge-runs and --horizon must be at least 1")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    reads = build_reads(args.data, args.work, target=args.target)
    test_alpha = 3 * args.alarm_alpha / 8  # the live watch's test on every audit
    rates = (args.audit_rate,) if args.quick else tuple(sorted({*AUDIT_RATES, args.audit_rate}))
    accuracies = (0.95, 0.92) if args.quick else ACCURACIES
    cells: list[dict[str, Any]] = []
    for rate in rates:
        for accuracy in accuracies:
            for profile in PROFILES:
                setting = Setting(args.target, test_alpha, rate, args.floor, args.horizon,
                                  args.runs)
                found = simulate(reads, wrong_probability(reads, accuracy, profile), setting,
                                 seed=_seed(rate, accuracy, profile))
                for method, got in found.items():
                    cells.append({"audit_rate": rate, "accuracy": accuracy, "profile": profile,
                                  "break_points": finite(100 * (args.target - accuracy), 2),
                                  "method": method, **summarise(got, args.horizon)})
    edge = edge_check(reads, args, test_alpha)
    design = AuditDesign(reads.accepted_reference, floor=args.floor)
    targets = check_targets(cells, edge, args)
    print_tables(cells, rates, accuracies, args)
    result = {"quick": args.quick, "target": args.target, "alarm_alpha": args.alarm_alpha,
              "test_alpha": test_alpha, "floor": args.floor, "runs": args.runs,
              "horizon": args.horizon, "accept_share": finite(reads.accept_share, 4),
              "reads": int(reads.confidence.size), "low_share": LOW_SHARE,
              "design": {"risk_edges": list(RISK_EDGES), "prior_labels": DESIGN_PRIOR_LABELS,
                         "probabilities_before_labels": [
                  finite(p, 4) for p in design.probabilities(args.audit_rate)]},
              "audit_draws_growth": audit_draws_growth(reads, args),
              "edge": edge, "targets": targets, "cells": cells}
    recorded = not args.quick and is_default_data(args.data)
    out = args.out or result_path("break_power.json", recorded=recorded)
    save_json(out, {"machine": machine_info(), **result})
    print(json.dumps({k: v for k, v in result.items() if k != "cells"}))
    return result


def audit_draws_growth(reads: Reads, args: argparse.Namespace) -> dict[str, Any]:
    """bench.audit_draws' bet on one accepted decision, ``1 + lam (A e / pi - allowed)``, at a
    2-point break: its expected log-growth per decision at each of its stakes and at 0.1 (exact,
    over the reads' confidences and error probabilities)."""
    allowed = 1.0 - args.target
    old_pi = draw_probability(np.asarray(reads.accepted_reference), rate=args.audit_rate,
                              floor=args.floor)
    accepted = reads.accepted
    pi = np.array([old_pi(float(c)) for c in reads.confidence[accepted]])
    out: dict[str, Any] = {"accuracy": finite(args.target - 0.02, 4)}
    for profile in PROFILES:
        p = wrong_probability(reads, args.target - 0.02, profile)[accepted]
        hit = p * pi  # drawn and wrong
        out[profile] = {f"{lam:g}": finite(float(np.mean(
            hit * np.log1p(lam * (1.0 / pi - allowed)) + (1.0 - hit) * np.log1p(-lam * allowed))),
            6) for lam in (*(f / allowed for f in SHORTFALL_FRACTIONS[1:]), 0.1)}
    return out


def edge_check(reads: Reads, args: argparse.Namespace, test_alpha: float) -> dict[str, Any]:
    """False alarms at accuracy exactly the target, ``--edge-runs`` runs per profile."""
    out: dict[str, Any] = {"runs": args.edge_runs, "bound": test_alpha,
                           "tolerance": finite(binomial_tolerance(test_alpha, args.edge_runs), 4)}
    for profile in PROFILES:
        setting = Setting(args.target, test_alpha, args.audit_rate, args.floor, args.horizon,
                          args.edge_runs)
        found = simulate(reads, wrong_probability(reads, args.target, profile), setting,
                         seed=_seed(args.audit_rate, args.target, profile) + 1)
        out[profile] = {m: finite(float((got["decision"] >= 0).mean()), 4)
                        for m, got in found.items()}
    return out


def check_targets(cells: list[dict[str, Any]], edge: dict[str, Any],
                  args: argparse.Namespace) -> dict[str, Any]:
    """The targets at ``--audit-rate``, per method and profile: the 2-point break in a median of
    at most 500 labels and the 3-point one in at most 200, each alarmed in at least 90% of runs
    (None where the run had no such cell), and false alarms at the edge within the binomial
    tolerance of ``3 alarm_alpha / 8``."""
    wanted = {"2_points": (2.0, 500.0), "3_points": (3.0, 200.0)}
    out: dict[str, Any] = {}
    for method in METHODS:
        for profile in PROFILES:
            met: dict[str, bool | None] = {"edge": edge[profile][method] <= edge["tolerance"]}
            for name, (points, most) in wanted.items():
                cell = next((c for c in cells if c["method"] == method and c["profile"] == profile
                             and c["audit_rate"] == args.audit_rate
                             and c["break_points"] == points), None)
                met[name] = None if cell is None else bool(
                    cell["labels_median"] <= most and cell["detected_share"] >= 0.9)
            out[f"{method}/{profile}"] = met
    return out


def print_tables(cells: list[dict[str, Any]], rates: Sequence[float],
                 accuracies: Sequence[float], args: argparse.Namespace) -> None:
    for profile in PROFILES:
        rows = []
        for accuracy in accuracies:
            row: list[Any] = [f"{accuracy:.3f}"]
            for method in METHODS:
                cell = next(c for c in cells if c["method"] == method and c["profile"] == profile
                            and c["audit_rate"] == args.audit_rate and c["accuracy"] == accuracy)
                row.append(f"{cell['labels_median']:g} / {cell['decisions_median']:g} "
                           f"({cell['detected_share']:.2f})")
            rows.append(tuple(row))
        print_table(f"{profile} break, audit rate {args.audit_rate}: median labels / decisions "
                    f"to the alarm (share alarmed within {args.horizon})",
                    ["accepted accuracy", *METHODS], rows)
    for method in ("uniform", "ppi_weighted"):
        rows = []
        for accuracy in accuracies:
            row = [f"{accuracy:.3f}"]
            for rate in rates:
                cell = next(c for c in cells if c["method"] == method and c["profile"] == "low"
                            and c["audit_rate"] == rate and c["accuracy"] == accuracy)
                median = cell["decisions_median"]
                shown = f"> {args.horizon}" if median > args.horizon else f"{median:g}"
                row.append(f"{shown} ({cell['detected_share']:.2f})")
            rows.append(tuple(row))
        print_table(f"{method}, low break: median decisions to the alarm by audit rate",
                    ["accepted accuracy", *(f"rate {r:g}" for r in rates)], rows)


def _seed(rate: float, accuracy: float, profile: str) -> int:
    return round(rate * 1000) * 1_000_003 + round(accuracy * 100_000) + PROFILES.index(profile)


__all__ = ["Reads", "Setting", "check_stream_args", "simulate", "wrong_probability"]

if __name__ == "__main__":
    main()
