"""The ``slotgate`` command line: train a fast model, predict, tune a policy, evaluate it, compare
two prediction files. One function per command; heavy imports inside the commands.

Bad input exits with code 2 and a message naming the file, row and field, having written nothing:
every input is read and checked before the first output is written. A typical run::

    slotgate train --data train.csv --label-column category --out m.joblib \
        --holdout 0.3 --holdout-out tune.csv
    slotgate predict --model m.joblib --data tune.csv --label-column category --out tune.jsonl
    slotgate predict --model m.joblib --data test.csv --label-column category --out test.jsonl
    slotgate tune --preds tune.jsonl --target-accuracy 0.95 --delta 0.05 --out policy.json
    slotgate eval --preds test.jsonl --policy policy.json --json
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="slotgate: confidence routing for LLM decision calls.")


def fail(message: str) -> NoReturn:
    """Print to stderr and exit 2 (bad input); plain echo so long paths are never re-wrapped."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def check_out(path: Path, what: str) -> None:
    if not path.parent.is_dir():
        fail(f"{what} {path}: folder {path.parent} does not exist")


def check_folder(path: Path, what: str) -> None:
    """A folder that exists or can be made: its nearest existing ancestor is a writable folder.
    Checked before any output is written, so a bad --report leaves no policy behind."""
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        fail(f"{what} {path}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK):
        fail(f"{what} {path}: folder {ancestor} is not writable")


def progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


def single(values: list[str | None], what: str, path: Path) -> str | None:
    """The one value all rows share (None if no row has one); mixed values are bad input."""
    distinct = {v for v in values if v is not None}
    if len(distinct) > 1:
        fail(f"{path}: field {what!r}: rows carry {len(distinct)} different values "
             "(predictions of different backends or questions in one file)")
    return distinct.pop() if distinct else None


Text = Annotated[str, typer.Option(help="Name of the text column.")]
IdColumn = Annotated[str | None, typer.Option(help="Column with row ids (default: 'id' if "
                                              "present, else the 1-based row number).")]


@app.command()
def train(
    data: Annotated[Path, typer.Option(help="Labelled CSV or JSONL file.")],
    out: Annotated[Path, typer.Option(help="Where to write the model artifact (joblib).")],
    text_column: Text = "text",
    label_column: Annotated[str, typer.Option(help="Name of the label column.")] = "label",
    id_column: IdColumn = None,
    kind: Annotated[str, typer.Option(help="tfidf | wordllama | minilm")] = "tfidf",
    holdout: Annotated[float, typer.Option(help="Share of rows held out of training.")] = 0.0,
    holdout_out: Annotated[Path | None, typer.Option(help="CSV for the held-out rows.")] = None,
    seed: int = 0,
) -> None:
    """Train a fast text classifier and save it as a versioned artifact."""
    import csv
    import hashlib

    import numpy as np

    from router.backends.sklearn import MODEL_KINDS, save_text_model, train_text_model
    from router.tuning.predictions import PredictionsError, read_texts

    if kind not in MODEL_KINDS:
        fail(f"--kind must be one of {', '.join(MODEL_KINDS)}, got {kind!r}")
    if not 0.0 <= holdout < 1.0:
        fail(f"--holdout must be in [0, 1), got {holdout}")
    if (holdout > 0) != (holdout_out is not None):
        fail("--holdout and --holdout-out go together")
    check_out(out, "--out")
    if holdout_out is not None:
        check_out(holdout_out, "--holdout-out")
    try:
        rows = read_texts(data, text_column=text_column, label_column=label_column,
                          id_column=id_column, require_labels=True)
    except PredictionsError as exc:
        fail(str(exc))
    order = np.random.default_rng(seed).permutation(len(rows.texts))
    held = set(order[: round(holdout * len(order))].tolist())
    fit_rows = [i for i in range(len(rows.texts)) if i not in held]
    texts = [rows.texts[i] for i in fit_rows]
    labels = [str(rows.labels[i]) for i in fit_rows]
    with progress() as bar:
        bar.add_task(f"training {kind} on {len(texts)} rows", total=None)
        try:
            model = train_text_model(texts, labels, kind=kind, seed=seed)
        except ValueError as exc:
            fail(f"{data}: field {label_column!r}: {exc}")
    data_hash = hashlib.sha256(data.read_bytes()).hexdigest()
    save_text_model(out, model, kind=kind, n_train=len(texts), data_hash=data_hash)
    if holdout_out is not None:
        with holdout_out.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["id", text_column, label_column])
            for i in sorted(held):
                writer.writerow([rows.ids[i], rows.texts[i], rows.labels[i]])
    typer.echo(f"trained {kind} on {len(texts)} rows ({len(model.classes_)} classes) -> {out}"
               + (f"; {len(held)} held-out rows -> {holdout_out}" if holdout_out else ""))


