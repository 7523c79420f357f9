"""`slotgate compare`'s pairing: rows joined by id, labelled on both sides with the same label;
McNemar on the pairs; refusals name the file, row and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router.tuning.pairing import compare_predictions
from router.tuning.predictions import PredictionsError, read_predictions

OPTIONS = ["a", "b"]


def preds(path: Path, rows: list[tuple[str, str | None, float]]) -> Any:
    """rows: (id, label, probability of "a")."""
    path.write_text("".join(json.dumps({"id": i, "options": OPTIONS, "proba": [p, 1 - p],
                                        "label": label}) + "\n" for i, label, p in rows))
    return read_predictions(path)


def test_pairs_by_id_and_counts_the_discordant_rows(tmp_path: Path) -> None:
    first = preds(tmp_path / "a.jsonl", [("1", "a", 0.9), ("2", "b", 0.9), ("3", "a", 0.8),
                                         ("4", None, 0.5), ("only-a", "a", 0.9)])
    second = preds(tmp_path / "b.jsonl", [("3", "a", 0.2), ("2", "b", 0.1), ("1", "a", 0.7),
                                          ("4", "a", 0.6)])
    summary = compare_predictions(first, second)
    # A right on 1 and 3, wrong on 2; B right on 1 and 2, wrong on 3.
    assert summary["n"] == 3 and (summary["a_only"], summary["b_only"]) == (1, 1)
    assert summary["accuracy_a"] == pytest.approx(2 / 3) and summary["answers_agree"] == \
        pytest.approx(1 / 3)
    assert (summary["unpaired_a"], summary["unpaired_b"]) == (2, 1)
    assert 0.0 <= summary["p_value"] <= 1.0


def test_refusals_name_file_row_and_field(tmp_path: Path) -> None:
    first = preds(tmp_path / "a.jsonl", [("1", "a", 0.9)])
    disjoint = preds(tmp_path / "b.jsonl", [("2", "a", 0.9)])
    with pytest.raises(PredictionsError, match="field 'id': no labelled row id appears in both"):
        compare_predictions(first, disjoint)
    relabelled = preds(tmp_path / "c.jsonl", [("1", "b", 0.9)])
    with pytest.raises(PredictionsError) as info:
        compare_predictions(first, relabelled)
    assert str(info.value).startswith(f"{tmp_path / 'c.jsonl'}: row 1: field 'label': 'b'")
