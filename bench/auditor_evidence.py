"""Whether the slow model's audit answers are evidence about accepted accuracy, measured with
real models on BANKING77: how far agreement with an auditor is from the truth, what the accuracy
alarm does when fed audits as labels, and the two-phase correction by a few trusted labels.

The fast tier is bench.break_power's: the README policy (TF-IDF, 5-fold out-of-fold reads, tuned
at ``--target``, built into ``--work``) reading BANKING77's test.csv, each read with its
calibrated confidence, the policy's verdict, its answer and the true label. The auditors stand
in for the slow model: classifiers trained on train.csv apart from the fast tier
(``bench.auditor_data.AUDITORS``: a kNN on word TF-IDF, wordllama and MiniLM embeddings with
logistic regression), each answering the same test rows. An audit counts the fast answer right
when the auditor gives the same answer.

1. **Agreement vs accuracy** on the accepted test reads: the share where fast == auditor against
   the share where fast == truth, overall and by band of calibrated risk, split into the fast
   errors the auditor repeats (counted right) and the right answers it contradicts (counted
   wrong).
2. **The alarm on audit labels**: ``WeightedShortfallTest`` on ``AuditDesign``'s draws (rate
   ``--audit-rate``, ``eta`` 1: bench.break_power's ``ppi_weighted``), per decision, the
   decisions drawn from the test reads with replacement. The operating point is set by
   reweighting real reads, never by simulating errors: the accepted reads the fast tier got wrong
   are drawn ``w`` times as often as the others (``even``: all of them; ``low``: those in the
   least sure quarter of the accepted confidences) with ``w`` solved so the accepted accuracy is
   exactly the row's; each drawn read keeps its real fast answer, auditor answers and label.
   ``real`` is the test reads as they are (``w`` 1). ``true`` is the test fed true labels;
   ``audit:<auditor>`` the same draws labelled by the auditor.
3. **Two-phase correction** (``bench.two_phase``): each audit also gets a trusted label with
   probability ``rho``, the estimate ``Z = q + A [(d - q) + B (e - d)/rho] / pi`` (unbiased for
   the true error whatever the auditor), bet with stakes at most ``CAP_SHARE`` of the largest
   that keeps every bet non-negative over every stratum (``two_phase:<auditor>:<rho>``); the
   same with ``d`` replaced by the share of fast errors among the accepted reads of the audit's
   band of risk and verdict (``calibrated:<auditor>:<rho>``, ``audit_errors``: what earlier
   trusted labels of audits would show, here measured on the reads the streams draw from);
   against the trusted labels alone at the same ``rho`` (``trusted:<rho>``, draw probability
   ``pi rho``). The two-phase variances take the mismatch ``E[(e - d)^2]`` per stratum from the
   real accepted reads: they size the stakes only, validity holds whatever they are.

Every test runs at ``alarm_alpha / 4`` on the same streams (common random numbers). Counts: slow
audits (auditor answers used) and trusted labels at the alarm.

    python -m bench.auditor_evidence [--quick] [--data DIR] [--work var/auditor_evidence]
        [--out bench/results/auditor_evidence.json]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.auditor_data import (
    AUDITORS,
    PROFILES,
    Answers,
    agreement,
    audit_errors,
    build_answers,
    by_band,
    stratum_mismatch,
)
from bench.break_power import Setting, binomial_tolerance, check_stream_args
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
from bench.many_runs import Jumpers
from bench.two_phase import (
    CAP_SHARE,
    trusted_only_scale,
    two_phase_estimate,
    two_phase_scale,
)
from calibration.weighted_audits import (
    Q_CAP,
    WEIGHTED_GAPS,
    WEIGHTED_JUMP,
    AuditDesign,
)

ACCURACIES = (0.94, 0.93, 0.92, 0.90)  # the breaks; the target itself is the edge check
RHOS = (0.05, 0.1, 0.25)
LOW_SHARE = 0.25  # the ``low`` profile's least sure share of the accepted reads
CHUNK = 250


@dataclass(frozen=True)
class Method:
    """One test: ``kind`` ``true`` (every audit truly labelled), ``audit`` (the auditor's
    answer as label), ``two_phase`` (its disagreement ``d`` corrected by trusted labels at
    ``rho``), ``calibrated`` (the same with ``d`` replaced by the share of trusted labels that
    found the fast answer wrong among audits of its band and verdict, ``audit_errors``) or
    ``trusted`` (trusted labels alone, at ``rho``)."""

    kind: str
    auditor: str | None = None
    rho: float | None = None

    @property
    def name(self) -> str:
        return ":".join(str(p) for p in (self.kind, self.auditor, self.rho) if p is not None)


def methods(auditors: Sequence[str], rhos: Sequence[float]) -> list[Method]:
    return [Method("true"), *(Method("audit", a) for a in auditors),
            *(Method(k, a, r) for k in ("two_phase", "calibrated") for a in auditors
              for r in rhos),
            *(Method("trusted", rho=r) for r in rhos)]


def stream_weights(answers: Answers, accuracy: float | None, profile: str) -> NDArray[np.float64]:
    """Each read's draw probability: the accepted wrong reads (all, or in the least sure
    ``LOW_SHARE`` of the accepted) weighted ``w``, the rest 1, with ``w`` set so the accepted
    accuracy is ``accuracy`` exactly (None: every read alike)."""
    n = answers.fast.size
    if accuracy is None:
        return np.full(n, 1.0 / n)
    accepted, wrong = answers.reads.accepted, answers.wrong
    shifted = accepted & wrong
    if profile == "low":
        shifted &= answers.reads.confidence <= np.quantile(
            answers.reads.confidence[accepted], LOW_SHARE)
    elif profile != "even":
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    fixed_wrong = float((accepted & wrong & ~shifted).sum())
    right, moved = float((accepted & ~wrong).sum()), float(shifted.sum())
    w = ((1.0 - accuracy) * (right + fixed_wrong) - fixed_wrong) / (accuracy * moved) \
        if moved else -1.0
    if not w > 0.0:
        raise ValueError(f"accuracy {accuracy} cannot be reached by the {profile} profile")
    weights = np.where(shifted, w, 1.0)
    return np.asarray(weights / weights.sum(), dtype=np.float64)


def scales(design: AuditDesign, ms: Sequence[Method], *, rate: float, allowed: float,
           mismatch: dict[str, list[float]], most_error: dict[str, list[float]]
           ) -> dict[str, tuple[float, float]]:
    """Each method's ``(variance, loss)``, as ``WeightedShortfallTest.update`` takes them
    (``mismatch`` and ``most_error``: per ``kind:auditor``, ``stratum_mismatch``)."""
    out = {}
    for m in ms:
        if m.kind in ("true", "audit"):
            out[m.name] = design.scale(rate, eta=1.0, allowed=allowed)
        elif m.kind in ("two_phase", "calibrated") and m.auditor is not None and m.rho:
            out[m.name] = two_phase_scale(design, rate, rho=m.rho, allowed=allowed,
                                          mismatch=mismatch[f"{m.kind}:{m.auditor}"],
                                          most_error=most_error[f"{m.kind}:{m.auditor}"])
        elif m.kind == "trusted" and m.rho is not None:
            out[m.name] = trusted_only_scale(design, rate, rho=m.rho, allowed=allowed)
        else:
            raise ValueError(f"method {m.name!r} is not one this benchmark runs")
    return out


def stakes_of(m: Method, scale: tuple[float, float], allowed: float) -> NDArray[np.float64]:
    """The gaps' stakes ``WEIGHTED_GAPS``, each capped at the largest that keeps the bet
    non-negative (``CAP_SHARE`` of it for the two-phase estimates)."""
    variance, loss = scale
    share = CAP_SHARE if m.kind in ("two_phase", "calibrated") else 1.0
    return np.minimum(WEIGHTED_GAPS, share * variance / (allowed + loss))


def simulate(answers: Answers, probs: NDArray[np.float64], setting: Setting,
             ms: Sequence[Method], scale: dict[str, tuple[float, float]], *,
             seed: int) -> dict[str, dict[str, NDArray[np.int64]]]:
    """Every method on the same ``runs`` streams of ``horizon`` decisions drawn with ``probs``:
    per method, the decision count at the alarm (-1: none), and the slow audits and trusted
    labels it had used then (at the horizon if none). Each bet is
    ``WeightedShortfallTest``'s at the method's ``scale`` (``scales``), the two-phase ones
    staking at most ``CAP_SHARE`` of the cap, as ``TwoPhaseShortfallTest``. A ``calibrated`` method's audit errors are
    ``audit_errors(answers)``, fixed before the streams."""
    rng = np.random.default_rng(seed)
    reads, runs, allowed = answers.reads, setting.runs, 1.0 - setting.target
    design = AuditDesign(reads.accepted_reference, floor=setting.floor)
    strata = np.array([AuditDesign.stratum(c) for c in reads.confidence])
    pi = np.asarray(design.probabilities(setting.rate))[strata]
    q = np.minimum(Q_CAP, np.clip(1.0 - reads.confidence, 0.0, 1.0))
    e = answers.wrong
    d = audit_errors(answers)[0]
    v = np.array([scale[m.name][0] for m in ms])
    stakes = np.stack([stakes_of(m, scale[m.name], allowed) for m in ms])
    jumpers = Jumpers(runs * len(ms), np.repeat(stakes, runs, axis=0), alpha=setting.alpha,
                      jump=WEIGHTED_JUMP)
    column = np.repeat(v, runs)[:, None]
    rhos = sorted({m.rho for m in ms if m.rho is not None})
    # running counts per run: audits ("slow") and audits with a trusted label (per rho)
    counts: dict[Any, NDArray[np.int64]] = {"slow": np.zeros(runs, dtype=np.int64),
                                            **{r: np.zeros(runs, dtype=np.int64) for r in rhos}}
    at = {m.name: {"slow": np.full(runs, -1, dtype=np.int64),
                   "trusted": np.full(runs, -1, dtype=np.int64)} for m in ms}
    step = 0
    while step < setting.horizon:
        size = min(CHUNK, setting.horizon - step)
        idx = rng.choice(probs.size, size=(runs, size), p=probs)
        accepted = reads.accepted[idx]
        audited = accepted & (rng.random((runs, size)) < pi[idx])
        trusted_draw = rng.random((runs, size))  # one draw: B at every rho, apart from A
        said = {a: x[idx] for a, x in d.items()}
        z = [_estimate(m, q[idx], pi[idx], audited, trusted_draw, e[idx], said) for m in ms]
        edge = (np.concatenate(z, axis=0) - allowed) / column
        bets = np.tile(accepted, (len(ms), 1))
        first = step
        for t in range(size):
            step += 1
            jumpers.bet(edge[:, t], bets[:, t], step)
        cumulative: dict[Any, NDArray[np.int64]] = {
            "slow": counts["slow"][:, None] + np.cumsum(audited, axis=1),
                      **{r: counts[r][:, None] + np.cumsum(audited & (trusted_draw < r), axis=1)
                         for r in rhos}}
        for j, m in enumerate(ms):
            alarm_at = jumpers.alarm_at[j * runs:(j + 1) * runs]
            new = (alarm_at > first) & (at[m.name]["slow"] < 0)
            used = _used(m, cumulative)
            for kind in ("slow", "trusted"):
                at[m.name][kind][new] = used[kind][new, alarm_at[new] - first - 1]
        counts = {k: c[:, -1] for k, c in cumulative.items()}
        if (jumpers.alarm_at >= 0).all():
            break
    end = _used_end(ms, counts)
    out = {}
    for j, m in enumerate(ms):
        alarm_at = jumpers.alarm_at[j * runs:(j + 1) * runs].copy()
        out[m.name] = {"decision": alarm_at, **{
            kind: np.where(alarm_at < 0, end[m.name][kind], at[m.name][kind])
            for kind in ("slow", "trusted")}}
    return out


def _estimate(m: Method, q: NDArray[np.float64], pi: NDArray[np.float64],
              audited: NDArray[np.bool_], trusted_draw: NDArray[np.float64],
              e: NDArray[np.bool_], d: dict[str, NDArray[np.float64]]) -> NDArray[np.float64]:
    """Method ``m``'s estimate of each decision's error."""
    if m.kind == "true":
        return np.asarray(q + audited * (e - q) / pi, dtype=np.float64)
    if m.kind == "audit" and m.auditor is not None:
        return np.asarray(q + audited * (d[f"audit:{m.auditor}"] - q) / pi, dtype=np.float64)
    if m.rho is None:
        raise ValueError(f"method {m.name!r} needs a rho")
    trusted = audited & (trusted_draw < m.rho)
    if m.kind in ("two_phase", "calibrated") and m.auditor is not None:
        return two_phase_estimate(q, pi, audited, d[f"{m.kind}:{m.auditor}"], trusted, e,
                                  rho=m.rho)
    return np.asarray(q + trusted * (e - q) / (pi * m.rho), dtype=np.float64)


def _used(m: Method, cumulative: dict[Any, NDArray[np.int64]]) -> dict[str, NDArray[np.int64]]:
    """The slow audits and trusted labels method ``m`` reads, from the running counts of audits
    (``slow``) and of audits with a trusted label (per ``rho``): ``true`` reads every audit as a
    trusted label, ``trusted`` no slow answer."""
    none = np.zeros_like(cumulative["slow"])
    if m.kind == "true":
        return {"slow": none, "trusted": cumulative["slow"]}
    if m.kind == "audit":
        return {"slow": cumulative["slow"], "trusted": none}
    trusted = cumulative[m.rho]
    return {"slow": none if m.kind == "trusted" else cumulative["slow"], "trusted": trusted}


def _used_end(ms: Sequence[Method], counts: dict[Any, NDArray[np.int64]]
              ) -> dict[str, dict[str, NDArray[np.int64]]]:
    return {m.name: {k: v[:, 0] for k, v in _used(m, {
        key: c[:, None] for key, c in counts.items()}).items()} for m in ms}


def summarise(found: dict[str, NDArray[np.int64]], horizon: int) -> dict[str, Any]:
    """Share alarmed within the horizon, and medians (a miss counts the horizon plus one
    decision, its labels plus one) of the decisions, slow audits and trusted labels to it."""
    hit = found["decision"] >= 0
    out: dict[str, Any] = {"detected_share": finite(float(hit.mean()), 4),
                           "decisions_median": float(np.median(
                               np.where(hit, found["decision"], horizon + 1)))}
    for kind in ("slow", "trusted"):
        got = found[kind]
        out[f"{kind}_median"] = float(np.median(np.where(hit | (got == 0), got, got + 1)))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 20 runs, 50 at the edge, 3,000 decisions")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--alarm-alpha", type=float, default=0.05)
    parser.add_argument("--audit-rate", type=float, default=0.25)
    parser.add_argument("--floor", type=float, default=0.25,
                        help="least weighted draw probability, as a share of the audit rate")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--edge-runs", type=int, default=1000,
                        help="runs at accepted accuracy exactly the target, and as read")
    parser.add_argument("--horizon", type=int, default=20_000)
    parser.add_argument("--auditors", default=",".join(AUDITORS),
                        help=f"comma-separated, of {', '.join(AUDITORS)}")
    parser.add_argument("--data", type=Path, default=None, help="BANKING77's folder")
    parser.add_argument("--work", type=Path, default=ROOT / "var" / "auditor_evidence",
                        help="where the fast policy and the auditors' answers are built (once)")
    parser.add_argument("--out", type=Path, default=None,
                        help="result JSON (default: bench/results/auditor_evidence.json)")
    args = parser.parse_args(argv)
    check_stream_args(parser, args)
    args.auditors = tuple(a for a in args.auditors.split(",") if a)
    unknown = [a for a in args.auditors if a not in AUDITORS]
    if unknown or not args.auditors:
        parser.error(f"--auditors must name some of {', '.join(AUDITORS)}, got {unknown}")
    if args.quick:
        args.runs, args.edge_runs, args.horizon = 20, 50, 3000
    args.data = args.data or default_data_dir()
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.process_time()
    answers = build_answers(args.data, args.work, target=args.target, auditors=args.auditors)
    built_s = time.process_time() - started
    allowed, test_alpha = 1.0 - args.target, args.alarm_alpha / 4
    accepted = answers.reads.accepted
    real = agreement(answers, accepted)
    mismatch, most_error = stratum_mismatch(answers)
    design = AuditDesign(answers.reads.accepted_reference, floor=args.floor)
    ms = methods(args.auditors, RHOS)
    scale = scales(design, ms, rate=args.audit_rate, allowed=allowed, mismatch=mismatch,
                   most_error=most_error)

    def run(accuracy: float | None, profile: str, runs: int) -> dict[str, Any]:
        probs = stream_weights(answers, accuracy, profile)
        setting = Setting(args.target, test_alpha, args.audit_rate, args.floor, args.horizon,
                          runs)
        found = simulate(answers, probs, setting, ms, scale, seed=_seed(accuracy, profile))
        return {"accuracy": accuracy, "profile": profile, "runs": runs,
                "agreement": agreement(answers, accepted, probs),
                "methods": {m: summarise(got, args.horizon) for m, got in found.items()}}

    edge = [run(None, "real", args.edge_runs),
            *(run(args.target, p, args.edge_runs) for p in PROFILES)]
    breaks = [run(a, p, args.runs) for p in PROFILES for a in ACCURACIES]
    result = {
        "headline": headline(real, edge, breaks, args.auditors),
        "quick": args.quick, "target": args.target, "alarm_alpha": args.alarm_alpha,
        "test_alpha": test_alpha, "audit_rate": args.audit_rate, "floor": args.floor,
        "runs": args.runs, "edge_runs": args.edge_runs, "horizon": args.horizon,
        "rhos": list(RHOS), "reads": int(accepted.size),
        "accept_share": finite(answers.reads.accept_share, 4),
        "fast_accuracy": finite(1.0 - float(answers.wrong.mean()), 4),
        "auditors": {a: {"what": AUDITORS[a][0], "accuracy": finite(float(
            (answers.auditors[a] == answers.truth).mean()), 4)} for a in args.auditors},
        "agreement": real, "bands": by_band(answers),
        "scales": scale_report(ms, scale, allowed=allowed),
        "edge_tolerance": finite(binomial_tolerance(test_alpha, args.edge_runs), 4),
        "edge": edge, "breaks": breaks,
        "cpu_s": {"build": round(built_s, 1),
                  "total": round(time.process_time() - started, 1)}}
    print_tables(result, ms)
    recorded = not args.quick and is_default_data(args.data)
    out = args.out or result_path("auditor_evidence.json", recorded=recorded)
    save_json(out, {"machine": machine_info(), **result})
    print(json.dumps({k: v for k, v in result.items()
                      if k not in ("breaks", "edge", "bands", "scales")}))
    return result


def headline(real: dict[str, Any], edge: list[dict[str, Any]], breaks: list[dict[str, Any]],
             auditors: Sequence[str]) -> dict[str, Any]:
    """The figures docs/benchmarks.md shows: accepted accuracy and each auditor's agreement, the
    audit-fed alarm's worst false-alarm rate (at the edge or on the reads as they are) and its
    share of runs alarmed at accepted accuracy 0.92 (``low``), against the truth's and the trusted
    labels' (``rho`` 0.1)."""
    three = next((c for c in breaks if c["profile"] == "low" and c["accuracy"] == 0.92), None)
    out: dict[str, Any] = {"accepted_accuracy": real["accuracy"]}
    for a in auditors:
        out[f"agreement {a}"] = real[a]["agreement"]
        out[f"false alarms (edge or as read), audit:{a}"] = max(
            c["methods"][f"audit:{a}"]["detected_share"] for c in edge)
    if three is not None:
        for m in ("true", *(f"audit:{a}" for a in auditors), "trusted:0.1"):
            if m in three["methods"]:
                out[f"alarmed at 0.92 (low), {m}"] = three["methods"][m]["detected_share"]
    return out


