"""``slotgate tune`` and ``slotgate eval``: a policy file from labelled predictions (split, or
cross-fitted on out-of-fold reads), and its metrics on fresh labelled predictions. ``tune`` is
argument parsing around ``GuaranteedPolicy(...).fit(...).to_file(...)``; the ranges of its flags
are the policy file's own fields (``policies.specs``)."""

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
    tuned_question,
    write_report,
)

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from policies.file import PolicyFile
    from policies.guaranteed import GuaranteedPolicy
    from policies.scope import Question
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
    least expected cost (docs/cascade.md). A tier may be left unread. --max-escalation,
    --per-answer-floor, --cv, --model and --report are one tier's.
    """
    from pydantic import ValidationError

    from policies.guaranteed import GuaranteedPolicy
    from router.cli.common import check_policy_fields
    from router.tuning.predictions import PredictionsError

    if len(preds_files) > 1:
        for flag, value in (("--max-escalation", max_escalation),
                            ("--per-answer-floor", per_answer_floor), ("--cv", cv),
                            ("--model", model), ("--report", report)):
            if value is not None:
                fail(f"{flag}: is one tier's; a cascade of {len(preds_files)} --preds takes "
                     "none")
        from router.cli.cascade import tune_cascade

        tune_cascade(preds_files, out=out, tiers=tier, slow_cost=slow_cost, name=name,
                     shadow=shadow, audit_rate=audit_rate, alarm_alpha=alarm_alpha,
                     watch={"on_alarm": on_alarm, "audit_boost": audit_boost},
                     question=question_of(question, instructions=instructions,
                                          context=context, kind=question_kind),
                     params={"calibrator": calibrator, "target_accuracy": target_accuracy,
                             "delta": delta, "calibration_fraction": calibration_fraction,
                             "seed": seed, "max_slow_share": max_slow_share})
        return
    cascade_flags: tuple[tuple[str, object], ...] = (
        ("--tier", tier), ("--slow-cost", slow_cost), ("--max-slow-share", max_slow_share))
    for flag, given in cascade_flags:
        if given is not None:
            fail(f"{flag}: is a cascade's; pass one --preds per tier (got one --preds)")
    preds = preds_files[0]
    try:
        fitter = GuaranteedPolicy(calibrator=calibrator, target_accuracy=target_accuracy,
                                  delta=delta, calibration_fraction=calibration_fraction,
                                  seed=seed, max_escalation=max_escalation,
                                  budget_window=budget_window, per_answer_floor=per_answer_floor)
        fitter.check_params()
    except ValidationError as exc:
        fail_flag(exc)
    # Monitoring flags left out take the policy file's defaults.
    watch = {name: value for name, value in (("on_alarm", on_alarm), ("audit_boost", audit_boost))
             if value is not None}
    check_policy_fields(audit_rate=audit_rate, alarm_alpha=alarm_alpha, **watch)
    named = question_of(question, instructions=instructions, context=context,
                        kind=question_kind)
    check_out(out, "--out")
    if report is not None:
        check_folder(report, "--report")
    data = load_preds(preds, labelled=True)
    if data.n_novel:
        fail(f"{preds}: field 'label': {data.n_novel} rows are labelled with none of the options "
             "(novel); a policy is tuned on rows of its own options only")
    fingerprint = single(data.fingerprints, "fingerprint", preds) or "unknown"
    logged = single(data.signatures, "signature", preds)  # rows of one logged question
    asked = tuned_question(data, named)
    if asked is None and logged is None:
        fail(f"--question: {preds} records no question and none was named: name the question "
             "this policy answers (--question, and --instructions, --context, --question-kind "
             "where it has them), or train with `slotgate train --question ...` "
             "(docs/calibration.md, \"Scope\")")
    try:
        rows, folds = tuning_rows(data, model=model, cv=cv, seed=seed, question=asked)
        fitter.fit(data.proba[rows], data.y_true[rows], options=data.options, folds=folds)
    except PredictionsError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(f"{preds}: {exc}")
    n_slow = sum(ref == "slow" for ref, known in zip(data.references, data.labelled, strict=True)
                 if known)
    policy = fitter.to_file(
        name=name or out.stem, data_hash=data.data_hash, backend_fingerprint=fingerprint,
        # The scope (policies.scope): the question, else the one logged question the rows came
        # from (export-log), exactly as it was asked.
        question=asked, logged_signature=None if asked is not None else logged,
        guarantee="agreement_with_slow" if n_slow else "accuracy",
        # Tuned on a shadow log: the policy exists to leave shadow mode, so it says so.
        shadow=False if shadow is None and n_slow else shadow,
        audit_rate=audit_rate, alarm_alpha=alarm_alpha, **watch)
    policy.write(out)
    if report is not None:
        write_report(report, fitter.proba_before_, fitter.proba_after_, fitter.y_true_,
                     threshold=policy.threshold, target_accuracy=target_accuracy,
                     title=f"{policy.name}, {calibrator}, {fitter.risk_.n} threshold rows of "
                           f"{preds.name} (target {target_accuracy}, delta {delta})")
    show_tuned(policy, fitter, out=out, n_slow=n_slow, n_labelled=int(data.labelled.sum()))


def tuning_rows(data: Predictions, *, model: Path | None, cv: int | None, seed: int,
                question: Question | None) -> tuple[Any, NDArray[np.int64] | None]:
    """The rows to tune on and their folds (None: split): an out-of-fold file's own folds (all
    its rows, checked against --model), random folds with --cv, else the labelled rows."""
    from router.tuning.crossfit import check_crossfit_rows

    folds = check_crossfit_rows(data)
    if folds is not None and cv is not None:
        fail(f"--cv: {data.path} is already out-of-fold (its rows carry a 'fold')")
    if folds is not None:
        check_model(data, model, question=question)
        return slice(None), folds
    if model is not None:
        fail(f"--model goes with an out-of-fold --preds file (rows with a 'fold'); {data.path} "
             "has none")
    if cv is not None:
        from calibration.crossfit import random_folds

        try:
            folds = random_folds(int(data.labelled.sum()), n_folds=cv, seed=seed)
        except ValueError as exc:
            fail(f"--cv: {str(exc).removeprefix('n_folds ')}")
    return data.labelled, folds


def show_tuned(policy: PolicyFile, fitted: GuaranteedPolicy, *, out: Path, n_slow: int,
               n_labelled: int) -> None:
    from calibration.metrics import ece

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


def check_model(data: Predictions, model: Path | None, *, question: Question | None) -> None:
    """An out-of-fold file must come with the model trained with it, and match its rows and
    the question (a policy must not cover a question its model refuses to read)."""
    from router.backends.sklearn import SklearnBackend
    from router.errors import ConfigError
    from router.tuning.crossfit import check_matches_model

    if model is None:
        fail(f"{data.path}: rows carry a 'fold' (out-of-fold reads): pass --model, the model "
             "`train --cv` saved with them, so they can be checked against its training rows")
    try:
        backend = SklearnBackend(model)
    except ConfigError as exc:
        fail(f"--model: {exc}")
    check_matches_model(data, backend.model.meta, model_name=str(model),
                        model_fingerprint=backend.fingerprint)
    trained_for = backend.model.question
    if trained_for is not None and question is not None and trained_for != question:
        fail(f"--model: {model} was trained for question {trained_for.describe()}, not "
             f"{question.describe()}; it reads no other question")


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
    from policies.guaranteed import GuaranteedPolicy
    from router.cli.policy_ref import read_policy

    if report is not None:
        check_folder(report, "--report")
    _, tuned = read_policy(policy)
    if tuned.cascade is not None:
        if report is not None:
            fail("--report: the plots are one tier's; a cascade policy has none")
        from router.cli.cascade import evaluate_cascade_cli

        evaluate_cascade_cli(preds_files, tuned, policy=policy, as_json=as_json,
                             allow_mismatch=allow_mismatch)
        return
    if len(preds_files) != 1:
        fail(f"--preds: policy {policy} has one fast tier: pass one --preds (got "
             f"{len(preds_files)})")
    preds = preds_files[0]
    data = load_preds(preds, labelled=True)
    fingerprint = single(data.fingerprints, "fingerprint", preds) or "unknown"
    # A policy's threshold means something only for the backend and question it was tuned on.
    mismatches = []
    if fingerprint != tuned.backend_fingerprint:
        mismatches.append(f"{preds} has backend fingerprint {fingerprint}, the policy {policy} was "
                          f"tuned for {tuned.backend_fingerprint}")
    mismatches += question_mismatches(preds, data, tuned, policy=policy, options=True)
    refuse_mismatches(mismatches, allow=allow_mismatch)
    mask = data.scored
    runtime = GuaranteedPolicy.from_file(tuned)
    try:
        metrics = evaluate_policy(runtime, data.options, data.proba[mask], data.y_true[mask])
    except ValueError as exc:
        fail(f"{preds}: {exc}")
    metrics = {"policy": tuned.policy_id, "threshold": tuned.threshold,
               "target_accuracy": tuned.target_accuracy, "delta": tuned.delta,
               "n_unlabelled": int((~mask).sum()), **metrics}
    if report is not None:  # the plots need an option index: rows of the policy's options
        before = data.proba[data.labelled]
        write_report(report, before, runtime.calibrator_.transform(before),
                     data.y_true[data.labelled], threshold=tuned.threshold,
                     target_accuracy=tuned.target_accuracy,
                     title=f"{tuned.name} on {preds.name} ({metrics['n']} rows)")
    if as_json:
        typer.echo(json.dumps(metrics))
        return
    show_table(f"{tuned.policy_id} on {preds} (95% intervals)", [
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