@app.command()
def predict(
    model: Annotated[Path, typer.Option(help="Model artifact from `slotgate train`.")],
    data: Annotated[Path, typer.Option(help="CSV or JSONL file of texts.")],
    out: Annotated[Path, typer.Option(help="Predictions JSONL to write.")],
    text_column: Text = "text",
    label_column: Annotated[str | None, typer.Option(help="Label column, if labelled.")] = None,
    id_column: IdColumn = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 512,
    torch_kind: Annotated[str | None, typer.Option(
        help="Read with the in-process torch backend (causal | masked | diffusion): --model is "
             "then a local model folder and the options are the data's sorted labels.")] = None,
    question: Annotated[str, typer.Option(help="Question text of --torch-kind reads.")] = (
        "Which intent does the customer's message express?"),
    limit: Annotated[int | None, typer.Option(
        min=1, help="Read a seeded random subset of this many rows.")] = None,
) -> None:
    """Read every row with the fast model and write one prediction line per row."""
    import asyncio

    from policies.types import DecisionRequest, Option
    from router.backends.sklearn import SklearnBackend
    from router.errors import SlotgateError
    from router.tuning.predictions import read_texts, write_predictions

    check_out(out, "--out")
    try:
        rows = read_texts(data, text_column=text_column, label_column=label_column,
                          id_column=id_column)
        if torch_kind is not None:  # TORCH's addition: in-process LM reads
            from router.backends.torch.backend import TorchBackend

            options = sorted({label for label in rows.labels if label is not None})
            backend: Any = TorchBackend.from_folder(torch_kind, model)
        else:
            backend = SklearnBackend(model)
            options = backend.model.labels
    except SlotgateError as exc:
        fail(str(exc))
    if limit is not None and limit < len(rows.texts):
        import random

        keep = sorted(random.Random(0).sample(range(len(rows.texts)), limit))
        rows = type(rows)(**{name: [getattr(rows, name)[i] for i in keep]
                             for name in ("ids", "texts", "labels")})
    for row, label in enumerate(rows.labels, start=1):
        if label is not None and label not in options:
            fail(f"{data}: row {row}: field {label_column!r}: label {label!r} is not among the "
                 f"model's {len(options)} options")
    choices = tuple(Option(name) for name in options)
    instructions = question if torch_kind is not None else ""
    requests = [DecisionRequest(question_id=i if torch_kind is None else "intent",
                                instructions=instructions, options=choices, state=text)
                for i, text in zip(rows.ids, rows.texts, strict=True)]

    async def read_all() -> list[Any]:
        scores: list[Any] = []
        with progress() as bar:
            task = bar.add_task(f"predicting {data.name}", total=len(requests))
            for start in range(0, len(requests), batch_size):
                scores += await backend.read(requests[start:start + batch_size])
                bar.update(task, completed=len(scores))
        return scores

    try:
        scores = asyncio.run(read_all())
    except SlotgateError as exc:
        fail(f"{model}: {exc}")
    fingerprint = backend.fingerprint
    write_predictions(out, ({"id": i, "options": list(options), "proba": list(s.proba),
                             "label": label, "text": text, "fingerprint": fingerprint}
                            for i, text, label, s in zip(rows.ids, rows.texts, rows.labels, scores,
                                                         strict=True)))
    typer.echo(f"wrote {len(scores)} predictions over {len(options)} options -> {out} "
               f"(fingerprint {fingerprint})")


def load_preds(path: Path, *, labelled: bool) -> Any:
    """Read a predictions file, exiting 2 on bad input or (``labelled``) with no labelled row."""
    from router.tuning.predictions import PredictionsError, read_predictions

    try:
        preds = read_predictions(path)
    except PredictionsError as exc:
        fail(str(exc))
    if labelled and not preds.labelled.any():
        fail(f"{path}: field 'label': no row is labelled; this command needs labels")
    return preds


def show_table(title: str, rows: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, value)
    Console(width=120).print(table)


def write_report(folder: Path, proba_before: Any, proba_after: Any, y_true: Any, *,
                 threshold: float | None, target_accuracy: float, title: str) -> None:
    """The reliability diagram and the risk-coverage plot (threshold marked) as PNGs."""
    from calibration.plots import reliability_diagram, risk_coverage_plot
    from policies.tuning import answer_confidence

    folder.mkdir(parents=True, exist_ok=True)
    answers, confidence = answer_confidence(proba_before, proba_after)
    reliability_diagram(folder / "reliability.png", proba_before, proba_after, y_true,
                        title=f"Reliability: {title}")
    risk_coverage_plot(folder / "risk_coverage.png", confidence, answers == y_true,
                       threshold=threshold, target_accuracy=target_accuracy,
                       title=f"Risk-coverage: {title}")


