"""Every field of a predictions row and of a labelled input file is checked where it is read:
a bad value is a PredictionsError naming the file, the row and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router.tuning.predictions import PredictionsError, read_predictions, read_texts

GOOD = {"id": "r1", "options": ["a", "b"], "proba": [0.75, 0.25], "label": "a"}


@pytest.mark.parametrize("change, field, message", [
    ({"id": ""}, "id", "must be a non-empty string"),
    ({"options": ["a"]}, "options", "at least 2 strings"),
    ({"options": ["a", "a"]}, "options", "option names repeat"),
    ({"proba": [1.0]}, "proba", "must be a list of 2 numbers"),
    ({"proba": [True, 0.0]}, "proba", "value True at index 0 is outside [0, 1]"),
    ({"proba": [0.5, 0.4]}, "proba", "sums to 0.900000, not 1"),
    ({"label": 3}, "label", "3 is not a string"),
    ({"novel": "yes"}, "novel", "'yes' is not true or false"),
    ({"label": "c"}, "label", "'c' is not among the options"),
    ({"novel": True}, "label", "'a' is among the options but the row says novel"),
    ({"fold": -1}, "fold", "-1 is not a fold number"),
    ({"reference": "crowd"}, "reference", "'crowd' is not one of human, slow"),
])
def test_a_bad_field_of_a_predictions_row_is_named(
    tmp_path: Path, change: dict[str, Any], field: str, message: str
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "id": "r2", **change}) + "\n")
    with pytest.raises(PredictionsError) as refused:
        read_predictions(path)
    said = str(refused.value)
    assert said.startswith(f"{path}: row 2: field {field!r}: ") and message in said


def test_a_novel_row_is_read_as_always_wrong(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({**GOOD, "label": "c", "novel": True}) + "\n")
    assert read_predictions(path).n_novel == 1


def test_input_labels_are_strings_or_class_ids_and_empty_is_none(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"text": "one", "label": 7}, {"text": "two", "label": ""}, {"text": "three"})))
    with pytest.raises(PredictionsError, match="row 3: field 'label': missing column"):
        read_texts(path, text_column="text", label_column="label")
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"text": "one", "label": 7}, {"text": "two", "label": ""})))
    rows = read_texts(path, text_column="text", label_column="label")
    assert rows.labels == ["7", None] and rows.ids == ["1", "2"]
    with pytest.raises(PredictionsError, match="row 2: field 'label': label is empty"):
        read_texts(path, text_column="text", label_column="label", require_labels=True)
    path.write_text(json.dumps({"text": "one", "label": ["x"]}) + "\n")
    with pytest.raises(PredictionsError, match=r"field 'label': label \['x'\] is not a string"):
        read_texts(path, text_column="text", label_column="label")


def test_a_header_only_csv_names_the_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("text,category\n")
    with pytest.raises(PredictionsError) as refused:
        read_texts(path, text_column="text", label_column="label")
    assert str(refused.value).startswith(f"{path}: field 'label': missing column")
    with pytest.raises(PredictionsError, match="no data rows"):
        read_texts(path, text_column="text", label_column="category")
