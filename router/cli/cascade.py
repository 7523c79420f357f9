"""``slotgate tune`` and ``slotgate eval`` with one ``--preds`` per fast tier: a cascade policy
(``policies.cascade.CascadePolicy``) from labelled reads of every tier over the same rows, and
its metrics per tier and for the whole (docs/cascade.md). ``router.cli.policy`` hands over to
these when it is given several ``--preds`` or a cascade policy."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from router.cli.common import (
    check_out,
    fail,
    fail_flag,
    fmt,
    load_preds,
    question_mismatches,
    refuse_mismatches,
    show_table,
    single,
    tuned_question,
)

if TYPE_CHECKING:
    from policies.cascade import CascadePolicy, TierCost
    from policies.file import PolicyFile
    from policies.scope import Question


def tune_cascade(files: list[Path], *, out: Path, tiers: list[str] | None,
                 slow_cost: float | None, name: str | None, shadow: bool | None,
                 audit_rate: float, alarm_alpha: float, watch: dict[str, Any],
                 question: Question | None, params: dict[str, Any]) -> None:
    """``tune`` with several --preds: ``CascadePolicy(...).fit(...).to_file(...)``, every input
    checked before the policy is written."""
    from pydantic import ValidationError

    from policies.cascade import CascadePolicy
    from router.cli.common import check_policy_fields
    from router.tuning.cascade import check_same_rows, data_hash_of
    from router.tuning.predictions import PredictionsError

    try:
        fitter = CascadePolicy(**params)
        fitter.check_params()
    except ValidationError as exc:
        fail_flag(exc)
    costs = tier_costs(tiers, n_files=len(files))
    if slow_cost is None:
        fail("--slow-cost: a cascade needs the cost of one slow-model call (in --tier's unit)")
    if not math.isfinite(slow_cost) or slow_cost < 0:
        fail(f"--slow-cost: must be a finite number >= 0 (got {slow_cost!r})")
    watch = {key: value for key, value in watch.items() if value is not None}
    check_policy_fields(audit_rate=audit_rate, alarm_alpha=alarm_alpha, **watch)
    check_out(out, "--out")
    data = [load_preds(path, labelled=True) for path in files]
    for path, read in zip(files, data, strict=True):
        if read.n_novel:
            fail(f"{path}: field 'label': {read.n_novel} rows are labelled with none of the "
                 "options (novel); a policy is tuned on rows of its own options only")
    try:
        check_same_rows(data)
    except PredictionsError as exc:
        fail(str(exc))
    fingerprints = [single(read.fingerprints, "fingerprint", path) or "unknown"
                    for path, read in zip(files, data, strict=True)]
    logged = {single(read.signatures, "signature", path)
              for path, read in zip(files, data, strict=True)} - {None}
    if len(logged) > 1:
        fail(f"--preds: the files come from {len(logged)} different logged questions "
             "(field 'signature'); a cascade's tiers read one question")
    asked = {q for q in (tuned_question(read, question) for read in data) if q is not None}
    if len(asked) > 1:
        fail("--preds: the files answer different questions (field 'question': "
             + ", ".join(sorted(q.describe() for q in asked))
             + "); a cascade's tiers read one question")
    the_question = asked.pop() if asked else None
    the_signature = logged.pop() if logged else None
    if the_question is None and the_signature is None:
        fail("--question: the --preds files record no question and none was named: name the "
             "question this policy answers (--question, and --instructions, --context, "
             "--question-kind where it has them), or train with `slotgate train --question "
             "...` (docs/calibration.md, \"Scope\")")
    first = data[0]
    rows = first.labelled  # the same rows in every file (labels checked above)
    try:
        fitter.fit([read.proba[rows] for read in data], first.y_true[rows], tiers=costs,
                   slow_cost=slow_cost, options=first.options, fingerprints=fingerprints)
    except ValueError as exc:
        fail(f"--preds: {exc}")
    n_slow = sum(ref == "slow" for ref, known in zip(first.references, rows, strict=True)
                 if known)
    policy = fitter.to_file(
        name=name or out.stem, data_hash=data_hash_of(data), question=the_question,
        logged_signature=None if the_question is not None else the_signature,
        # Labels that are the slow model's answers: the promise is agreement with it.
        guarantee="agreement_with_slow" if n_slow else "accuracy",
        shadow=False if shadow is None and n_slow else shadow,
        audit_rate=audit_rate, alarm_alpha=alarm_alpha, **watch)
    policy.write(out)
    show_cascade(policy, fitter, out=out, n_slow=n_slow, n_labelled=int(rows.sum()))


def tier_costs(values: list[str] | None, *, n_files: int) -> list[TierCost]:
    """--tier NAME=COST, one per --preds, names distinct; exits 2 naming the flag."""
    from policies.cascade import TierCost

    if values is None or len(values) != n_files:
        fail(f"--tier: a cascade of {n_files} --preds needs one --tier NAME=COST per file, in "
             f"their order (got {0 if values is None else len(values)})")
    costs = []
    for value in values:
        tier_name, sep, raw = value.rpartition("=")
        try:
            cost = float(raw)
        except ValueError:
            cost = math.nan
        if not sep or not tier_name.strip() or not math.isfinite(cost) or cost < 0:
            fail(f"--tier: {value!r} is not NAME=COST with a name and a finite cost >= 0 "
                 "(e.g. fast=0.2)")
        costs.append(TierCost(tier_name.strip(), cost))
    names = [cost.name for cost in costs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        fail(f"--tier: tier names must be distinct ({', '.join(repeated)} repeats)")
    return costs


def show_cascade(policy: PolicyFile, fitted: CascadePolicy, *, out: Path, n_slow: int,
                 n_labelled: int) -> None:
    """What tuning a cascade chose: each tier's threshold, the share of threshold rows it
    answered and its cost; the slow model's share; the expected cost; the joint bound."""
    chosen, cascade = fitted.thresholds_, policy.cascade
    assert cascade is not None
    fitted_question = None if policy.question is None else policy.question.question()
    rows = [
        ("tuning", "split"),
        ("rows: calibration / threshold", f"{fitted.n_calibration_} / {fitted.n_tune_}"),
        ("guarantee", policy.guarantee + (f" ({n_slow} of {n_labelled} labels are the slow "
                                          "model's answers)" if n_slow else "")),
    ]
    for k, tier in enumerate(cascade.tiers):
        rows.append((f"tier {k + 1} {tier.name!r} (cost {tier.cost:g})",
                     "not read" if tier.threshold is None
                     else f"threshold {tier.threshold:.4f}, answers {tier.coverage:.4f}"))
    rows += [
        (f"slow model (cost {cascade.slow_cost:g})", f"answers {cascade.slow_coverage:.4f}"
         + ("" if cascade.max_slow_share is None else
            f" (cap {cascade.max_slow_share}, bound {cascade.slow_share_bound:.4f})")),
        ("expected cost per decision (threshold rows)", f"{cascade.expected_cost:.4g}"),
        (f"accuracy lower bound, all tiers (1-delta = {1 - policy.delta:.2f})",
         f"{policy.bound:.4f}"),
        ("passed", "yes" if chosen.passed_ else f"no: {chosen.reason_}"),
        ("question", "one logged question (its signature)" if fitted_question is None
         else fitted_question.describe()),
        ("backend fingerprints", ", ".join(t.backend_fingerprint for t in cascade.tiers)),
    ]
    show_table(f"policy {policy.policy_id} -> {out}", rows)


