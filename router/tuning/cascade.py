"""What ``slotgate tune`` and ``slotgate eval`` need of several fast tiers' predictions: one
file per tier over the same rows (checked row by row) and a data hash over all of them."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from router.tuning.predictions import Predictions, PredictionsError

__all__ = ["check_same_rows", "data_hash_of"]


def check_same_rows(files: Sequence[Predictions]) -> None:
    """Every file holds the first file's rows in its order: the same ids, the same labels, the
    same texts (where both rows carry one) and the same options. A difference raises
    ``PredictionsError`` naming the later file, its row and the field."""
    first = files[0]
    for other in files[1:]:
        if len(other.ids) != len(first.ids):
            raise PredictionsError(other.path, None, "id", f"{len(other.ids)} rows, but "
                                   f"{first.path} has {len(first.ids)}: each tier's file reads "
                                   "the same rows in the same order")
        for row, (a, b) in enumerate(zip(first.ids, other.ids, strict=True), start=1):
            if a != b:
                raise PredictionsError(other.path, row, "id", f"{b!r}, but row {row} of "
                                       f"{first.path} is {a!r}: each tier's file reads the same "
                                       "rows in the same order")
        for row, (text, other_text) in enumerate(zip(first.texts, other.texts, strict=True),
                                                 start=1):
            if text is not None and other_text is not None and text != other_text:
                raise PredictionsError(other.path, row, "text", f"differs from row {row} of "
                                       f"{first.path} (id {first.ids[row - 1]!r})")
        for row, (label, other_label) in enumerate(zip(first.labels, other.labels, strict=True),
                                                   start=1):
            if label != other_label:
                raise PredictionsError(other.path, row, "label", f"{other_label!r}, but row "
                                       f"{row} of {first.path} is labelled {label!r}")
        if other.options != first.options:
            raise PredictionsError(other.path, 1, "options", f"differ from {first.path}'s "
                                   "(every tier reads the same options in the same order)")


def data_hash_of(files: Sequence[Predictions]) -> str:
    """The policy file's ``data_hash``: one file's own sha256, or for several the sha256 of
    their hashes in tier order (a different file, or order, gives a different hash)."""
    if len(files) == 1:
        return files[0].data_hash
    return hashlib.sha256("\n".join(f.data_hash for f in files).encode()).hexdigest()
