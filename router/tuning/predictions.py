"""Reading labelled text (CSV or JSONL) and the predictions JSONL format every tuning step reads,
validated once here so that a bad file fails with its name, row and field (PredictionsError).

Predictions format, one JSON object per line::

    {"id": str, "options": [str, ...], "proba": [float, ...], "label": str | null,
     "text": str (optional), "signature": str (optional), "fingerprint": str (optional),
     "fold": int (optional; out-of-fold reads from ``slotgate train --cv``: the fold whose model
     did not see the row), "reference": "human" | "slow" (optional; where the label came from),
     "novel": true (optional; the label is none of the options, ``predict --allow-novel-labels``:
     the row is always wrong), "question": {"id", "instructions", "context", "kind"} (optional;
     the question the rows answer, ``policies.scope.Question``: the same on every row)}
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from calibration.artifacts import atomic_path
from policies.evaluation import NOVEL_LABEL
from policies.scope import Question
from router.errors import ConfigError

SUM_TOLERANCE = 1e-4  # the same tolerance OptionScores accepts
REFERENCES = ("human", "slow")  # where a label came from: /v1/feedback, or the slow model's answer


class PredictionsError(ConfigError):
    """A bad input or predictions file; ``row`` is 1-based over data rows (None: the whole file)."""

    def __init__(self, file: Path | str, row: int | None, field: str | None, message: str) -> None:
        where = [str(file)]
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{': '.join(where)}: {message}", field=field)
        self.file = str(file)
        self.row = row


@dataclass(frozen=True)
class LabelledTexts:
    """Rows of an input file: ids (the id column, else the 1-based row number), texts, labels."""

    ids: list[str]
    texts: list[str]
    labels: list[str | None]


@dataclass(frozen=True)
class Predictions:
    """A validated predictions file. ``y_true`` is the label's option index, -1 where unknown,
    ``NOVEL_LABEL`` where the label is none of the options (the row is always wrong)."""

    path: Path
    ids: list[str]
    options: tuple[str, ...]
    proba: npt.NDArray[np.float64]
    labels: list[str | None]
    y_true: npt.NDArray[np.int64]
    fingerprints: list[str | None]
    signatures: list[str | None]
    data_hash: str  # sha256 of the file's bytes
    folds: list[int | None]
    references: list[str | None]
    question: Question | None = None  # the question every row answers, when they record one
    texts: list[Any] = field(default_factory=list)  # each row's "text" as written (None: none)

    @property
    def labelled(self) -> npt.NDArray[np.bool_]:
        """Rows labelled with one of the options."""
        return self.y_true >= 0

    @property
    def scored(self) -> npt.NDArray[np.bool_]:
        """Rows with any label, novel ones included (what an evaluation counts)."""
        scored: npt.NDArray[np.bool_] = self.y_true != -1
        return scored

    @property
    def n_novel(self) -> int:
        return int((self.y_true == NOVEL_LABEL).sum())


def _is_jsonl(path: Path) -> bool:
    return path.suffix.lower() in {".jsonl", ".json", ".ndjson"}


def _jsonl_records(path: Path) -> list[dict[str, Any]]:
    """One dict per non-blank line."""
    rows: list[dict[str, Any]] = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            line = _utf8_line(path, raw, number)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PredictionsError(path, len(rows) + 1, None, f"not JSON: {exc}") from exc
            except RecursionError as exc:  # the parser's own limit, near 1,000 levels
                raise PredictionsError(path, len(rows) + 1, None,
                                       "not JSON this reader accepts: nested too deeply") from exc
            if not isinstance(obj, dict):
                raise PredictionsError(path, len(rows) + 1, None, "not a JSON object")
            rows.append(obj)
    return rows


def _utf8_line(path: Path, raw: bytes, number: int) -> str:
    try:
        return raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise PredictionsError(path, None, None, _not_utf8(raw, exc.start, line=number)) from exc


def _not_utf8(data: bytes, offset: int, *, line: int) -> str:
    """Where the first byte that is not UTF-8 sits: line, column within it, and its value."""
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return (f"line {line}: not UTF-8 text (byte 0x{data[offset]:02x} at column {column}); "
            "re-save the file as UTF-8")


def _csv_records(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The header and one dict per row (CRLF-safe: the csv module with ``newline=''``). The
    bytes are decoded first so that a non-UTF-8 file names its line, not a codec traceback."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PredictionsError(path, None, None, _not_utf8(data, exc.start, line=line)) from exc
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows: list[dict[str, Any]] = [dict(r) for r in reader]
    return list(reader.fieldnames or []), rows


def read_texts(
    path: Path, *, text_column: str, label_column: str | None, id_column: str | None = None,
    require_labels: bool = False,
) -> LabelledTexts:
    """Texts (and labels, when ``label_column`` is given) from a CSV or JSONL file."""
    wanted = [c for c in (text_column, label_column, id_column) if c is not None]
    records = _text_records(path, wanted)
    ids, texts, labels = [], [], []
    for row, record in enumerate(records, start=1):
        for column in wanted:
            if column not in record:
                raise PredictionsError(path, row, column, "missing column")
        text = record[text_column]
        if not isinstance(text, str) or not text.strip():
            raise PredictionsError(path, row, text_column, "empty or not a string")
        ids.append(str(record[id_column]) if id_column else str(record.get("id") or row))
        texts.append(text)
        labels.append(_label(path, row, None if label_column is None else record[label_column],
                             label_column, required=require_labels))
    if len(set(ids)) != len(ids):
        raise PredictionsError(path, None, id_column or "id", "ids are not unique")
    return LabelledTexts(ids, texts, labels)


def _text_records(path: Path, columns: list[str]) -> list[dict[str, Any]]:
    """The rows of a CSV or JSONL input file, at least one; a CSV header must hold ``columns``
    (checked on the header first, so a header-only file still names the missing column)."""
    if not path.is_file():
        raise PredictionsError(path, None, None, "file not found")
    header: list[str] | None = None
    if _is_jsonl(path):
        records = _jsonl_records(path)
    else:
        header, records = _csv_records(path)
    if not records and not header:
        raise PredictionsError(path, None, None, "file is empty (no header, no rows)")
    missing = [column for column in columns if header is not None and column not in header]
    if missing:
        raise PredictionsError(path, None, missing[0], f"missing column (columns: {header})")
    if not records:
        raise PredictionsError(path, None, None, "file is empty (no data rows)")
    return records


def _label(path: Path, row: int, label: Any, column: str | None, *,
           required: bool) -> str | None:
    """A row's label: a string, or a JSONL class id (an int, named by the number); empty is
    None, refused when ``required``."""
    if isinstance(label, int) and not isinstance(label, bool):
        label = str(label)
    if label is not None and not isinstance(label, str):
        raise PredictionsError(path, row, column, f"label {label!r} is not a string")
    if required and not label:
        raise PredictionsError(path, row, column, "label is empty")
    return label or None


def write_predictions(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write rows atomically (a temporary file renamed into place: a failure leaves nothing)."""
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(dict(row), ensure_ascii=False) + "\n")


