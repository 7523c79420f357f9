"""``slotgate train`` and ``slotgate predict``: a fast text model from labelled rows (with its
out-of-fold reads for a cross-fitted tune), and one prediction line per row read by a model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from router.cli.common import (
    QUESTION_HELP,
    QuestionContext,
    QuestionId,
    QuestionKindFlag,
    QuestionText,
    check_out,
    fail,
    progress,
    question_of,
)

Text = Annotated[str, typer.Option(help="Name of the text column.")]
IdColumn = Annotated[str | None, typer.Option(help="Column with row ids (default: 'id' if "
                                              "present, else the 1-based row number).")]


def train(
    data: Annotated[Path, typer.Option(help="Labelled CSV or JSONL file.")],
    out: Annotated[Path, typer.Option(help="Where to write the model artifact (joblib).")],
    question: Annotated[str, typer.Option("--question", help=QUESTION_HELP)],
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
    seed: Annotated[int, typer.Option(help="Seed of the held-out split, the folds and the "
                                      "model's own randomness: the same seed, the same model.")] = 0,
    instructions: QuestionText = "",
    context: QuestionContext = "",
    question_kind: QuestionKindFlag = "choice",
) -> None:
    """Train a fast text classifier for one question and save it as a versioned artifact.

    --question (with --instructions, --context, --question-kind where the question has them)
    names the question the labels answer; the model reads that question only, and its
    out-of-fold reads and `predict` rows carry it to `tune` (docs/calibration.md, "Scope").
    """
    from router.backends.sklearn import MODEL_KINDS
    from router.tuning.predictions import PredictionsError
    from router.tuning.training import train_model

    if kind not in MODEL_KINDS:
        fail(f"--kind must be one of {', '.join(MODEL_KINDS)}, got {kind!r}")
    asked = question_of(question, instructions=instructions, context=context,
                        kind=question_kind)
    assert asked is not None  # --question is required
    if not 0.0 <= holdout < 1.0:
        fail(f"--holdout must be in [0, 1), got {holdout}")
    if (holdout > 0) != (holdout_out is not None):
        fail("--holdout and --holdout-out go together")
    if (cv is not None) != (oof_out is not None):
        fail("--cv and --oof-out go together")
    for path, flag in ((out, "--out"), (holdout_out, "--holdout-out"), (oof_out, "--oof-out")):
        if path is not None:
            check_out(path, flag)
    try:
        with progress() as report:
            trained = train_model(data, out, question=asked, text_column=text_column,
                                  label_column=label_column, id_column=id_column, kind=kind,
                                  holdout=holdout, holdout_out=holdout_out, n_folds=cv,
                                  oof_out=oof_out, seed=seed, on_progress=report)
    except PredictionsError as exc:
        fail(str(exc))
    except ValueError as exc:  # only the folds' check raises it: --cv does not fit the classes
        fail(f"--cv: {str(exc).removeprefix('n_folds ')}")
    typer.echo(f"trained {kind} on {trained.n_train} rows ({trained.n_classes} classes) -> {out}"
               + (f"; {trained.n_held} held-out rows -> {holdout_out}" if holdout_out else "")
               + (f"; {cv}-fold out-of-fold reads -> {oof_out}" if oof_out else ""))


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
    question: QuestionId = None,
    instructions: QuestionText = "",
    context: QuestionContext = "",
    question_kind: QuestionKindFlag = "choice",
    limit: Annotated[int | None, typer.Option(
        min=1, help="Read a seeded random subset of this many rows.")] = None,
    allow_novel_labels: Annotated[bool, typer.Option(
        help="Keep rows whose label is none of the model's options (a class it never learnt, "
             "as under a novel-class shift): written with \"novel\": true, `eval` counts them "
             "wrong, `tune` refuses them.")] = False,
) -> None:
    """Read every row with the fast model and write one prediction line per row.

    The rows carry the question read: the one the model was trained for, or, for --torch-kind
    reads, the one --question names (default: "intent", asked as "Which intent does the
    customer's message express?")."""
    from router.errors import SlotgateError
    from router.tuning.predict import predict_file

    check_out(out, "--out")
    named = question_of(question, instructions=instructions, context=context,
                        kind=question_kind)
    try:
        with progress() as report:
            written = predict_file(model, data, out, text_column=text_column,
                                   label_column=label_column, id_column=id_column,
                                   batch_size=batch_size, torch_kind=torch_kind, question=named,
                                   limit=limit, allow_novel_labels=allow_novel_labels,
                                   on_progress=report)
    except SlotgateError as exc:
        fail(str(exc))
    typer.echo(f"wrote {written.n_rows} predictions over {written.n_options} options -> {out} "
               f"(fingerprint {written.fingerprint})"
               + (f"; {written.n_novel} rows labelled outside the options (novel)"
                  if written.n_novel else ""))