def fmt(value: float | None, ci: list[float] | None = None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4f}" + (f"  [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")


@app.command()
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
    seed: int = 0,
    audit_rate: Annotated[float, typer.Option(help="Share of accepted decisions also sent to the "
                                              "slow model after the reply (monitoring).")] = 0.0,
    on_alarm: Annotated[str, typer.Option(help="escalate_all | alert_only: what a drift or "
                                          "accuracy alarm does.")] = "escalate_all",
) -> None:
    """Tune a policy: calibrator and guaranteed threshold from labelled predictions.

    The labelled rows are split with a fixed seed: one part fits the calibrator, the other
    chooses the threshold. With --max-escalation the guaranteed threshold still stands: the
    policy caps escalation at runtime, and answers it accepts below the threshold say so.
    """
    from calibration.calibrators import calibrator_kinds
    from calibration.metrics import ece
    from calibration.monitoring import reference_summary
    from policies.file import PolicyFile
    from policies.tuning import tune as tune_policy

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
    check_out(out, "--out")
    if report is not None:
        check_folder(report, "--report")
    data = load_preds(preds, labelled=True)
    fingerprint = single(data.fingerprints, "fingerprint", preds) or "unknown"
    signature = single(data.signatures, "signature", preds)
    mask = data.labelled
    try:
        result = tune_policy(data.proba[mask], data.y_true[mask], calibrator=calibrator,
                             target_accuracy=target_accuracy, delta=delta, seed=seed,
                             calibration_fraction=calibration_fraction,
                             max_escalation=max_escalation, budget_window=budget_window)
    except ValueError as exc:
        fail(f"{preds}: {exc}")
    risk = result.risk
    policy = PolicyFile(
        name=name or out.stem, signature=signature, backend_fingerprint=fingerprint,
        calibrator=result.calibrator.to_dict(), rule=result.rule.to_dict(),
        threshold=risk.threshold, target_accuracy=target_accuracy, delta=delta,
        bound=risk.bound, coverage=risk.coverage, n_tune=risk.n,
        n_calibration=result.n_calibration, seed=seed, max_escalation=max_escalation,
        budget_threshold=result.budget_threshold, budget_exceeded=result.budget_exceeded,
        data_hash=data.data_hash, audit_rate=audit_rate, on_alarm=on_alarm,
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
        ("rows: calibration / threshold", f"{result.n_calibration} / {risk.n}"),
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


@app.command(name="eval")
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


@app.command()
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


@app.command(name="export-log")
def export_log(
    out: Annotated[Path, typer.Option(help="Predictions JSONL to write (input of `slotgate tune`).")],
    config: Annotated[Path | None, typer.Option(help="slotgate YAML config naming the log "
                                                "(default: ./slotgate.yaml when present).")] = None,
    log: Annotated[list[Path] | None, typer.Option(
        help="Decision log JSONL (default: the config's). Repeat it to join the logs of several "
             "replicas: feedback sent to one replica for a decision made on another is in the "
             "other's log.")] = None,
    signature: Annotated[str | None, typer.Option(help="The question to export, when the log "
                                                  "holds several.")] = None,
    labelled_only: Annotated[bool, typer.Option(help="Only decisions with feedback.")] = False,
    audit_labels: Annotated[bool, typer.Option(help="Label decisions without feedback by their "
                                               "audit (the slow model's answer); a human label "
                                               "wins.")] = False,
) -> None:
    """Join the decision log with its feedback labels into a predictions file."""
    from router.errors import ConfigError
    from router.http.server import default_config
    from router.settings import load_settings
    from router.store.decision_log import export_predictions
    from router.tuning.predictions import PredictionsError

    check_out(out, "--out")
    try:  # the same settings `serve` reads: --config, else ./slotgate.yaml, then SLOTGATE_*
        sources = log if log else [load_settings(default_config(config)).log.decision_log_path]
    except ConfigError as exc:
        fail(exc.message)
    for source in sources:
        if not source.is_file():
            fail(f"decision log {source}: file not found")
    try:
        n = export_predictions(sources, out, signature=signature, labelled_only=labelled_only,
                               audit_labels=audit_labels)
    except PredictionsError as exc:
        fail(exc.message)
    typer.echo(f"wrote {n} predictions from {', '.join(map(str, sources))} to {out}")


@app.command()
def serve(
    config: Annotated[Path | None, typer.Option(help="slotgate YAML config (default: ./slotgate.yaml "
                                                "when present).")] = None,
    host: Annotated[str | None, typer.Option(help="Interface (default: the config's).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: the config's).")] = None,
) -> None:
    """Run the routing proxy (OpenAI and System One routes) under uvicorn."""
    from router.errors import ConfigError
    from router.http.server import serve as run_server

    try:
        run_server(config=config, host=host, port=port)
    except ConfigError as exc:  # settings, decision log, model or policy: named in the message
        fail(exc.message)


# `slotgate monitor` lives with the monitoring it replays (router/monitoring/cli.py).
from router.monitoring.cli import monitor as _monitor

app.command(name="monitor")(_monitor)
