"""``slotgate train`` and ``slotgate predict``: a fast text model from labelled rows (with its
out-of-fold reads for a cross-fitted tune), and one prediction line per row read by a model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from router.cli.common import (
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
    question: QuestionId = None,
    instructions: QuestionText = "",
    context: QuestionContext = "",
    question_kind: QuestionKindFlag = "choice",
) -> None:
    """Train a fast text classifier for one question and save it as a versioned artifact.

    --question (with --instructions, --context, --question-kind where the question has them)
    names the question the labels answer; the model reads that question only, and its
    out-of-fold reads and `predict` rows carry it to `tune` (docs/calibration.md, "Scope").
    """
    import csv
    import hashlib

    from router.backends.sklearn import MODEL_KINDS, save_text_model, train_text_model
    from router.tuning.predictions import PredictionsError, read_texts
    from router.tuning.sampling import holdout_split

    if kind not in MODEL_KINDS:
        fail(f"--kind must be one of {', '.join(MODEL_KINDS)}, got {kind!r}")
    asked = question_of(question, instructions=instructions, context=context,
                        kind=question_kind)
    if asked is None:
        fail("--question: name the question the labels answer (an OpenAI json_schema name or "
             "property, a System One question id): the model reads that question only")
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
                    question=asked,
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

    backend = SklearnBackend(model_path)
    fingerprint, question = backend.fingerprint, backend.model.question
    asked = {} if question is None else {"question": question.as_dict()}
    options = list(oof.classes)
    write_predictions(path, ({"id": i, "options": options, "proba": [float(p) for p in row],
                              "label": label, "text": text, "fingerprint": fingerprint,
                              "fold": int(fold), **asked}
                             for i, text, label, row, fold in zip(ids, texts, labels, oof.proba,
                                                                  oof.folds, strict=True)))


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
    import asyncio

    from policies.scope import Question
    from policies.types import DecisionRequest, Option
    from router.backends.sklearn import SklearnBackend
    from router.errors import SlotgateError
    from router.tuning.predictions import read_texts, write_predictions
    from router.tuning.sampling import seeded_subset

    check_out(out, "--out")
    named = question_of(question, instructions=instructions, context=context,
                        kind=question_kind)
    asked: Question | None
    try:
        rows = read_texts(data, text_column=text_column, label_column=label_column,
                          id_column=id_column)
        if torch_kind is not None:  # TORCH's addition: in-process LM reads
            from router.backends.torch.backend import TorchBackend

            options = sorted({label for label in rows.labels if label is not None})
            backend: Any = TorchBackend.from_folder(torch_kind, model)
            asked = named or Question.asked(
                "intent", instructions="Which intent does the customer's message express?")
        else:
            backend = SklearnBackend(model)
            options = backend.model.labels
            asked = backend.model.question
            if named is not None and asked is not None and named != asked:
                fail(f"--question: {model} was trained for question {asked.describe()}, not "
                     f"{named.describe()}; it reads no other")
            asked = asked or named
    except SlotgateError as exc:
        fail(str(exc))
    if limit is not None:
        rows = seeded_subset(rows, limit, seed=0)
    for row, label in enumerate(rows.labels, start=1):
        if label is not None and label not in options and not allow_novel_labels:
            fail(f"{data}: row {row}: field {label_column!r}: label {label!r} is not among the "
                 f"model's {len(options)} options (pass --allow-novel-labels to keep such rows, "
                 "counted wrong)")
    choices = tuple(Option(name) for name in options)
    # A model trained before questions were recorded reads any; the row id then stands in.
    requests = [DecisionRequest(question_id=asked.id, instructions=asked.instructions,
                                context=asked.context, kind=asked.kind, options=choices,
                                state=text) if asked is not None
                else DecisionRequest(question_id=i, instructions="", options=choices, state=text)
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
    known = set(options)
    recorded = {} if asked is None else {"question": asked.as_dict()}
    write_predictions(out, ({"id": i, "options": list(options), "proba": list(s.proba),
                             "label": label, "text": text, "fingerprint": fingerprint,
                             **recorded,
                             **({"novel": True} if label is not None and label not in known
                                else {})}
                            for i, text, label, s in zip(rows.ids, rows.texts, rows.labels, scores,
                                                         strict=True)))
    n_novel = sum(label is not None and label not in known for label in rows.labels)
    typer.echo(f"wrote {len(scores)} predictions over {len(options)} options -> {out} "
               f"(fingerprint {fingerprint})"
               + (f"; {n_novel} rows labelled outside the options (novel)" if n_novel else ""))