def evaluate_cascade_cli(files: list[Path], tuned: PolicyFile, *, policy: str, as_json: bool,
                         allow_mismatch: bool) -> None:
    """``eval`` of a cascade policy: one --preds per tier, each checked against its tier."""
    from policies.cascade import CascadePolicy
    from router.tuning.cascade import check_same_rows, evaluate_cascade
    from router.tuning.predictions import PredictionsError

    cascade = tuned.cascade
    assert cascade is not None
    if len(files) != len(cascade.tiers):
        fail(f"--preds: policy {policy} is a cascade of {len(cascade.tiers)} tiers ("
             + ", ".join(t.name for t in cascade.tiers)
             + f"): pass one --preds per tier, in that order (got {len(files)})")
    data = [load_preds(path, labelled=True) for path in files]
    try:
        check_same_rows(data)
    except PredictionsError as exc:
        fail(str(exc))
    mismatches = []
    for path, read, tier in zip(files, data, cascade.tiers, strict=True):
        fingerprint = single(read.fingerprints, "fingerprint", path) or "unknown"
        if fingerprint != tier.backend_fingerprint:
            mismatches.append(f"{path} has backend fingerprint {fingerprint}, tier "
                              f"{tier.name!r} of the policy {policy} was tuned for "
                              f"{tier.backend_fingerprint}")
        mismatches += question_mismatches(path, read, tuned, policy=policy,
                                          options=path == files[0])
    refuse_mismatches(mismatches, allow=allow_mismatch)
    first = data[0]
    mask = first.scored
    metrics = evaluate_cascade(CascadePolicy.from_file(tuned), first.options,
                               [read.proba[mask] for read in data], first.y_true[mask])
    metrics = {"policy": tuned.policy_id, "target_accuracy": tuned.target_accuracy,
               "delta": tuned.delta, "n_unlabelled": int((~mask).sum()), **metrics}
    if as_json:
        typer.echo(json.dumps(metrics))
        return
    rows = [
        ("rows (labelled)", str(metrics["n"])
         + (f", {metrics['n_novel']} of them novel (counted wrong)" if metrics["n_novel"] else "")),
    ]
    for k, tier in enumerate(metrics["tiers"]):
        label = f"tier {k + 1} {tier['name']!r}"
        if tier["threshold"] is None:
            rows.append((label, "not read"))
            continue
        rows += [
            (f"{label}: threshold, cost", f"{tier['threshold']:.4f}, {tier['cost']:g}"),
            (f"{label}: answered share", fmt(tier["answered_share"], tier["answered_share_ci"])),
            (f"{label}: accepted accuracy",
             fmt(tier["accepted_accuracy"], tier["accepted_accuracy_ci"])),
        ]
    rows += [
        (f"slow model (cost {metrics['slow_cost']:g}): share",
         fmt(metrics["escalation_rate"], metrics["escalation_rate_ci"])),
        ("accepted accuracy, all tiers",
         fmt(metrics["accepted_accuracy"], metrics["accepted_accuracy_ci"])),
        ("target accuracy", f"{tuned.target_accuracy} (delta {tuned.delta})"),
        ("coverage, all tiers", fmt(metrics["coverage"], metrics["coverage_ci"])),
        ("expected cost per decision", f"{metrics['expected_cost']:.4g}"),
    ]
    show_table(f"{tuned.policy_id} on {len(files)} tiers' predictions (95% intervals)", rows)