def scale_report(ms: Sequence[Method], scale: dict[str, tuple[float, float]], *,
                 allowed: float) -> dict[str, Any]:
    """Per method: the variance its stakes are sized by, the loss bound over every stratum
    (the form ``WeightedShortfallTest.update`` takes) and the stakes (``stakes_of``)."""
    return {m.name: {"variance": finite(scale[m.name][0], 4),
                     "loss_bound": finite(scale[m.name][1], 3),
                     "stakes": [finite(float(g), 6) for g in stakes_of(m, scale[m.name],
                                                                      allowed)]}
            for m in ms}


def print_tables(result: dict[str, Any], ms: Sequence[Method]) -> None:
    auditors = list(result["auditors"])
    rows: list[tuple[Any, ...]] = []
    for band in [{"risk": "all accepted", **result["agreement"]}, *result["bands"]]:
        rows.append((str(band["risk"]), band["n"], f"{band['accuracy']:.4f}", *(
            f"{band[a]['agreement']:.4f} ({band[a]['hidden']:.4f} / {band[a]['false_wrong']:.4f})"
            for a in auditors)))
    print_table("accepted test reads: true accuracy, agreement with each auditor (repeated fast "
                "errors / contradicted right answers, shares)",
                ["risk band", "n", "accuracy", *auditors], rows)
    rows = []
    for m in ms:
        rows.append((m.name, *(f"{cell['methods'][m.name]['detected_share']:.3f}"
                               for cell in result["edge"])))
    print_table(f"alarms within {result['horizon']} decisions (false where the accuracy holds; "
                f"bound {result['test_alpha']}, tolerance {result['edge_tolerance']})",
                ["method", *(f"{c['profile']} {c['agreement']['accuracy']}"
                             for c in result["edge"])], rows)
    for profile in PROFILES:
        cells = [c for c in result["breaks"] if c["profile"] == profile]
        rows = []
        for m in ms:
            rows.append((m.name, *(
                f"{c['methods'][m.name]['slow_median']:g} + {c['methods'][m.name]['trusted_median']:g}"
                f" ({c['methods'][m.name]['detected_share']:.2f})" for c in cells)))
        print_table(f"{profile} break: median slow audits + trusted labels to the alarm (share "
                    f"alarmed within {result['horizon']})",
                    ["method", *(str(c["accuracy"]) for c in cells)], rows)


def _seed(accuracy: float | None, profile: str) -> int:
    return (0 if accuracy is None else round(accuracy * 100_000)) * 10 + (
        PROFILES.index(profile) + 1 if profile in PROFILES else 0)


__all__ = ["Method", "agreement", "methods", "simulate", "stream_weights", "summarise"]

if __name__ == "__main__":
    main()
