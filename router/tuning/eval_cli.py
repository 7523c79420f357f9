"""``slotgate eval`` (a policy on labelled predictions) and ``slotgate compare`` (two prediction
files, exact McNemar). Registered on the one Typer app in router/tuning/cli.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from router.tuning.cli import check_folder, fail, fmt, load_preds, show_table, single, write_report


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


def compare(
    a: Annotated[Path, typer.Argument(help="Predictions JSONL of model A.")],
    b: Annotated[Path, typer.Argument(help="Predictions JSONL of model B.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare two prediction files row by row: discordant pairs, exact McNemar p."""
    import numpy as np

    from calibration.compare import paired_comparison

    first, second = load_preds(a, labelled=True), load_preds(b, labelled=True)
    index_b = {row_id: i for i, row_id in enumerate(second.ids)}
    pairs = [(i, index_b[row_id]) for i, row_id in enumerate(first.ids)
             if row_id in index_b and first.labels[i] is not None
             and second.labels[index_b[row_id]] is not None]
    if not pairs:
        fail(f"{a} and {b}: field 'id': no labelled row id appears in both files")
    rows_a, rows_b = (np.array(side) for side in zip(*pairs, strict=True))
    for i, j in pairs:
        if first.labels[i] != second.labels[j]:
            fail(f"{b}: row {j + 1}: field 'label': {second.labels[j]!r} differs from {a}'s "
                 f"{first.labels[i]!r} for id {first.ids[i]!r}")
    answer_a = [first.options[k] for k in first.proba[rows_a].argmax(axis=1)]
    answer_b = [second.options[k] for k in second.proba[rows_b].argmax(axis=1)]
    labels = [first.labels[i] for i in rows_a]
    result = paired_comparison([x == y for x, y in zip(answer_a, labels, strict=True)],
                               [x == y for x, y in zip(answer_b, labels, strict=True)])
    summary = {**result.to_dict(), "answers_agree": float(np.mean(
        [x == y for x, y in zip(answer_a, answer_b, strict=True)])),
        "unpaired_a": len(first.ids) - len(pairs), "unpaired_b": len(second.ids) - len(pairs)}
    if as_json:
        typer.echo(json.dumps(summary))
        return
    show_table(f"{a.name} (A) vs {b.name} (B)", [
        ("paired rows", str(result.n)),
        ("accuracy A / B", f"{result.accuracy_a:.4f} / {result.accuracy_b:.4f}"),
        ("same answer", f"{summary['answers_agree']:.4f}"),
        ("both right or both wrong", f"{result.agreement:.4f}"),
        ("discordant: only A right / only B right", f"{result.a_only} / {result.b_only}"),
        ("exact McNemar p", f"{result.p_value:.4g}"),
        ("unpaired rows A / B", f"{summary['unpaired_a']} / {summary['unpaired_b']}"),
    ])
