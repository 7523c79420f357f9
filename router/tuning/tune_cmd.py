"""``slotgate tune`` and ``slotgate eval``: a policy file from labelled predictions (split, or
cross-fitted on out-of-fold reads), and its metrics on fresh labelled predictions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from router.tuning.common import (
    check_folder,
    check_out,
    fail,
    fmt,
    load_preds,
    show_table,
    single,
    write_report,
)


def tune(
    preds: Annotated[Path, typer.Option(help="Labelled predictions JSONL.")],
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
    shadow: Annotated[bool, typer.Option(
        help="Write the policy in shadow mode: every decision is also answered by the slow "
             "model, which is served (switch it off by editing the file; it reloads live).")] = False,
    seed: int = 0,
    audit_rate: Annotated[float, typer.Option(help="Share of accepted decisions also sent to the "
                                              "slow model after the reply (monitoring).")] = 0.0,
    on_alarm: Annotated[str, typer.Option(help="escalate_all | alert_only: what a drift or "
                                          "accuracy alarm does.")] = "escalate_all",
    alarm_alpha: Annotated[float, typer.Option(
        help="False-alarm probability of the drift and accuracy alarms together, per replica "
             "(with N replicas sharing alarms, the fleet's is at most N times it).")] = 0.05,
) -> None:
    """Tune a policy: calibrator and guaranteed threshold from labelled predictions.

    Out-of-fold predictions (`train --cv K --oof-out`, rows carry a fold): every row is used;
    the calibrator is cross-fitted over the same folds and the threshold chosen on all rows.
    Otherwise the labelled rows are split with a fixed seed: one part fits the calibrator, the
    other chooses the threshold. Labels that are the slow model's answers (`export-log
    --reference slow`) make the promise agreement with the slow model, and the policy says so.
    With --max-escalation the guaranteed threshold still stands: the policy caps escalation at
    runtime, and answers it accepts below the threshold say so.
    """
    from calibration.calibrators import calibrator_kinds
    from calibration.metrics import ece
    from calibration.monitoring import reference_summary
    from policies.file import PolicyFile
    from policies.tuning import tune as tune_policy
    from policies.tuning import tune_crossfit
    from router.tuning.crossfit import check_crossfit_rows
    from router.tuning.predictions import PredictionsError

    if calibrator not in calibrator_kinds():
        fail(f"--calibrator must be one of {', '.join(sorted(calibrator_kinds()))}, got {calibrator!r}")
    if not 0.0 < target_accuracy <= 1.0:
        fail(f"--target-accuracy must be in (0, 1], got {target_accuracy}")
    if not 0.0 < delta < 1.0:
        fail(f"--delta must be in (0, 1), got {delta}")
    if max_escalation is not None and not 0.0 <= max_escalation <= 1.0:
        fail(f"--max-escalation must be in [0, 1], got {max_escalation}")
    if not 0.0 < calibration_fraction < 1.0:
        fail(f"--calibration-fraction must be in (0, 1), got {calibration_fraction}")
    if not 0.0 <= audit_rate <= 1.0:
        fail(f"--audit-rate must be in [0, 1], got {audit_rate}")
    if on_alarm not in ("escalate_all", "alert_only"):
        fail(f"--on-alarm must be escalate_all or alert_only, got {on_alarm!r}")
    if not 0.0 < alarm_alpha < 1.0:
        fail(f"--alarm-alpha must be in (0, 1), got {alarm_alpha}")
    check_out(out, "--out")
    if report is not None:
        check_folder(report, "--report")
    data = load_preds(preds, labelled=True)
    fingerprint = single(data.fingerprints, "fingerprint", preds) or "unknown"
    signature = single(data.signatures, "signature", preds)
    mask = data.labelled
    try:
        folds = check_crossfit_rows(data)
        if folds is not None and cv is not None:
            fail(f"--cv: {preds} is already out-of-fold (its rows carry a 'fold')")
        if folds is not None:
            check_model(data, model)
        elif model is not None:
            fail(f"--model goes with an out-of-fold --preds file (rows with a 'fold'); {preds} "
                 "has none")
    except PredictionsError as exc:
        fail(str(exc))
    if cv is not None:
        from calibration.crossfit import random_folds

        try:
            folds = random_folds(int(mask.sum()), n_folds=cv, seed=seed)
        except ValueError as exc:
            fail(f"--cv: {str(exc).removeprefix('n_folds ')}")
    try:
        if folds is not None:
            rows = mask if cv is not None else slice(None)
            result = tune_crossfit(data.proba[rows], data.y_true[rows], folds, calibrator=calibrator,
                                   target_accuracy=target_accuracy, delta=delta,
                                   max_escalation=max_escalation, budget_window=budget_window)
        else:
            result = tune_policy(data.proba[mask], data.y_true[mask], calibrator=calibrator,
                                 target_accuracy=target_accuracy, delta=delta, seed=seed,
                                 calibration_fraction=calibration_fraction,
                                 max_escalation=max_escalation, budget_window=budget_window)
    except ValueError as exc:
        fail(f"{preds}: {exc}")
    n_slow = sum(ref == "slow" for ref, known in zip(data.references, mask, strict=True) if known)
    risk = result.risk
    policy = PolicyFile(
        name=name or out.stem, signature=signature, backend_fingerprint=fingerprint,
        calibrator=result.calibrator.to_dict(), rule=result.rule.to_dict(),
        threshold=risk.threshold, target_accuracy=target_accuracy, delta=delta,
        bound=risk.bound, coverage=risk.coverage, n_tune=risk.n,
        n_calibration=result.n_calibration, seed=seed, max_escalation=max_escalation,
        budget_threshold=result.budget_threshold, budget_exceeded=result.budget_exceeded,
        data_hash=data.data_hash, tuning="split" if folds is None else "cross-fitted",
        n_folds=result.n_folds, guarantee="agreement_with_slow" if n_slow else "accuracy",
        shadow=shadow, audit_rate=audit_rate, on_alarm=on_alarm, alarm_alpha=alarm_alpha,
        reference=reference_summary(result.confidence, threshold=risk.threshold, seed=seed),
        options=list(data.options),
    )
    policy.write(out)
    if report is not None:
        write_report(report, result.proba_before, result.proba_after, result.y_true,
                     threshold=risk.threshold, target_accuracy=target_accuracy,
                     title=f"{policy.name}, {calibrator}, {risk.n} threshold rows of {preds.name} "
                           f"(target {target_accuracy}, delta {delta})")
    show_table(f"policy {policy.policy_id} -> {out}", [
        ("tuning", "split" if folds is None else f"cross-fitted, {result.n_folds} folds"),
        ("rows: calibration / threshold", f"{result.n_calibration} / {risk.n}"),
        ("guarantee", policy.guarantee + (f" ({n_slow} of {int(mask.sum())} labels are the "
                                          "slow model's answers)" if n_slow else "")),
        ("threshold (guaranteed)", "none passed: escalate all" if risk.threshold is None
         else f"{risk.threshold:.4f}"),
        (f"accuracy lower bound (1-delta = {1 - delta:.2f})", f"{risk.bound:.4f}"),
        ("coverage on threshold rows", f"{risk.coverage:.4f}"),
        ("escalation on threshold rows", f"{result.escalation_rate:.4f}" + (
            "" if max_escalation is None else f" (budget {max_escalation}, window {budget_window})")),
        ("ECE before / after (threshold rows)",
         f"{ece(result.proba_before, result.y_true):.4f} / {ece(result.proba_after, result.y_true):.4f}"),
        ("backend fingerprint", fingerprint),
    ])
    if result.budget_exceeded:
        typer.echo(
            f"warning: the guarantee needs escalation {result.escalation_rate:.3f} on the "
            f"threshold rows, above --max-escalation {max_escalation}; at runtime the budget "
            "accepts reads below the guaranteed threshold once it is used up, and marks them "
            "'budget exhausted' (those answers are outside the guarantee)", err=True)


def check_model(data: Any, model: Path | None) -> None:
    """An out-of-fold file must come with the model trained with it, and match its rows."""
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


def evaluate(
    preds: Annotated[Path, typer.Option(help="Labelled predictions JSONL.")],
    policy: Annotated[Path, typer.Option(help="Policy JSON from `slotgate tune`.")],
    report: Annotated[Path | None, typer.Option(help="Folder for the PNG plots.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    allow_mismatch: Annotated[bool, typer.Option(
        help="Evaluate even when the predictions come from another backend (fingerprint) or "
             "another question (options) than the policy was tuned on.")] = False,
) -> None:
    """Evaluate a policy on labelled predictions.

    Accuracy, accepted accuracy, coverage, escalation rate, ECE before and after calibration,
    each with a 95% interval.
    """
    from policies.file import PolicyFileError, load_policy
    from policies.tuning import evaluate as evaluate_policy

    if report is not None:
        check_folder(report, "--report")
    try:
        tuned = load_policy(policy)
    except PolicyFileError as exc:
        fail(str(exc))
    data = load_preds(preds, labelled=True)
    fingerprint = single(data.fingerprints, "fingerprint", preds) or "unknown"
    # A policy's threshold means something only for the backend and question it was tuned on.
    mismatches = []
    if fingerprint != tuned.backend_fingerprint:
        mismatches.append(f"{preds} has backend fingerprint {fingerprint}, the policy {policy} was "
                          f"tuned for {tuned.backend_fingerprint}")
    if tuned.options is not None and tuple(tuned.options) != data.options:
        mismatches.append(f"{preds} has options {_preview(data.options)}, the policy {policy} was "
                          f"tuned on {_preview(tuned.options)}")
    if mismatches and not allow_mismatch:
        fail("; ".join(mismatches) + " (pass --allow-mismatch to evaluate anyway)")
    for line in mismatches:
        typer.echo(f"warning: {line}", err=True)
    mask = data.labelled
    runtime = tuned.runtime()
    try:
        metrics = evaluate_policy(runtime, data.options, data.proba[mask], data.y_true[mask])
    except ValueError as exc:
        fail(f"{preds}: {exc}")
    metrics = {"policy": tuned.policy_id, "threshold": tuned.threshold,
               "target_accuracy": tuned.target_accuracy, "delta": tuned.delta,
               "n_unlabelled": int((~mask).sum()), **metrics}
    if report is not None:
        before = data.proba[mask]
        write_report(report, before, runtime.calibrator.transform(before), data.y_true[mask],
                     threshold=tuned.threshold, target_accuracy=tuned.target_accuracy,
                     title=f"{tuned.name} on {preds.name} ({metrics['n']} rows)")
    if as_json:
        typer.echo(json.dumps(metrics))
        return
    show_table(f"{tuned.policy_id} on {preds} (95% intervals)", [
        ("rows (labelled)", str(metrics["n"])),
        ("accuracy (all rows)", fmt(metrics["accuracy"], metrics["accuracy_ci"])),
        ("accepted accuracy", fmt(metrics["accepted_accuracy"], metrics["accepted_accuracy_ci"])),
        ("target accuracy", f"{tuned.target_accuracy} (delta {tuned.delta})"),
        ("coverage (fast path)", fmt(metrics["coverage"], metrics["coverage_ci"])),
        ("escalation rate", fmt(metrics["escalation_rate"], metrics["escalation_rate_ci"])),
        ("ECE before calibration", fmt(metrics["ece_before"], metrics["ece_before_ci"])),
        ("ECE after calibration", fmt(metrics["ece_after"], metrics["ece_after_ci"])),
    ])


def _preview(options: Any) -> str:
    names = list(options)
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"[{shown}] ({len(names)})"
