"""``slotgate tune`` and ``slotgate eval``, for one fast tier or several: a policy file from
labelled predictions, and its metrics on fresh labelled predictions. Each parses its flags,
calls the library (``router.tuning.tune.tune_policy``, ``policies.evaluation.evaluate``) and
prints; the ranges of the flags are the policy file's own fields (``policies.specs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from router.cli.common import (
    QuestionContext,
    QuestionId,
    QuestionKindFlag,
    QuestionText,
    check_folder,
    check_out,
    fail,
    fail_flag,
    fmt,
    load_preds,
    question_mismatches,
    question_of,
    refuse_mismatches,
    show_table,
    single,
    write_report,
)

if TYPE_CHECKING:
    from policies.file import PolicyFile
    from policies.policy import Policy
    from router.tuning.predictions import Predictions


def tune(
    preds_files: Annotated[list[Path], typer.Option(
        "--preds", metavar="<path>", help="Labelled predictions JSONL. Repeat it for a cascade of fast tiers: one file per "
             "tier, in the order they read (cheapest first), the same rows in the same order "
             "(ids, labels and texts are checked row by row). A cascade splits the rows like "
             "--preds of `predict`; out-of-fold files of `train --cv --oof-out` are fine there, "
             "each row having been read by a model that did not see it (their folds are not "
             "used, so --model is not needed).")],
    out: Annotated[Path, typer.Option(help="Policy JSON to write.")],
    target_accuracy: Annotated[float, typer.Option(help="Accuracy promised on accepted answers.")] = 0.95,
    delta: Annotated[float, typer.Option(help="Allowed chance that the promise fails.")] = 0.05,
    calibrator: Annotated[str, typer.Option(help="temperature | isotonic | histogram | none")] = "temperature",
    max_escalation: Annotated[float | None, typer.Option(help="Runtime cap on the escalation rate.")] = None,
    budget_window: Annotated[int, typer.Option(min=1, help="Decisions the cap is counted over.")] = 1000,
    calibration_fraction: Annotated[float, typer.Option(help="Share of rows fitting the calibrator.")] = 0.5,
    name: Annotated[str | None, typer.Option(help="Policy name (default: the --out file stem).")] = None,
    report: Annotated[Path | None, typer.Option(help="Folder for the PNG plots.")] = None,
    model: Annotated[Path | None, typer.Option(
        help="The model `train --cv` saved with an out-of-fold --preds file; needed for one, "
             "whose rows are checked against the training rows the model recorded.")] = None,
    cv: Annotated[int | None, typer.Option(
        help="For predictions of a model that saw none of the rows (`predict` on held-out "
             "rows, `export-log`): cross-fit the calibrator over K random folds and choose the "
             "threshold on all rows, instead of splitting them.")] = None,
    shadow: Annotated[bool | None, typer.Option(
        "--shadow/--no-shadow",
        help="--shadow: every decision of this policy is also answered by the slow model, "
             "which is served; --no-shadow: never; neither: --no-shadow for a policy tuned on "
             "the slow model's answers (the cold start's switch out of shadow mode), else the "
             "server's policy.shadow decides (SLOTGATE_POLICY__SHADOW). Edit the file to "
             "switch; it reloads live.",
        show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Seed of the calibration/threshold split, the --cv "
                                      "folds and the drift reference's subsample: the same "
                                      "seed and rows, the same policy.")] = 0,
    audit_rate: Annotated[float, typer.Option(help="Share of accepted decisions also sent to the "
                                              "slow model after the reply (monitoring).")] = 0.0,
    on_alarm: Annotated[str | None, typer.Option(
        help="What an alarm does: audit_then_escalate (the default: a drift alarm raises the "
             "audit rate to --audit-boost, an accuracy alarm escalates), escalate_all (any "
             "alarm escalates) or alert_only.")] = None,
    audit_boost: Annotated[float | None, typer.Option(
        help="Audit rate while a drift alarm stands, under audit_then_escalate (default: the "
             "policy file's, 0.75).")] = None,
    alarm_alpha: Annotated[float, typer.Option(
        help="False-alarm probability of the drift and accuracy alarms together, per replica "
             "(with N replicas sharing alarms, the fleet's is at most N times it).")] = 0.05,
    per_answer_floor: Annotated[float | None, typer.Option(
        help="Also give each answer its own bar so that every answer's accepted accuracy is at "
             "least this, all answers at once with the same --delta (Bonferroni over the "
             "answers; docs/calibration.md). Answers with too little evidence escalate.")] = None,
    question: QuestionId = None,
    instructions: QuestionText = "",
    context: QuestionContext = "",
    question_kind: QuestionKindFlag = "choice",
    tier: Annotated[list[str] | None, typer.Option(
        metavar="<name=cost>", help="A cascade's tier as NAME=COST, one per --preds and in their order: NAME is the "
             "tier's name in the settings (the first tier is fast.name, default \"fast\"; "
             "the others tiers[].name), COST what one read of it costs (any unit, the same as "
             "--slow-cost's).")] = None,
    slow_cost: Annotated[float | None, typer.Option(
        help="A cascade's cost of one slow-model call, in --tier's unit.")] = None,
    max_slow_share: Annotated[float | None, typer.Option(
        help="A cascade's cap on the share of decisions reaching the slow model, held with "
             "probability 1 - delta together with the accuracy (delta is split in two).")] = None,
    cost_share: Annotated[float | None, typer.Option(
        help="A promise on cost: the slow model answers more than this share of a block of "
             "--cost-block consecutive decisions with probability at most --cost-delta "
             "(blocks fixed, tuning rows and traffic exchangeable; docs/calibration.md). "
             "Held with the accuracy promise; tuning fails when no rule keeps both.")] = None,
    cost_block: Annotated[int | None, typer.Option(
        help="Decisions in one block of the cost promise (default 1000).")] = None,
    cost_delta: Annotated[float | None, typer.Option(
        help="Allowed chance that a block breaks the cost promise (default 0.05).")] = None,
    on_cost_alarm: Annotated[str | None, typer.Option(
        help="What the router does when its live check finds the cost promise broken: "
             "alert_only (the default) or serve_unverified (the fast answer is served, marked "
             "unverified, where the policy would escalate).")] = None,
) -> None:
    """Tune a policy: calibrator and guaranteed threshold from labelled predictions.

    Out-of-fold predictions (`train --cv K --oof-out`, rows carry a fold): every row is used;
    the calibrator is cross-fitted over the same folds and the threshold chosen on all rows.
    Otherwise the labelled rows are split with a fixed seed: one part fits the calibrator, the
    other chooses the threshold. Labels that are the slow model's answers (`export-log
    --reference slow`) make the promise agreement with the slow model, and the policy says so.
    With --max-escalation the guaranteed threshold still stands: the policy caps escalation at
    runtime, and answers it accepts below the threshold say so.

    The policy answers one question (docs/calibration.md, "Scope"): the one the rows record
    (`train --question` / `predict` write it), or the one --question (with --instructions,
    --context, --question-kind) names, or, for rows exported from the decision log, that logged
    question. Any other question, whatever its options, is unscoped.

    A cascade (several --preds, each with its --tier, and --slow-cost): each tier gets its own
    calibrator, and the thresholds of all tiers are fit jointly so that the answers every tier
    accepts are together at least --target-accuracy accurate with probability 1 - delta, at the
    least expected cost (docs/cascade.md). A tier may be left unread. --cost-share adds a
    promise on the slow share of each block, for one tier or a cascade. --max-escalation,
    --per-answer-floor, --cv, --model and --report are one tier's.
    """
    from router.cli.cascade import show_cascade, tier_costs
    from router.tuning.tune import (
        CASCADE_FLAGS,
        ONE_TIER_FLAGS,
        TuneError,
        TuneRequest,
        tune_policy,
    )

    given = {"max_escalation": max_escalation, "per_answer_floor": per_answer_floor, "cv": cv,
             "model": model, "report": report, "tier": tier, "slow_cost": slow_cost,
             "max_slow_share": max_slow_share}
    check_shape_flags(given, n_files=len(preds_files),
                      others=CASCADE_FLAGS if len(preds_files) == 1 else ONE_TIER_FLAGS)
    params = {"calibrator": calibrator, "target_accuracy": target_accuracy, "delta": delta,
              "calibration_fraction": calibration_fraction, "seed": seed,
              "max_escalation": max_escalation, "budget_window": budget_window,
              "per_answer_floor": per_answer_floor, "max_slow_share": max_slow_share,
              **cost_params(cost_share, block=cost_block, delta=cost_delta)}
    # Monitoring flags left out take the policy file's defaults.
    watch = {key: value for key, value in (("on_alarm", on_alarm), ("audit_boost", audit_boost),
                                           ("on_cost_alarm", on_cost_alarm))
             if value is not None}
    check_tune_flags(params, audit_rate=audit_rate, alarm_alpha=alarm_alpha, watch=watch)
    request = TuneRequest(
        params=params, name=name or out.stem, question=question_of(
            question, instructions=instructions, context=context, kind=question_kind),
        tiers=tier_costs(tier, n_files=len(preds_files)) if len(preds_files) > 1 else None,
        slow_cost=slow_cost, shadow=shadow, audit_rate=audit_rate, alarm_alpha=alarm_alpha,
        watch=watch, model=model, cv=cv, signing_key=signing_key_of_environment())
    check_out(out, "--out")
    if report is not None:
        check_folder(report, "--report")
    data = [load_preds(path, labelled=True) for path in preds_files]
    try:
        tuned = tune_policy(data, request)
    except TuneError as exc:
        fail(str(exc))
    tuned.file.write(out)
    if report is not None:
        fitted = tuned.fitted
        write_report(report, fitted.proba_before_, fitted.proba_after_, fitted.y_true_,
                     threshold=tuned.file.threshold, target_accuracy=target_accuracy,
                     title=f"{tuned.file.name}, {calibrator}, {fitted.risk_.n} threshold rows "
                           f"of {preds_files[0].name} (target {target_accuracy}, delta {delta})")
    show = show_tuned if len(data) == 1 else show_cascade
    show(tuned.file, tuned.fitted, out=out, n_slow=tuned.n_slow, n_labelled=tuned.n_labelled)


def cost_params(share: float | None, *, block: int | None, delta: float | None
                ) -> dict[str, Any]:
    """The cost promise's options as given (a block or delta without a share is refused)."""
    if share is None:
        for flag, value in (("--cost-block", block), ("--cost-delta", delta)):
            if value is not None:
                fail(f"{flag}: belongs to a cost promise; pass --cost-share too")
        return {}
    return {"cost_share": share,
            **({} if block is None else {"cost_block": block}),
            **({} if delta is None else {"cost_delta": delta})}


def signing_key_of_environment() -> bytes | None:
    """The key that signs tuned files: the server's ``policy.signing_key``, from the variable
    that sets it (SLOTGATE_POLICY__SIGNING_KEY); None: files are sealed, not signed."""
    import os

    key = os.environ.get("SLOTGATE_POLICY__SIGNING_KEY")
    return key.encode() if key else None


def check_shape_flags(given: dict[str, Any], *, n_files: int, others: tuple[str, ...]) -> None:
    """Refuse the flags of the other shape of policy, naming the flag."""
    for key in others:
        if given[key] is not None:
            flag = "--" + key.replace("_", "-")
            fail(f"{flag}: is a cascade's; pass one --preds per tier (got one --preds)"
                 if n_files == 1 else
                 f"{flag}: is one tier's; a cascade of {n_files} --preds takes none")


def check_tune_flags(params: dict[str, Any], *, audit_rate: float, alarm_alpha: float,
                     watch: dict[str, Any]) -> None:
    """The options and the policy file's monitoring fields, each refused naming its flag."""
    from pydantic import ValidationError

    from policies.policy import Policy
    from router.cli.common import check_policy_fields

    try:
        Policy(**params).check_params()
    except ValidationError as exc:
        fail_flag(exc)
    check_policy_fields(audit_rate=audit_rate, alarm_alpha=alarm_alpha, **watch)


def show_tuned(policy: PolicyFile, fitted: Policy, *, out: Path, n_slow: int,
               n_labelled: int) -> None:
    from calibration.metrics import ece
    from router.cli.cascade import cost_rows

    risk, max_escalation = fitted.risk_, fitted.params_.max_escalation
    fitted_question = None if policy.question is None else policy.question.question()
    rows = [
        ("tuning", "split" if fitted.n_folds_ is None else f"cross-fitted, {fitted.n_folds_} folds"),
        ("rows: calibration / threshold", f"{fitted.n_calibration_} / {risk.n}"),
        ("guarantee", policy.guarantee + (f" ({n_slow} of {n_labelled} labels are the slow "
                                          "model's answers)" if n_slow else "")),
        ("threshold (guaranteed)", "none passed: escalate all" if risk.threshold is None
         else f"{risk.threshold:.4f}"),
        (f"accuracy lower bound (1-delta = {1 - policy.delta:.2f})", f"{risk.bound:.4f}"),
        ("coverage on threshold rows", f"{fitted.coverage_:.4f}"),
        ("escalation on threshold rows", f"{fitted.escalation_rate_:.4f}" + (
            "" if max_escalation is None
            else f" (budget {max_escalation}, window {fitted.params_.budget_window})")),
        ("ECE before / after (threshold rows)",
         (f"{ece(fitted.proba_before_, fitted.y_true_):.4f} / "
          f"{ece(fitted.proba_after_, fitted.y_true_):.4f}")),
        ("question", "one logged question (its signature)" if fitted_question is None
         else fitted_question.describe()),
        ("backend fingerprint", policy.backend_fingerprint),
        *cost_rows(policy),
    ]
    if fitted.answer_bars_ is not None:
        closed = sum(bar.bar is None for bar in fitted.answer_bars_)
        raised = sum(bar.bar is not None and bar.bar != risk.threshold
                     for bar in fitted.answer_bars_)
        rows.insert(6, (f"per-answer floor {fitted.params_.per_answer_floor}",
                        (f"{raised} answers with a higher bar, {closed} always escalated "
                         f"(coverage {risk.coverage:.4f} without the floor)")))
    show_table(f"policy {policy.policy_id} -> {out}", rows)
    if fitted.budget_exceeded_:
        typer.echo(
            f"warning: the guarantee needs escalation {fitted.escalation_rate_:.3f} on the "
            f"threshold rows, above --max-escalation {max_escalation}; at runtime the budget "
            "accepts reads below the guaranteed threshold once it is used up, and marks them "
            "'budget exhausted' (those answers are outside the guarantee)", err=True)


def evaluate(
    preds_files: Annotated[list[Path], typer.Option(
        "--preds", metavar="<path>", help="Labelled predictions JSONL. For a cascade policy, one file per tier "
                        "in the policy's tier order, the same rows in the same order.")],
    policy: Annotated[str, typer.Option(help="Policy JSON from `slotgate tune`, or the id or "
                                         "name of a policy ./slotgate.yaml loads.")],
    report: Annotated[Path | None, typer.Option(help="Folder for the PNG plots.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    allow_mismatch: Annotated[bool, typer.Option(
        help="Evaluate even when the predictions come from another backend (fingerprint) or "
             "another question (options) than the policy was tuned on.")] = False,
    answers: Annotated[int, typer.Option(
        min=0, help="Rows of the per-answer table to show, worst first (0: all; --json has "
                    "all).")] = 10,
) -> None:
    """Evaluate a policy on labelled predictions.

    Accuracy, accepted accuracy, coverage, escalation rate, ECE before and after calibration,
    each with a 95% interval; then accepted accuracy per answer, worst first. Rows labelled with
    none of the options (`predict --allow-novel-labels`) count as wrong answers.

    A cascade policy (`tune` with several --preds) takes one --preds per tier: the share each
    tier answered and the accuracy of its accepted answers; the whole cascade's accepted
    accuracy, coverage and expected cost per decision (every tier read, plus the slow model's
    cost when no tier accepts).
    """
    from policies.evaluation import evaluate as evaluate_policy
    from policies.policy import Policy
    from router.cli.cascade import show_block_shares, show_cascade_metrics
    from router.cli.policy_ref import read_policy

    if report is not None:
        check_folder(report, "--report")
    _, tuned = read_policy(policy)
    runtime = Policy.from_file(tuned)
    data = eval_inputs(preds_files, tuned, runtime, policy=policy, report=report,
                       allow_mismatch=allow_mismatch)
    first = data[0]
    mask = first.scored
    try:
        cost = tuned.cost_promise
        metrics = evaluate_policy(runtime, first.options, [read.proba[mask] for read in data],
                                  first.y_true[mask],
                                  cost_blocks=None if cost is None else (cost.share, cost.block))
    except ValueError as exc:
        fail(f"{preds_files[0]}: {exc}")
    one_tier = len(runtime.tiers_) == 1
    metrics = {"policy": tuned.policy_id,
               **({"threshold": tuned.threshold} if one_tier else {}),
               "target_accuracy": tuned.target_accuracy, "delta": tuned.delta,
               "n_unlabelled": int((~mask).sum()), **metrics}
    if report is not None:  # the plots need an option index: rows of the policy's options
        before = first.proba[first.labelled]
        write_report(report, before, runtime.tiers_[0].calibrator.transform(before),
                     first.y_true[first.labelled], threshold=tuned.threshold,
                     target_accuracy=tuned.target_accuracy,
                     title=f"{tuned.name} on {preds_files[0].name} ({metrics['n']} rows)")
    if as_json:
        typer.echo(json.dumps(metrics))
    elif one_tier:
        show_metrics(metrics, tuned, where=str(preds_files[0]), answers=answers)
    else:
        show_cascade_metrics(metrics, tuned, n_files=len(preds_files))
    if "cost_promise" in metrics and not as_json:
        show_block_shares(metrics["cost_promise"])


def eval_inputs(files: list[Path], tuned: PolicyFile, runtime: Policy, *, policy: str,
                report: Path | None, allow_mismatch: bool) -> list[Predictions]:
    """One labelled predictions file per tier of the policy, the same rows, each from the
    backend and of the question its tier was tuned on (else refused, unless allowed)."""
    from router.tuning.cascade import check_same_rows
    from router.tuning.predictions import PredictionsError

    tiers = runtime.tiers_
    if len(tiers) > 1 and report is not None:
        fail("--report: the plots are one tier's; a cascade policy has none")
    if len(files) != len(tiers):
        fail(f"--preds: policy {policy} has one fast tier: pass one --preds (got {len(files)})"
             if len(tiers) == 1 else
             f"--preds: policy {policy} is a cascade of {len(tiers)} tiers ("
             + ", ".join(t.name for t in tiers)
             + f"): pass one --preds per tier, in that order (got {len(files)})")
    data = [load_preds(path, labelled=True) for path in files]
    try:
        check_same_rows(data)
    except PredictionsError as exc:
        fail(str(exc))
    # A policy's threshold means something only for the backend and question it was tuned on.
    mismatches = []
    for path, read, tier in zip(files, data, tiers, strict=True):
        fingerprint = single(read.fingerprints, "fingerprint", path) or "unknown"
        if fingerprint != tier.backend_fingerprint:
            mismatches.append(
                f"{path} has backend fingerprint {fingerprint}, "
                + (f"the policy {policy}" if len(tiers) == 1 else
                   f"tier {tier.name!r} of the policy {policy}")
                + f" was tuned for {tier.backend_fingerprint}")
        mismatches += question_mismatches(path, read, tuned, policy=policy,
                                          options=path == files[0])
    refuse_mismatches(mismatches, allow=allow_mismatch)
    return data


def show_metrics(metrics: dict[str, Any], tuned: PolicyFile, *, where: str, answers: int
                 ) -> None:
    """One tier's evaluation as a table, then accepted accuracy per answer."""
    show_table(f"{tuned.policy_id} on {where} (95% intervals)", [
        ("rows (labelled)", str(metrics["n"])
         + (f", {metrics['n_novel']} of them novel (counted wrong)" if metrics["n_novel"] else "")),
        ("accuracy (all rows)", fmt(metrics["accuracy"], metrics["accuracy_ci"])),
        ("accepted accuracy", fmt(metrics["accepted_accuracy"], metrics["accepted_accuracy_ci"])),
        ("target accuracy", f"{tuned.target_accuracy} (delta {tuned.delta})"),
        ("coverage (fast path)", fmt(metrics["coverage"], metrics["coverage_ci"])),
        ("escalation rate", fmt(metrics["escalation_rate"], metrics["escalation_rate_ci"])),
        ("ECE before calibration", fmt(metrics["ece_before"], metrics["ece_before_ci"])),
        ("ECE after calibration", fmt(metrics["ece_after"], metrics["ece_after_ci"])),
    ])
    show_per_answer(metrics["per_answer"], limit=answers, floor=tuned.per_answer_floor)


def show_per_answer(table: list[dict[str, Any]], *, limit: int, floor: float | None) -> None:
    """Accepted accuracy per answer, worst first (what each caller of that answer received)."""
    from rich.console import Console
    from rich.table import Table

    shown = table if limit == 0 else table[:limit]
    title = (f"accepted accuracy per answer, worst first ({len(shown)} of {len(table)} answers"
             + (f"; per-answer floor {floor}" if floor is not None else "") + ")")
    grid = Table(title=title)
    for column in ("answer", "answered", "accepted", "accepted accuracy [95% interval]"):
        grid.add_column(column, justify="left" if column == "answer" else "right")
    for row in shown:
        grid.add_row(row["answer"], str(row["n_answered"]), str(row["n"]),
                     fmt(row["accuracy"], [row["lower"], row["upper"]]))
    Console(width=120).print(grid)