def _check_row(path: Path, row: int, obj: dict[str, Any]) -> tuple[list[str], list[float]]:
    """One row's options and probabilities, every field of the format checked (the error names
    the field)."""
    for key in ("id", "options", "proba", "label"):
        if key not in obj:
            raise PredictionsError(path, row, key, "missing field")
    if not isinstance(obj["id"], str) or not obj["id"]:
        raise PredictionsError(path, row, "id", "must be a non-empty string")
    options = _options(path, row, obj["options"])
    proba = _proba(path, row, obj["proba"], len(options))
    _check_label(path, row, obj["label"], options, obj.get("novel", False))
    fold = obj.get("fold")
    if fold is not None and (isinstance(fold, bool) or not isinstance(fold, int) or fold < 0):
        raise PredictionsError(path, row, "fold", f"{fold!r} is not a fold number (an int >= 0)")
    reference = obj.get("reference")
    if reference is not None and reference not in REFERENCES:
        raise PredictionsError(path, row, "reference",
                               f"{reference!r} is not one of {', '.join(REFERENCES)}")
    return options, proba


def _options(path: Path, row: int, options: Any) -> list[str]:
    if not isinstance(options, list) or len(options) < 2 or not all(
        isinstance(o, str) for o in options
    ):
        raise PredictionsError(path, row, "options", "must be a list of at least 2 strings")
    if len(set(options)) != len(options):
        raise PredictionsError(path, row, "options", "option names repeat")
    return options


