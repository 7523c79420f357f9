"""Drift benchmark: does slotgate notice, and act, when traffic stops looking like its tuning rows?

BANKING77 where a few intents are rare in the fast model's training and tuning rows; after a
known row, a share of the stream comes from those intents and the fast tier's accepted accuracy
falls below the target. Measured:
  - replays, in-process (the monitoring code the proxy runs, fed row by row): the false-alarm
    rate on unshifted streams and the detection delay after the shift, for slotgate's
    label-free drift alarm plus its audited-accuracy alarm under the policy's action; and,
    under the default ladder (audit_then_escalate: the traffic trip boosts audits), the
    accuracy alarm on its risk-drawn audits against MAPIE's RiskMonitoring on uniform audits
    at the same rate (it reads its labels as a uniform sample);
  - one live run: the proxy under uvicorn (TF-IDF fast tier, the stand-in LLM as slow model and
    auditor, audits on, on_alarm: escalate_all) taking the shifted stream through the OpenAI SDK;
    wrong fast answers served after the shift, against the same stream with alarms ignored.

    python -m bench.drift [--quick] [--out bench/results/drift.json]

The stand-in slow model answers with the dataset's label (an oracle): audit labels are true
labels here; with a real LLM they measure agreement with it. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench import common
from bench.common import ROOT, finite, machine_info, print_table, save_json
from bench.drift_data import Scored, build, score, split
from bench.drift_live import live_run


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if not (args.data / "train.csv").is_file():
        sys.exit(f"BANKING77 not found at {args.data}: pass --data DIR (the folder with train.csv)")
    from policies.file import load_policy
    from router.monitoring.watch import WatchSettings

    parts = split(args.data, n_rare=args.rare_intents, rare_keep=args.rare_keep, seed=args.seed)
    model_path, policy_path = build(args.work, parts, target=args.target_accuracy, delta=0.05,
                                    audit_rate=args.audit_rate, seed=args.seed)
    policy = load_policy(policy_path)
    rows = concat(score(model_path, policy, parts.options, parts.stream),
                  score(model_path, policy, parts.options, parts.shift))
    n_stream = len(parts.stream)
    settings = WatchSettings.of(policy)
    n_pre, n_post = args.pre_rows, args.post_rows

    # Each stream twice: under the policy's action, and under the default ladder
    # (audit_then_escalate: the trip raises the audit rate to audit_boost; draws go on after its
    # alarm), where the accuracy alarm and MAPIE get the same audit budget: the watch its risk
    # draws, MAPIE uniform ones at the same rate.
    null_alarms = null_escalations = mapie_null_alarms = accuracy_null_alarms = 0
    for r in range(args.null_replays):
        order = np.random.default_rng(10_000 + r).permutation(n_stream)[:n_pre + n_post]
        run = replay(rows, order, replace(settings, seed=r))
        quiet = replay(rows, order, replace(settings, seed=r, on_alarm="audit_then_escalate"))
        null_alarms += run["alarm_row"] is not None
        null_escalations += run["escalated_row"] is not None
        accuracy_null_alarms += quiet["accuracy_row"] is not None
        mapie_null_alarms += mapie_alarm_row(quiet, rows, order,
                                             policy.target_accuracy) is not None
    delays, escalations, mapie_delays, accuracy_delays, kinds = [], [], [], [], []
    for r in range(args.shift_replays):
        order = shifted_order(n_stream, len(rows.texts), n_pre=n_pre, n_post=n_post,
                              share=args.shift_share, seed=20_000 + r)
        run = replay(rows, order, replace(settings, seed=r))
        quiet = replay(rows, order, replace(settings, seed=r, on_alarm="audit_then_escalate"))
        delays.append(delay(run["alarm_row"], n_pre, n_post))
        escalations.append(delay(run["escalated_row"], n_pre, n_post))
        kinds.append(run["alarm_kind"])
        accuracy_delays.append(delay(quiet["accuracy_row"], n_pre, n_post))
        mapie_delays.append(delay(mapie_alarm_row(quiet, rows, order, policy.target_accuracy),
                                  n_pre, n_post))

    order = shifted_order(n_stream, len(rows.texts), n_pre=n_pre, n_post=n_post,
                          share=args.shift_share, seed=args.seed)
    post = order[n_pre:]
    no_action_wrong = int((rows.accepted[post] & ~rows.correct[post]).sum())
    live = live_run(args.work, model_path, policy_path, rows, order, n_pre=n_pre,
                    concurrency=args.concurrency)
    result = {
        "replays": args.null_replays,
        "false_alarm_rate": null_alarms / args.null_replays,
        "false_escalation_rate": null_escalations / args.null_replays,
        "alarm_alpha": policy.alarm_alpha,
        "mapie_false_alarm_rate": mapie_null_alarms / args.null_replays,
        "shift_replays": args.shift_replays,
        "detection_delay_median": float(np.median(delays)),
        "detected_share": float(np.mean([d <= n_post for d in delays])),
        # the policy's action (on_alarm: escalate_all): an alarm, or the traffic test's trip
        "escalation_delay_median": float(np.median(escalations)),
        "escalated_share": float(np.mean([d <= n_post for d in escalations])),
        "alarm_kinds": dict(sorted(Counter(map(str, kinds)).items())),
        # under the default ladder: the accuracy alarm on its risk-drawn audits (MAPIE's
        # figures below: on uniform draws at the same rate, from the same replays)
        "accuracy_false_alarm_rate_ladder": accuracy_null_alarms / args.null_replays,
        "accuracy_delay_median_ladder": float(np.median(accuracy_delays)),
        "accuracy_detected_share_ladder": float(np.mean([d <= n_post
                                                         for d in accuracy_delays])),
        "mapie_detection_delay_median": float(np.median(mapie_delays)),
        "mapie_detected_share": float(np.mean([d <= n_post for d in mapie_delays])),
        "delay_when_missed": n_post + 1,  # a replay with no alarm in the window counts so
        "pre_shift_rows": n_pre,
        "post_shift_rows": n_post,
        "shift_share": args.shift_share,
        "rare_intents": parts.rare,
        "target": policy.target_accuracy,
        "audit_rate": policy.audit_rate,
        "tuning_accept_share": finite(policy.coverage, 4),
        "accept_share_before_shift": finite(float(rows.accepted[order[:n_pre]].mean()), 4),
        "accept_share_after_shift": finite(float(rows.accepted[post].mean()), 4),
        "accepted_accuracy_before_shift": finite(accepted_accuracy(rows, order[:n_pre]), 4),
        "accepted_accuracy_after_shift_no_action": finite(accepted_accuracy(rows, post), 4),
        "wrong_accepted_after_shift_no_action": no_action_wrong,
        **live,
    }
    result["with_action_share_of_no_action"] = finite(
        result["wrong_accepted_after_shift_with_action"] / max(1, no_action_wrong), 4)
    print_table("drift: alarms and their action", ["what", "slotgate", "MAPIE RiskMonitoring"], [
        ("false-alarm rate (unshifted replays)", f"{result['false_alarm_rate']:.3f}",
         f"{result['mapie_false_alarm_rate']:.3f}"),
        ("median detection delay (rows; under the policy's action)",
         result["detection_delay_median"],
         result["mapie_detection_delay_median"]),
        ("median rows to escalation (alarm or traffic trip)", result["escalation_delay_median"],
         "-"),
        ("default ladder: accuracy alarm's false-alarm rate",
         f"{result['accuracy_false_alarm_rate_ladder']:.3f}",
         f"{result['mapie_false_alarm_rate']:.3f}"),
        ("default ladder: median rows to the accuracy alarm",
         result["accuracy_delay_median_ladder"], result["mapie_detection_delay_median"]),
        ("default ladder: replays with an accuracy alarm in the window",
         result["accuracy_detected_share_ladder"], result["mapie_detected_share"]),
        ("replays detected within the window", result["detected_share"],
         result["mapie_detected_share"]),
        ("wrong fast answers after the shift", (f"{result['wrong_accepted_after_shift_with_action']}"
         f" (alarms ignored: {no_action_wrong})"), "-"),
    ])
    out = args.out or (None if args.quick else common.result_path(
        "drift.json", recorded=common.is_default_data(args.data)))  # else bench/results/local/
    payload = {"machine": machine_info(), "quick": args.quick, **result}
    if out is not None:
        out = save_json(out, payload)
    print(json.dumps(result))
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    default_data = Path(os.environ.get("SLOTGATE_DATA_DIR", ROOT.parent / "shared/data/banking77"))
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer replays, a shorter stream")
    parser.add_argument("--data", type=Path, default=default_data, help="BANKING77 folder")
    parser.add_argument("--work", type=Path, default=ROOT / "var/drift", help="artifact folder")
    parser.add_argument("--out", type=Path, default=None,
                        help="result JSON (default: bench/results/drift.json, none with --quick)")
    parser.add_argument("--target-accuracy", type=float, default=0.95)
    parser.add_argument("--audit-rate", type=float, default=0.1)
    parser.add_argument("--rare-intents", type=int, default=10)
    parser.add_argument("--rare-keep", type=float, default=0.05,
                        help="share of the rare intents' rows left among the tuning rows")
    parser.add_argument("--shift-share", type=float, default=0.3,
                        help="share of rows after the shift drawn from the rare intents")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.pre_rows, args.post_rows = (500, 1500) if args.quick else (1000, 2000)
    args.null_replays, args.shift_replays = (100, 40) if args.quick else (300, 100)
    return args


def concat(a: Scored, b: Scored) -> Scored:
    return Scored(a.texts + b.texts, a.labels + b.labels, a.answers + b.answers,
                  np.concatenate([a.confidence, b.confidence]),
                  np.concatenate([a.accepted, b.accepted]), np.concatenate([a.correct, b.correct]))


def shifted_order(n_stream: int, n_all: int, *, n_pre: int, n_post: int, share: float,
                  seed: int) -> NDArray[np.int64]:
    """Row indices: ``n_pre`` unshifted rows, then ``n_post`` rows of which each is a shift-pool
    row with probability ``share``; no row twice."""
    rng = np.random.default_rng(seed)
    stream = rng.permutation(n_stream)
    pool = n_stream + rng.permutation(n_all - n_stream)
    from_shift = rng.random(n_post) < share
    n_shift = int(from_shift.sum())
    if n_shift > len(pool) or n_pre + n_post - n_shift > n_stream:
        raise ValueError("too few rows for this stream: lower --post-rows or --shift-share")
    post = np.empty(n_post, dtype=np.int64)
    post[from_shift] = pool[:n_shift]
    post[~from_shift] = stream[n_pre:n_pre + n_post - n_shift]
    return np.concatenate([stream[:n_pre], post])


def replay(rows: Scored, order: NDArray[np.int64], settings: Any) -> dict[str, Any]:
    """The proxy's monitoring fed row by row, audits answered at once with the true label.
    Audit draws go on after an alarm as if no action were taken (``labelled``). A peer that
    reads its labels as a uniform sample (MAPIE) gets its own (``uniform``): each accepted row
    drawn at the watch's audit rate of the moment, by its own seeded draw, so it has the same
    expected labels and is never starved of them by slotgate's escalation."""
    from router.monitoring.watch import PolicyWatch

    watch = PolicyWatch(settings)
    peer = random.Random(f"uniform:{settings.seed}")
    labelled: list[int] = []  # positions in ``order`` of accepted rows drawn for an audit
    uniform: list[int] = []  # ... drawn uniformly, for the peer
    alarm_row = escalated_row = accuracy_row = None
    for position, i in enumerate(order):
        accepted = bool(rows.accepted[i])
        if accepted and peer.random() < watch.audit_rate:
            uniform.append(position)
        watch.observe(float(rows.confidence[i]), accepted=accepted)
        draw = watch.draw(float(rows.confidence[i]))[0] if accepted else None
        if draw is not None:
            labelled.append(position)
            # escalated decisions are not audited: their draws are bet on as unlabelled
            watch.audited(draw.ticket, None if watch.gate.escalate else bool(rows.correct[i]))
        if alarm_row is None and watch.alarm is not None:
            alarm_row = position
        if accuracy_row is None and "accuracy" in watch.alarms:
            accuracy_row = position
        if escalated_row is None and watch.gate.escalate:
            escalated_row = position
    return {"alarm_row": alarm_row, "accuracy_row": accuracy_row, "labelled": labelled,
            "uniform": uniform,
            "escalated_row": escalated_row,
            "alarm_kind": None if watch.alarm is None else watch.alarm.kind}


