"""Watch benchmark: does ordinary traffic leave a policy's watch quiet, and does a harmful shift
trip it, and what does each action (``on_alarm``) then cost and save?

Benign streams (the promise holds; each ``false_alarm_rate`` should be <= alpha = 0.05): the
README's cross-fitted policy on BANKING77 test.csv in random order; a split-tuned policy on the
same; one confident question repeated 1,000 times in 3,000 rows; one popular question at 20% of
traffic; test rows in blocks of one intent (bursts of 40); only the 30 intents the model reads
best (by its out-of-fold accuracy); one unsure message behind a "Ticket #NNNNNN:" prefix (a new
id each time) at 20% of traffic; a campaign of distinct messages the policy never accepts at 50%
of traffic (each under the ladder and under ``escalate_all``, which escalates on the traffic
test's trip). Harmful streams: rare intents becoming common (bench.drift's
data); intents the model never learnt at 25% and at 5% of traffic; the novel share rising
linearly from 0 to 50% over 5,000 rows. Many API keys: the campaign at 50% from one hostile key
among 20 ordinary ones; one key sending copies of 5 unsure messages spelt differently (case,
spacing, punctuation) at 50%; novel_25 spread over 20 keys. Each replay feeds the proxy's PolicyWatch row by row
(texts keyed by the proxy's fingerprint, ``router.monitoring.fingerprint.normalised``: a
templated text counts once; audits answered at once with the true label) under every action, and
MAPIE's RiskMonitoring the audit labels drawn with no action, as bench.drift does. Harmful
scenarios also report when the traffic test (not an alarm: it buys audits) tripped.

    python -m bench.watch [--quick] [--replays N] [--out bench/results/watch.json]

The last line printed is one JSON object ``{"scenarios": {name: {...}}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench import common
from bench.common import ROOT, finite, machine_info, print_table, save_json
from bench.drift import concat, delay, mapie_alarm_row, shifted_order
from bench.drift_data import Scored
from bench.watch_data import Built, novel_split, read_csv, score, split_tuned, write_csv
from bench.watch_streams import in_blocks, mixed, novel_order, with_popular, with_repeats

ACTIONS = ("alert_only", "audit_then_escalate", "escalate_all")
Order = tuple[NDArray[np.int64], int | None]  # row indices, the position of the shift (or None)


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "benign" | "harmful"
    rows: Scored
    settings: Any  # WatchSettings
    order: Callable[[np.random.Generator], Order]
    note: str
    # each row's caller (API key) given the order; None: one caller (a deployment without keys)
    callers: Callable[[np.random.Generator, NDArray[np.int64]], list[str]] | None = None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if not (args.data / "train.csv").is_file():
        sys.exit(f"BANKING77 not found at {args.data}: pass --data DIR (the folder with train.csv)")
    started = time.perf_counter()
    scenarios = build_scenarios(args)
    results = {s.name: run_scenario(s, args.replays, args.target) for s in scenarios}
    results_table(results)
    from bench.watch_cost import decided_us

    cost = decided_us()
    payload = {"machine": machine_info(), "quick": args.quick, "replays": args.replays,
               "target": args.target, "audit_rate": args.audit_rate,
               "watch_cost_us_per_decision": cost,
               "wall_s": round(time.perf_counter() - started, 1), "scenarios": results}
    out = args.out or (None if args.quick else common.result_path(
        "watch.json", recorded=common.is_default_data(args.data)))  # else bench/results/local/
    if out is not None:
        save_json(out, payload)
    print(f"the watch's cost per decision (Monitor.decided, input key included): {cost} us")
    print(json.dumps({"scenarios": results}))
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    default_data = Path(os.environ.get("SLOTGATE_DATA_DIR", ROOT.parent / "shared/data/banking77"))
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="20 replays per scenario instead of 100 (CI)")
    parser.add_argument("--replays", type=int, default=None)
    parser.add_argument("--data", type=Path, default=default_data, help="BANKING77 folder")
    parser.add_argument("--work", type=Path, default=ROOT / "var/watch", help="artifact folder")
    parser.add_argument("--out", type=Path, default=None,
                        help="result JSON (default: bench/results/watch.json, none with --quick)")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--audit-rate", type=float, default=0.1,
                        help="the policies' base audit rate, as bench.drift (the ladder boosts "
                             "it to audit_boost, 0.75)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.replays is None:
        args.replays = 20 if args.quick else 100
    return args


def build_scenarios(args: argparse.Namespace) -> list[Scenario]:
    from bench.watch_data import crossfit

    work, data = args.work, args.data
    work.mkdir(parents=True, exist_ok=True)
    default = crossfit(work, "default", data / "train.csv", target=args.target,
                       audit_rate=args.audit_rate)
    split = split_tuned(work, data / "train.csv", target=args.target, audit_rate=args.audit_rate)
    test = read_csv(data / "test.csv")
    d_rows, s_rows = score(default, test), score(split, test)
    novel, fit, unseen, novel_rows = novel_split(data, n_novel=10, seed=args.seed)
    fit_csv = write_csv(work / "novel-fit.csv", fit)
    novel_model = crossfit(work, "novel", fit_csv, target=args.target,
                           audit_rate=args.audit_rate)
    known, fresh = score(novel_model, unseen), score(novel_model, novel_rows)
    n_rows = concat(known, fresh)
    rare_rows, rare_settings, rare_sizes = rare_intents(args)
    easy = easy_intents(work / "default-oof.jsonl", 30)
    easy_index = np.array([i for i, label in enumerate(d_rows.labels) if label in easy])
    t_rows, n_test = with_tickets(default, test, d_rows, seed=args.seed), len(d_rows.texts)
    unsure = np.flatnonzero(~d_rows.accepted)
    d_set, s_set, n_set = (settings_of(b.policy) for b in (default, split, novel_model))
    nk, nv = len(known.texts), len(fresh.texts)
    f_rows, n_farm = with_variants(default, test, d_rows, seed=args.seed), len(d_rows.texts)
    return [
        Scenario("crossfit_random", "benign", d_rows, d_set,
                 lambda rng: (rng.permutation(len(d_rows.texts)), None),
                 "README policy (train --cv 5, tune on out-of-fold reads), test.csv shuffled"),
        Scenario("split_random", "benign", s_rows, s_set,
                 lambda rng: (rng.permutation(len(s_rows.texts)), None),
                 "split-tuned policy (train --holdout 0.3), test.csv shuffled"),
        Scenario("canary_repeat", "benign", d_rows, d_set,
                 lambda rng: (with_repeats(rng, d_rows, n=3000, repeats=1000), None),
                 "one confident question 1,000 times among 2,000 other test rows"),
        Scenario("popular_20", "benign", d_rows, d_set,
                 lambda rng: (with_popular(rng, d_rows, n=3000, share=0.2), None),
                 "one popular question at 20% of 3,000 rows"),
        Scenario("intent_blocks", "benign", d_rows, d_set,
                 lambda rng: (in_blocks(rng, d_rows.labels), None),
                 "test.csv in blocks of one intent (40 rows each), blocks shuffled"),
        Scenario("easy_mix", "benign", d_rows, d_set,
                 lambda rng: (rng.permutation(easy_index), None),
                 "only the 30 intents with the best out-of-fold accuracy (1,200 test rows)"),
        Scenario("ticket_template_20", "benign", t_rows, d_set,
                 lambda rng: (mixed(rng, np.arange(n_test), np.arange(n_test, len(t_rows.texts)),
                                    n=3000, share=0.2), None),
                 "one unsure message as 'Ticket #NNNNNN: ...' (a new id each time) at 20% of "
                 "3,000 rows"),
        Scenario("unsure_campaign_50", "benign", d_rows, d_set,
                 lambda rng: (mixed(rng, np.setdiff1d(np.arange(n_test), unsure), unsure,
                                    n=min(2000, 2 * len(unsure)), share=0.5), None),
                 "distinct messages the policy never accepts (test rows under its bar) at 50% "
                 "of traffic"),
        Scenario("rare_shift", "harmful", rare_rows, rare_settings,
                 lambda rng: (shifted_order(*rare_sizes, n_pre=1000, n_post=2000, share=0.3,
                                            seed=int(rng.integers(2**31))), 1000),
                 "bench.drift's stream: 10 intents rare in fit and tune rows, 30% after row "
                 "1,000"),
        Scenario("novel_25", "harmful", n_rows, n_set,
                 lambda rng: (novel_order(rng, nk, nv, 1000, np.full(4000, 0.25)), 1000),
                 f"intents never learnt ({len(novel)}) at 25% after row 1,000 (4,000 rows)"),
        Scenario("novel_5", "harmful", n_rows, n_set,
                 lambda rng: (novel_order(rng, nk, nv, 1000, np.full(4000, 0.05)), 1000),
                 "intents never learnt at 5% after row 1,000 (4,000 rows)"),
        Scenario("slow_drift", "harmful", n_rows, n_set,
                 lambda rng: (novel_order(rng, nk, nv, 1000, np.linspace(0, 0.5, 5000)), 1000),
                 "novel share rising linearly from 0 to 50% over 5,000 rows after row 1,000"),
        *key_scenarios(d_rows, d_set, unsure, f_rows, n_farm, n_rows, n_set, nk, nv),
    ]


def key_scenarios(d_rows: Scored, d_set: Any, unsure: NDArray[np.int64], f_rows: Scored,
                  n_test: int, n_rows: Scored, n_set: Any, nk: int,
                  nv: int) -> list[Scenario]:
    """Many API keys: a hostile key among twenty ordinary ones, and a novel class spread over
    twenty keys (each caller's share of the traffic evidence is capped)."""
    ordinary = np.setdiff1d(np.arange(n_test), unsure)
    n_campaign = min(2000, 2 * len(unsure))
    return [
        Scenario("hostile_key_unsure_50", "benign", d_rows, d_set,
                 lambda rng: (mixed(rng, ordinary, unsure, n=n_campaign, share=0.5), None),
                 "unsure_campaign_50's distinct unsure messages all from one key, the rest "
                 "from 20 ordinary keys", callers=hostile_callers(set(unsure.tolist()))),
        Scenario("hostile_key_farm_50", "benign", f_rows, d_set,
                 lambda rng: (mixed(rng, np.arange(n_test), np.arange(n_test, len(f_rows.texts)),
                                    n=3000, share=0.5), None),
                 "one key sending copies of 5 unsure messages that differ by case, spacing "
                 "and punctuation at 50% of 3,000 rows, the rest from 20 ordinary keys",
                 callers=hostile_callers(set(range(n_test, len(f_rows.texts))))),
        Scenario("novel_25_many_keys", "harmful", n_rows, n_set,
                 lambda rng: (novel_order(rng, nk, nv, 1000, np.full(4000, 0.25)), 1000),
                 "novel_25's stream, every row from one of 20 keys at random",
                 callers=lambda rng, order: [f"key-{k}" for k in rng.integers(20, size=len(order))]),
    ]


def hostile_callers(hostile_rows: set[int]) -> Callable[[np.random.Generator, NDArray[np.int64]],
                                                         list[str]]:
    """``hostile`` for the given rows, one of 20 ordinary keys at random for the rest."""
    def callers(rng: np.random.Generator, order: NDArray[np.int64]) -> list[str]:
        keys = rng.integers(20, size=len(order))
        return ["hostile" if int(i) in hostile_rows else f"key-{k}"
                for i, k in zip(order, keys, strict=True)]
    return callers


def with_variants(built: Built, test: list[tuple[str, str]], rows: Scored, *, seed: int,
                  messages: int = 5, copies: int = 400) -> Scored:
    """``rows`` and, after them, ``copies`` spellings of each of ``messages`` test messages the
    policy does not accept (case, spacing, trailing punctuation), scored by the model."""
    rng = np.random.default_rng(seed + 1)
    picked = rng.choice(np.flatnonzero(~rows.accepted), size=messages, replace=False)
    cases = (str.lower, str.upper, str.capitalize, lambda t: t)
    marks = ("!", "?", "...", "?!", ".")
    spelt = []
    for j in picked:
        text, label = test[int(j)]
        for c in range(copies):
            case, mark = cases[c % len(cases)], marks[(c // len(cases)) % len(marks)]
            repeat = 1 + c // (len(cases) * len(marks))
            spelt.append((" " * (c % 2) + case(text) + mark * repeat, label))
    return concat(rows, score(built, spelt))


def settings_of(policy_path: Path) -> Any:
    from policies.file import load_policy
    from router.monitoring.watch import WatchSettings

    return WatchSettings.of(load_policy(policy_path))


def rare_intents(args: argparse.Namespace) -> tuple[Scored, Any, tuple[int, int]]:
    """bench.drift's data and policy (split-tuned on rows where 10 intents are rare)."""
    from bench.drift_data import build, split

    parts = split(args.data, n_rare=10, rare_keep=0.05, seed=args.seed)
    model, policy = build(args.work / "rare", parts, target=args.target, delta=0.05,
                          audit_rate=args.audit_rate, seed=args.seed)
    built = Built("rare", model, policy)
    pairs = [list(zip(r.texts, r.labels, strict=True)) for r in (parts.stream, parts.shift)]
    rows = concat(score(built, pairs[0]), score(built, pairs[1]))
    return rows, settings_of(policy), (len(parts.stream), len(rows.texts))


def easy_intents(oof: Path, n: int) -> set[str]:
    """The ``n`` intents the model reads best out of fold (never the test rows)."""
    right: dict[str, list[bool]] = {}
    with oof.open() as f:
        for line in f:
            row = json.loads(line)
            top = row["options"][int(np.argmax(row["proba"]))]
            right.setdefault(row["label"], []).append(top == row["label"])
    return set(sorted(right, key=lambda k: -float(np.mean(right[k])))[:n])


def with_tickets(built: Built, test: list[tuple[str, str]], rows: Scored, *, seed: int,
                 copies: int = 1000) -> Scored:
    """``rows`` and, after them, ``copies`` of one test message the policy does not accept, each
    behind "Ticket #NNNNNN: " with a new random id, scored by the model (not assumed)."""
    rng = np.random.default_rng(seed)
    text, label = test[int(rng.choice(np.flatnonzero(~rows.accepted)))]
    ids = rng.choice(900_000, size=copies, replace=False) + 100_000
    return concat(rows, score(built, [(f"Ticket #{i}: {text}", label) for i in ids]))


def replay(rows: Scored, order: NDArray[np.int64], settings: Any, action: str,
           shift_at: int | None, callers: Sequence[str] | None = None) -> dict[str, Any]:
    """The proxy's PolicyWatch fed row by row under ``action``, each row from its caller (None:
    one caller): a gated decision escalates (a slow call, never audited), an audited one is a
    slow call too (its label counts at once). ``uniform``: the rows MAPIE, which reads its labels
    as a uniform sample, gets: served new accepted rows drawn by a seeded draw at the audit rate."""
    from router.monitoring.fingerprint import normalised
    from router.monitoring.watch import PolicyWatch

    watch = PolicyWatch(replace(settings, on_alarm=action))
    peer = random.Random(f"uniform:{settings.seed}")
    first_alarm = escalated_from = traffic_row = None
    kind = None
    labelled: list[int] = []
    uniform: list[int] = []
    wrong_after = slow_after = slow_all = 0
    for position, i in enumerate(order):
        gated = watch.gate.escalate
        if gated and escalated_from is None:
            escalated_from = position
        accepted = bool(rows.accepted[i])
        served = accepted and not gated
        counted, _ = watch.take(float(rows.confidence[i]), accepted=accepted,
                                key=normalised(rows.texts[i]), now=0.0,
                                caller="" if callers is None else callers[position])
        draw = None
        if served and counted:
            if peer.random() < watch.audit_rate:
                uniform.append(position)
            draw = watch.draw(float(rows.confidence[i]))[0]
        audited = draw is not None
        if draw is not None:  # drawn by risk, its label bet by the weighted test
            labelled.append(position)
            watch.audited(draw.ticket, bool(rows.correct[i]))
        if first_alarm is None and watch.alarm is not None:
            first_alarm, kind = position, watch.alarm.kind
        if traffic_row is None and watch.traffic_tripped:
            traffic_row = position
        slow = int(not served) + int(audited)
        slow_all += slow
        if shift_at is not None and position >= shift_at:
            wrong_after += int(served and not rows.correct[i])
            slow_after += slow
    return {"alarm_row": first_alarm, "alarm_kind": kind, "escalated_from": escalated_from,
            "traffic_row": traffic_row,
            "traffic_capped": 0 if watch.callers is None else watch.callers.capped,
            "labelled": labelled, "uniform": uniform, "wrong_after": wrong_after,
            "slow_after": slow_after, "slow_all": slow_all}


def run_scenario(scenario: Scenario, replays: int, target: float) -> dict[str, Any]:
    rng = np.random.default_rng(sum(map(ord, scenario.name)))  # seeded per scenario
    actions = ACTIONS if scenario.kind == "harmful" else ("audit_then_escalate", "escalate_all")
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in actions}
    mapie_rows: list[int | None] = []
    wrong_no_action: list[int] = []
    accepted_accuracy: list[float] = []
    n_rows, shift_at = 0, None
    for r in range(replays):
        order, shift_at = scenario.order(rng)
        callers = None if scenario.callers is None else scenario.callers(rng, order)
        n_rows = len(order)
        settings = replace(scenario.settings, seed=r)
        for action in actions:
            runs[action].append(replay(scenario.rows, order, settings, action, shift_at, callers))
        peer_run = runs[actions[0]][-1]  # labels drawn with no action (benign: the ladder's)
        mapie_rows.append(mapie_alarm_row(peer_run, scenario.rows, order, target))
        window = order if shift_at is None else order[shift_at:]
        served = scenario.rows.accepted[window]
        accepted_accuracy.append(float(scenario.rows.correct[window][served].mean()))
        wrong_no_action.append(int((served & ~scenario.rows.correct[window]).sum()))
    result: dict[str, Any] = {"kind": scenario.kind, "note": scenario.note, "replays": replays,
                              "rows": n_rows}
    if scenario.kind == "benign":
        return result | benign_result(runs, mapie_rows, accepted_accuracy)
    assert shift_at is not None
    return result | harmful_result(runs, mapie_rows, accepted_accuracy, wrong_no_action,
                                   n_rows=n_rows, shift_at=shift_at, target=target)


def benign_result(runs: dict[str, list[dict[str, Any]]], mapie_rows: list[int | None],
                  accepted_accuracy: list[float]) -> dict[str, Any]:
    """What a benign scenario's replays cost: false alarms, trips and escalations."""
    ladder = runs["audit_then_escalate"]  # whose audit labels the MAPIE peer was fed
    return {
        "false_alarm_rate": finite(mean([r["alarm_row"] is not None for r in ladder]), 4),
        "false_alarm_kinds": kinds(ladder),
        "traffic_trip_rate": finite(mean([r["traffic_row"] is not None for r in ladder]), 4),
        "false_escalation_rate_audit_then_escalate": finite(
            mean([r["escalated_from"] is not None for r in ladder]), 4),
        # escalate_all escalates on the traffic test's trip: a benign stream's cost
        "false_escalation_rate_escalate_all": finite(
            mean([r["escalated_from"] is not None for r in runs["escalate_all"]]), 4),
        "mapie_false_alarm_rate": finite(mean([m is not None for m in mapie_rows]), 4),
        "accepted_accuracy": finite(mean(accepted_accuracy), 4),
        "slow_calls_audit_then_escalate": finite(mean([r["slow_all"] for r in ladder]), 1),
        # decisions the traffic detector did not rank: their caller's evidence was spent
        "traffic_capped_mean": finite(mean([r["traffic_capped"] for r in ladder]), 1),
    }


def harmful_result(runs: dict[str, list[dict[str, Any]]], mapie_rows: list[int | None],
                   accepted_accuracy: list[float], wrong_no_action: list[int], *, n_rows: int,
                   shift_at: int, target: float) -> dict[str, Any]:
    """How fast a harmful scenario's shift is caught, and the wrong answers each action let by."""
    n_post = n_rows - shift_at
    delays = [delay(r["alarm_row"], shift_at, n_post) for r in runs["alert_only"]]
    escalation = [delay(r["escalated_from"], shift_at, n_post)
                  for r in runs["audit_then_escalate"]]
    no_action = float(np.mean(wrong_no_action))
    result: dict[str, Any] = {
        "shift_at_row": shift_at,
        "detection_delay_median": float(np.median(delays)),
        "detected_share": finite(mean([d <= n_post for d in delays]), 4),
        "alarm_kinds": kinds(runs["alert_only"]),
        "escalation_delay_median_audit_then_escalate": float(np.median(escalation)),
        # the traffic detector's trip (label-free; under the ladder it buys audits and starts
        # the accuracy test that counts labels from the trip on)
        "traffic_trip_delay_median": float(np.median(
            [delay(r["traffic_row"], shift_at, n_post) for r in runs["audit_then_escalate"]])),
        "mapie_detection_delay_median": float(np.median(
            [delay(m, shift_at, n_post) for m in mapie_rows])),
        "delay_when_missed": n_post + 1,
        "accepted_accuracy_after_shift_no_action": finite(mean(accepted_accuracy), 4),
        "promise_broken_share": finite(mean([a < target for a in accepted_accuracy]), 4),
        "wrong_accepted_after_shift_no_action": finite(no_action, 1),
    }
    for action in ("audit_then_escalate", "escalate_all"):
        wrong = float(np.mean([r["wrong_after"] for r in runs[action]]))
        result[f"wrong_accepted_after_shift_with_{action}"] = finite(wrong, 1)
        result[f"with_{action}_share_of_no_action"] = finite(wrong / max(no_action, 1e-9), 4)
    for action in ACTIONS:
        result[f"slow_calls_after_shift_{action}"] = finite(
            np.mean([r["slow_after"] for r in runs[action]]), 1)
    result["wrong_accepted_after_shift_with_action"] = result[
        "wrong_accepted_after_shift_with_audit_then_escalate"]
    return result


def mean(values: Any) -> float:
    return float(np.mean(values))


def kinds(runs: list[dict[str, Any]]) -> dict[str, int]:
    found = [str(r["alarm_kind"]) for r in runs if r["alarm_kind"] is not None]
    return {k: found.count(k) for k in sorted(set(found))}


def results_table(results: dict[str, dict[str, Any]]) -> None:
    rows = []
    for name, r in results.items():
        if r["kind"] == "benign":
            rows.append((name, "benign", f"{r['false_alarm_rate']:.3f}",
                         f"trip rate {r['traffic_trip_rate']:.2f}",
                         f"{r['mapie_false_alarm_rate']:.3f}", f"{r['accepted_accuracy']:.3f}",
                         "-", "-"))
        else:
            rows.append((name, "harmful", f"delay {r['detection_delay_median']:g}",
                         (f"{r['traffic_trip_delay_median']:g} / "
                          f"{r['escalation_delay_median_audit_then_escalate']:g}"),
                         f"delay {r['mapie_detection_delay_median']:g}",
                         f"{r['accepted_accuracy_after_shift_no_action']:.3f}",
                         (f"{r['wrong_accepted_after_shift_no_action']:g} / "
                         f"{r['wrong_accepted_after_shift_with_audit_then_escalate']:g} / "
                         f"{r['wrong_accepted_after_shift_with_escalate_all']:g}"),
                         (f"{r['slow_calls_after_shift_alert_only']:g} / "
                         f"{r['slow_calls_after_shift_audit_then_escalate']:g} / "
                         f"{r['slow_calls_after_shift_escalate_all']:g}")))
    print_table("watch: false alarms on benign streams, detection and action on harmful ones", [
        "scenario", "kind", "slotgate: false-alarm rate / median delay",
        "traffic trip / ladder escalation, median rows", "MAPIE RiskMonitoring", "accepted accuracy (after the shift, no action)",
        "wrong accepted: none / ladder / escalate_all",
        "slow calls: none / ladder / escalate_all"], rows)


if __name__ == "__main__":
    main()
