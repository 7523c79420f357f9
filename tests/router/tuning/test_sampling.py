"""The seeded row choices of `slotgate train --holdout` and `slotgate predict --limit`."""

from __future__ import annotations

import pytest

from router.tuning.predictions import LabelledTexts
from router.tuning.sampling import holdout_split, seeded_subset


def test_holdout_split_partitions_the_rows_reproducibly() -> None:
    fit, held = holdout_split(1000, 0.3, seed=0)
    assert len(held) == 300 and sorted(fit + held) == list(range(1000))
    assert fit == sorted(fit) and held == sorted(held)
    assert holdout_split(1000, 0.3, seed=0) == (fit, held)
    assert holdout_split(1000, 0.3, seed=1)[1] != held
    assert holdout_split(10, 0.0, seed=0) == (list(range(10)), [])
    with pytest.raises(ValueError, match="holdout must be in"):
        holdout_split(10, 1.0, seed=0)


def test_seeded_subset_keeps_rows_whole_and_in_file_order() -> None:
    rows = LabelledTexts(ids=[f"r{i}" for i in range(50)], texts=[f"t{i}" for i in range(50)],
                         labels=[f"l{i % 3}" for i in range(50)])
    subset = seeded_subset(rows, 10)
    assert len(subset.ids) == 10 and subset.ids == sorted(subset.ids, key=lambda r: int(r[1:]))
    for row_id, text, label in zip(subset.ids, subset.texts, subset.labels, strict=True):
        i = int(row_id[1:])
        assert (text, label) == (f"t{i}", f"l{i % 3}")
    assert seeded_subset(rows, 10) == subset and seeded_subset(rows, 10, seed=1) != subset
    assert seeded_subset(rows, 50) is rows
