"""The ``slotgate`` command line: train a fast model, predict, tune a policy, evaluate it, compare
two prediction files, export the decision log. One function per command (``tune`` and ``eval`` in
``tune_cmd.py``); heavy imports inside the commands.

Bad input exits with code 2 and a message naming the file, row and field, having written nothing:
every input is read and checked before the first output is written. The cross-fitted run (every
labelled row both trains and tunes)::

    slotgate train --data train.csv --label-column category --out m.joblib \
        --cv 5 --oof-out oof.jsonl
    slotgate tune --preds oof.jsonl --model m.joblib --target-accuracy 0.95 --out policy.json
    slotgate predict --model m.joblib --data test.csv --label-column category --out test.jsonl
    slotgate eval --preds test.jsonl --policy policy.json --json

or the split one: ``train --holdout 0.3 --holdout-out tune.csv``, ``predict`` on tune.csv, and
``tune --preds tune.jsonl`` (half the held-out rows calibrate, half choose the threshold).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from router.tuning.common import check_out, fail, load_preds, progress, show_table
from router.tuning.tune_cmd import evaluate, tune

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="slotgate: confidence routing for LLM decision calls.")
app.command()(tune)
app.command(name="eval")(evaluate)


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
    cv: Annotated[int | None, typer.Option(
        help="Also read every training row with a model fit on the other folds (K folds, "
             "stratified); the saved model is still fit on all rows. Needs --oof-out.")] = None,
    oof_out: Annotated[Path | None, typer.Option(
        help="Predictions JSONL of the out-of-fold reads (input of `slotgate tune`).")] = None,
    seed: int = 0,
) -> None:
    """Train a fast text classifier and save it as a versioned artifact."""
    import csv
    import hashlib

    from router.backends.sklearn import MODEL_KINDS, save_text_model, train_text_model
    from router.tuning.predictions import PredictionsError, read_texts
    from router.tuning.sampling import holdout_split

    if kind not in MODEL_KINDS:
        fail(f"--kind must be one of {', '.join(MODEL_KINDS)}, got {kind!r}")
    if not 0.0 <= holdout < 1.0:
        fail(f"--holdout must be in [0, 1), got {holdout}")
    if (holdout > 0) != (holdout_out is not None):
        fail("--holdout and --holdout-out go together")
    if (cv is not None) != (oof_out is not None):
        fail("--cv and --oof-out go together")
    check_out(out, "--out")
    if holdout_out is not None:
        check_out(holdout_out, "--holdout-out")
    if oof_out is not None:
        check_out(oof_out, "--oof-out")
    try:
        rows = read_texts(data, text_column=text_column, label_column=label_column,
                          id_column=id_column, require_labels=True)
    except PredictionsError as exc:
        fail(str(exc))
    fit_rows, held = holdout_split(len(rows.texts), holdout, seed=seed)
    texts = [rows.texts[i] for i in fit_rows]
    labels = [str(rows.labels[i]) for i in fit_rows]
    ids = [rows.ids[i] for i in fit_rows]
    if cv is not None:
        from calibration.crossfit import check_n_folds

        try:
            check_n_folds(cv, labels)
        except ValueError as exc:
            fail(f"--cv: {str(exc).removeprefix('n_folds ')}")
    oof = None
    with progress() as bar:
        task = bar.add_task(f"training {kind} on {len(texts)} rows"
                            + (f" ({cv} out-of-fold models first)" if cv else ""),
                            total=(cv or 0) + 1)
        try:
            if cv is not None:
                from router.tuning.crossfit import out_of_fold

                oof = out_of_fold(texts, labels, kind=kind, n_folds=cv, seed=seed,
                                  on_fold=lambda _: bar.advance(task))
            model = train_text_model(texts, labels, kind=kind, seed=seed)
        except ValueError as exc:
            fail(f"{data}: field {label_column!r}: {exc}")
    data_hash = hashlib.sha256(data.read_bytes()).hexdigest()
    save_text_model(out, model, kind=kind, n_train=len(texts), data_hash=data_hash,
                    extra=None if oof is None else {"oof": oof.record(ids, labels)})
    if oof is not None and oof_out is not None:
        write_out_of_fold(oof_out, oof, out, ids=ids, texts=texts, labels=labels)
    if holdout_out is not None:
        with holdout_out.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["id", text_column, label_column])
            for i in held:
                writer.writerow([rows.ids[i], rows.texts[i], rows.labels[i]])
    typer.echo(f"trained {kind} on {len(texts)} rows ({len(model.classes_)} classes) -> {out}"
               + (f"; {len(held)} held-out rows -> {holdout_out}" if holdout_out else "")
               + (f"; {cv}-fold out-of-fold reads -> {oof_out}" if oof_out else ""))


def write_out_of_fold(path: Path, oof: Any, model_path: Path, *, ids: list[str],
                      texts: list[str], labels: list[str]) -> None:
    """The out-of-fold reads in the ``predict`` format, plus each row's fold; the fingerprint is
    the saved model's, the one a policy tuned on these rows will serve with."""
    from router.backends.sklearn import SklearnBackend
    from router.tuning.predictions import write_predictions

    fingerprint = SklearnBackend(model_path).fingerprint
    options = list(oof.classes)
    write_predictions(path, ({"id": i, "options": options, "proba": [float(p) for p in row],
                              "label": label, "text": text, "fingerprint": fingerprint,
                              "fold": int(fold)}
                             for i, text, label, row, fold in zip(ids, texts, labels, oof.proba,
                                                                  oof.folds, strict=True)))


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
    from router.tuning.sampling import seeded_subset

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
    if limit is not None:
        rows = seeded_subset(rows, limit, seed=0)
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


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(help="Predictions JSONL of model A.")],
    b: Annotated[Path, typer.Argument(help="Predictions JSONL of model B.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare two prediction files row by row: discordant pairs, exact McNemar p."""
    from router.tuning.pairing import compare_predictions
    from router.tuning.predictions import PredictionsError

    first, second = load_preds(a, labelled=True), load_preds(b, labelled=True)
    try:
        summary = compare_predictions(first, second)
    except PredictionsError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(summary))
        return
    show_table(f"{a.name} (A) vs {b.name} (B)", [
        ("paired rows", str(summary["n"])),
        ("accuracy A / B", f"{summary['accuracy_a']:.4f} / {summary['accuracy_b']:.4f}"),
        ("same answer", f"{summary['answers_agree']:.4f}"),
        ("both right or both wrong", f"{summary['agreement']:.4f}"),
        ("discordant: only A right / only B right", f"{summary['a_only']} / {summary['b_only']}"),
        ("exact McNemar p", f"{summary['p_value']:.4g}"),
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
    reference: Annotated[str, typer.Option(help="human: labels are /v1/feedback only; slow: "
                                           "where none, the slow model's answer (shadow mode, "
                                           "audits, escalations); `tune` on it promises "
                                           "agreement with the slow model.")] = "human",
    redis_url: Annotated[str | None, typer.Option(
        help="Also read the Redis stream every replica writes its records to (alone, without "
             "--log, only the stream is read).")] = None,
    stream: Annotated[str, typer.Option(help="The stream's name (log.redis_stream).")]
        = "slotgate:v1:log",
) -> None:
    """Join the decision log with its feedback labels into a predictions file."""
    from redis.exceptions import RedisError

    from router.errors import ConfigError
    from router.http.server import default_config
    from router.settings import load_settings
    from router.tuning.log_export import export_predictions
    from router.tuning.predictions import PredictionsError

    if reference not in ("human", "slow"):
        fail(f"--reference must be human or slow, got {reference!r}")
    check_out(out, "--out")
    try:  # the same settings `serve` reads: --config, else ./slotgate.yaml, then SLOTGATE_*
        sources = log if log else [] if redis_url else [
            load_settings(default_config(config)).log.decision_log_path]
    except ConfigError as exc:
        fail(exc.message)
    for source in sources:
        if not source.is_file():
            fail(f"decision log {source}: file not found")
    tally: dict[str, int] = {}
    try:
        n = export_predictions(sources, out, signature=signature, labelled_only=labelled_only,
                               audit_labels=audit_labels,
                               redis_stream=(redis_url, stream) if redis_url else None,
                               reference_slow=reference == "slow", tally=tally)
    except PredictionsError as exc:
        fail(exc.message)
    except (RedisError, OSError) as exc:
        fail(f"--redis-url: cannot read stream {stream!r}: {exc}")
    names = [*map(str, sources), *([f"redis stream {stream}"] if redis_url else [])]
    typer.echo(f"wrote {n} predictions from {', '.join(names)} to {out}: labels "
               f"{tally['human']} human (/v1/feedback), {tally['slow']} the slow model's, "
               f"{tally['unlabelled']} none")


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