def mapie_alarm_row(run: dict[str, Any], rows: Scored, order: NDArray[np.int64],
                    target: float) -> int | None:
    """MAPIE's RiskMonitoring on a replay's uniform labels (``uniform``: it reads its labels as
    a uniform sample, which slotgate's risk-drawn audits are not), alarmed once its online lower
    bound on the error rate passes 1 - target (the promise slotgate's accuracy alarm checks)."""
    from mapie.exchangeability_testing import RiskMonitoring

    positions = run["uniform"]
    if not positions:
        return None
    index = order[positions]
    monitor = RiskMonitoring(risk="accuracy", threshold=1.0 - target, warn=False)
    monitor.update(np.array(rows.labels, dtype=object)[index],
                   np.array(rows.answers, dtype=object)[index])
    crossed = np.flatnonzero(monitor.online_risk_lower_bound_sequence_history > monitor.threshold)
    return int(positions[int(crossed[0])]) if crossed.size else None


def delay(alarm_row: int | None, n_pre: int, n_post: int) -> float:
    """Rows after the shift until the alarm; a miss counts as the whole window plus one (so a
    median over replays stays defined), an alarm before the shift as 0."""
    if alarm_row is None:
        return float(n_post + 1)
    return float(max(0, alarm_row - n_pre + 1))


def accepted_accuracy(rows: Scored, index: NDArray[np.int64]) -> float:
    accepted = rows.accepted[index]
    return float(rows.correct[index][accepted].mean()) if accepted.any() else float("nan")


if __name__ == "__main__":
    main()