def _proba(path: Path, row: int, proba: Any, n_options: int) -> list[float]:
    """One probability per option, each in [0, 1], summing to 1 within ``SUM_TOLERANCE``."""
    if not isinstance(proba, list) or len(proba) != n_options:
        raise PredictionsError(path, row, "proba", f"must be a list of {n_options} numbers")
    for j, p in enumerate(proba):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise PredictionsError(path, row, "proba", f"value {p!r} at index {j} is outside [0, 1]")
    total = math.fsum(proba)
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise PredictionsError(path, row, "proba", f"sums to {total:.6f}, not 1")
    return [float(p) for p in proba]


def _check_label(path: Path, row: int, label: Any, options: list[str], novel: Any) -> None:
    """A label is a string or null; one of the options unless the row says ``novel``."""
    if label is not None and not isinstance(label, str):
        raise PredictionsError(path, row, "label", f"{label!r} is not a string")
    if not isinstance(novel, bool):
        raise PredictionsError(path, row, "novel", f"{novel!r} is not true or false")
    if label is not None and (label in options) == novel:
        raise PredictionsError(path, row, "label", f"{label!r} is among the options but the row "
                               "says novel" if novel else f"{label!r} is not among the options")


def read_predictions(path: Path) -> Predictions:
    """Read and validate a predictions file; any problem raises PredictionsError."""
    if not path.is_file():
        raise PredictionsError(path, None, None, "file not found")
    data = path.read_bytes()
    records = _jsonl_records(path)
    if not records:
        raise PredictionsError(path, None, None, "file is empty (no prediction rows)")
    first: list[str] | None = None
    ids: list[str] = []
    probas: list[list[float]] = []
    labels: list[str | None] = []
    fingerprints: list[str | None] = []
    signatures: list[str | None] = []
    folds: list[int | None] = []
    references: list[str | None] = []
    texts: list[Any] = []
    question: Question | None = None
    for row, obj in enumerate(records, start=1):
        options, proba = _check_row(path, row, obj)
        asked = _question(path, row, obj.get("question"))
        if first is None:
            first, question = options, asked
        elif options != first:
            raise PredictionsError(path, row, "options", "differ from row 1's options")
        elif asked != question:
            raise PredictionsError(path, row, "question", "differs from row 1's question (a "
                                   "predictions file holds one question)")
        ids.append(obj["id"])
        probas.append(proba)
        labels.append(obj["label"])
        fingerprints.append(obj.get("fingerprint"))
        signatures.append(obj.get("signature"))
        folds.append(obj.get("fold"))
        references.append(obj.get("reference"))
        texts.append(obj.get("text"))
    if len(set(ids)) != len(ids):
        raise PredictionsError(path, None, "id", "ids are not unique")
    assert first is not None
    index = {name: j for j, name in enumerate(first)}
    y_true = np.array([-1 if lab is None else index.get(lab, NOVEL_LABEL) for lab in labels],
                      dtype=np.int64)
    return Predictions(
        path=path, ids=ids, options=tuple(first), proba=np.asarray(probas, dtype=np.float64),
        labels=labels, y_true=y_true, fingerprints=fingerprints, signatures=signatures,
        data_hash=hashlib.sha256(data).hexdigest(), folds=folds, references=references,
        question=question, texts=texts,
    )


def _question(path: Path, row: int, raw: Any) -> Question | None:
    """A row's recorded question (``Question.as_dict``'s shape), checked."""
    if raw is None:
        return None
    fields = {"id", "instructions", "context", "kind"}
    if (not isinstance(raw, dict) or not isinstance(raw.get("id"), str)
            or not set(raw) <= fields
            or not all(isinstance(raw.get(k, ""), str) for k in fields)):
        raise PredictionsError(path, row, "question", "must be an object of strings with an "
                               "'id' and optional 'instructions', 'context' and 'kind'")
    try:
        return Question.asked(raw["id"], instructions=raw.get("instructions", ""),
                              context=raw.get("context", ""), kind=raw.get("kind", "choice"))
    except ValueError as exc:
        raise PredictionsError(path, row, "question", str(exc)) from exc
