"""Texts read by a fast model into a predictions file (``slotgate predict``): one line per row,
carrying the question read, the model's fingerprint and the row's label."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.scope import Question
from policies.types import DecisionRequest, Option, OptionScores
from router.errors import ConfigError, SlotgateError
from router.tuning.predictions import (
    LabelledTexts,
    PredictionsError,
    read_texts,
    write_predictions,
)
from router.tuning.sampling import seeded_subset
from router.tuning.training import Progress

# The question a torch read asks when none is named (BANKING77's, the demo's data).
INTENT = Question.asked("intent",
                        instructions="Which intent does the customer's message express?")


@dataclass(frozen=True)
class PredictedFile:
    """What ``predict_file`` wrote: rows, options, the model's fingerprint, and the rows
    labelled with none of the options (novel)."""

    n_rows: int
    n_options: int
    fingerprint: str
    n_novel: int


def predict_file(model: Path, data: Path, out: Path, *, text_column: str = "text",
                 label_column: str | None = None, id_column: str | None = None,
                 batch_size: int = 512, torch_kind: str | None = None,
                 question: Question | None = None, limit: int | None = None,
                 allow_novel_labels: bool = False,
                 on_progress: Progress | None = None) -> PredictedFile:
    """Read ``data``'s texts (a seeded subset of ``limit`` rows) with the model at ``model``
    and write one predictions line per row to ``out``, ``batch_size`` rows a read.

    The model is a ``slotgate train`` artifact, read for the question it was trained for
    (``question``, when given, must be that one); or, with ``torch_kind``, a local model folder
    read in process, over the data's sorted labels, for ``question`` (default ``INTENT``).
    A label outside the options is refused unless ``allow_novel_labels`` (written with
    "novel": true). Problems raise a SlotgateError naming the file and field, or the flag."""
    rows = read_texts(data, text_column=text_column, label_column=label_column,
                      id_column=id_column)
    backend, options, asked = _backend(model, torch_kind, rows, question)
    if limit is not None:
        rows = seeded_subset(rows, limit, seed=0)
    novel = [label is not None and label not in options for label in rows.labels]
    if any(novel) and not allow_novel_labels:
        row = novel.index(True) + 1
        raise PredictionsError(data, row, label_column, f"label {rows.labels[row - 1]!r} is not "
                               f"among the model's {len(options)} options (pass "
                               "--allow-novel-labels to keep such rows, counted wrong)")
    requests = _requests(rows, options, asked)
    try:
        scores = asyncio.run(_read_all(backend, requests, batch_size=batch_size,
                                       doing=f"predicting {data.name}",
                                       on_progress=on_progress or (lambda *_: None)))
    except SlotgateError as exc:
        raise PredictionsError(model, None, None, str(exc)) from exc
    fingerprint = backend.fingerprint
    recorded = {} if asked is None else {"question": asked.as_dict()}
    write_predictions(out, ({"id": i, "options": list(options), "proba": list(s.proba),
                             "label": label, "text": text, "fingerprint": fingerprint,
                             **recorded, **({"novel": True} if is_novel else {})}
                            for i, text, label, s, is_novel in zip(
                                rows.ids, rows.texts, rows.labels, scores, novel, strict=True)))
    return PredictedFile(n_rows=len(scores), n_options=len(options), fingerprint=fingerprint,
                         n_novel=sum(novel))


def _backend(model: Path, torch_kind: str | None, rows: LabelledTexts,
             named: Question | None) -> tuple[Any, list[str], Question | None]:
    """The backend reading ``model``, its options and the question it reads. A model trained
    before questions were recorded reads any (None, unless one is named)."""
    if torch_kind is not None:
        from router.backends.torch.backend import TorchBackend

        options = sorted({label for label in rows.labels if label is not None})
        return TorchBackend.from_folder(torch_kind, model), options, named or INTENT
    from router.backends.sklearn import SklearnBackend

    backend = SklearnBackend(model)
    trained_for = backend.model.question
    if named is not None and trained_for is not None and named != trained_for:
        raise ConfigError(f"--question: {model} was trained for question "
                          f"{trained_for.describe()}, not {named.describe()}; it reads no other",
                          field="question")
    return backend, list(backend.model.labels), trained_for or named


def _requests(rows: LabelledTexts, options: Sequence[str],
              asked: Question | None) -> list[DecisionRequest]:
    """One request per row; with no question recorded, the row id stands in for its id."""
    choices = tuple(Option(name) for name in options)
    if asked is None:
        return [DecisionRequest(question_id=i, instructions="", options=choices, state=text)
                for i, text in zip(rows.ids, rows.texts, strict=True)]
    return [DecisionRequest(question_id=asked.id, instructions=asked.instructions,
                            context=asked.context, kind=asked.kind, options=choices, state=text)
            for text in rows.texts]


async def _read_all(backend: Any, requests: list[DecisionRequest], *, batch_size: int,
                    doing: str, on_progress: Progress) -> list[OptionScores]:
    scores: list[OptionScores] = []
    on_progress(doing, 0, len(requests))
    for start in range(0, len(requests), batch_size):
        scores += await backend.read(requests[start:start + batch_size])
        on_progress(doing, len(scores), len(requests))
    return scores
