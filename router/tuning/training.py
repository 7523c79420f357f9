"""A fast text model trained from labelled rows (``slotgate train``): the model artifact, with
its out-of-fold reads for a cross-fitted tune and the rows held out of training, all written
after every input was read and checked."""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.tuning.predictions import LabelledTexts, PredictionsError, read_texts, write_predictions
from router.tuning.sampling import holdout_split

if TYPE_CHECKING:
    from policies.scope import Question
    from router.tuning.crossfit import OutOfFold

# How far long work has got: (what is being done, steps done, steps in all); called with 0
# done before the first step and after each one.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class TrainedModel:
    """What ``train_model`` wrote: the model's kind, its training rows and classes, and the
    rows held out of training."""

    kind: str
    n_train: int
    n_classes: int
    n_held: int


def train_model(data: Path, out: Path, *, question: Question, text_column: str = "text",
                label_column: str = "label", id_column: str | None = None, kind: str = "tfidf",
                holdout: float = 0.0, holdout_out: Path | None = None,
                n_folds: int | None = None, oof_out: Path | None = None, seed: int = 0,
                on_progress: Progress | None = None) -> TrainedModel:
    """Train a ``kind`` model on ``data``'s labelled rows for ``question`` and save it to
    ``out``. A seeded ``holdout`` share of the rows is left out (written to ``holdout_out`` as
    CSV); with ``n_folds``, every training row is also read by a model fit on the other folds
    (written to ``oof_out`` in the predictions format, their record kept in the artifact).
    ``seed`` fixes the split, the folds and the model's own randomness.

    Bad rows or labels raise PredictionsError naming the file and field; an ``n_folds`` the
    classes cannot fill raises ValueError naming ``n_folds``. Nothing is written then."""
    from router.backends.sklearn import save_text_model

    rows = read_texts(data, text_column=text_column, label_column=label_column,
                      id_column=id_column, require_labels=True)
    fit_rows, held = holdout_split(len(rows.texts), holdout, seed=seed)
    ids = [rows.ids[i] for i in fit_rows]
    texts = [rows.texts[i] for i in fit_rows]
    labels = [str(rows.labels[i]) for i in fit_rows]
    if n_folds is not None:
        from calibration.crossfit import check_n_folds

        check_n_folds(n_folds, labels)
    try:
        model, oof = _fit(texts, labels, kind=kind, n_folds=n_folds, seed=seed,
                          on_progress=on_progress or (lambda *_: None))
    except ValueError as exc:
        raise PredictionsError(data, None, label_column, str(exc)) from exc
    save_text_model(out, model, kind=kind, n_train=len(texts),
                    data_hash=hashlib.sha256(data.read_bytes()).hexdigest(), question=question,
                    extra=None if oof is None else {"oof": oof.record(ids, labels)})
    if oof is not None and oof_out is not None:
        write_out_of_fold(oof_out, oof, out, ids=ids, texts=texts, labels=labels)
    if holdout_out is not None:
        _write_held_out(holdout_out, rows, held, text_column=text_column,
                        label_column=label_column)
    return TrainedModel(kind=kind, n_train=len(texts), n_classes=len(model.classes_),
                        n_held=len(held))


def _fit(texts: list[str], labels: list[str], *, kind: str, n_folds: int | None, seed: int,
         on_progress: Progress) -> tuple[Any, OutOfFold | None]:
    """The model fit on all rows, after the out-of-fold reads when ``n_folds`` asks for them:
    one progress step per fold model, and one for the model saved."""
    from router.backends.sklearn import train_text_model

    doing = (f"training {kind} on {len(texts)} rows"
             + (f" ({n_folds} out-of-fold models first)" if n_folds else ""))
    total = (n_folds or 0) + 1
    on_progress(doing, 0, total)
    oof = None
    if n_folds is not None:
        from router.tuning.crossfit import out_of_fold

        oof = out_of_fold(texts, labels, kind=kind, n_folds=n_folds, seed=seed,
                          on_fold=lambda k: on_progress(doing, k + 1, total))
    model = train_text_model(texts, labels, kind=kind, seed=seed)
    on_progress(doing, total, total)
    return model, oof


def write_out_of_fold(path: Path, oof: OutOfFold, model_path: Path, *, ids: list[str],
                      texts: list[str], labels: list[str]) -> None:
    """The out-of-fold reads in the ``predict`` format, plus each row's fold; the fingerprint is
    the saved model's, the one a policy tuned on these rows will serve with."""
    from router.backends.sklearn import SklearnBackend

    backend = SklearnBackend(model_path)
    fingerprint, question = backend.fingerprint, backend.model.question
    asked = {} if question is None else {"question": question.as_dict()}
    options = list(oof.classes)
    write_predictions(path, ({"id": i, "options": options, "proba": [float(p) for p in row],
                              "label": label, "text": text, "fingerprint": fingerprint,
                              "fold": int(fold), **asked}
                             for i, text, label, row, fold in zip(ids, texts, labels, oof.proba,
                                                                  oof.folds, strict=True)))


def _write_held_out(path: Path, rows: LabelledTexts, held: list[int], *, text_column: str,
                    label_column: str) -> None:
    """The held-out rows as CSV (id, text, label), under the input's column names."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", text_column, label_column])
        for i in held:
            writer.writerow([rows.ids[i], rows.texts[i], rows.labels[i]])
