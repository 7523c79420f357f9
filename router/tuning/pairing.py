"""``slotgate compare``'s domain: two prediction files paired row by row (by id, labelled rows
only, the label agreeing), each side's top answer scored against it, and the exact McNemar test
on the discordant pairs (``calibration.compare.paired_comparison``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from router.tuning.predictions import Predictions, PredictionsError


def compare_predictions(first: Predictions, second: Predictions) -> dict[str, Any]:
    """The paired comparison of A (``first``) and B (``second``) as one JSON-able dict: the
    McNemar result, the share of identical answers, and the rows of each file left unpaired.
    Raises PredictionsError (naming file, row and field) when no labelled id is shared or a
    shared id carries different labels."""
    from calibration.compare import paired_comparison

    index_b = {row_id: j for j, row_id in enumerate(second.ids)}
    pairs = [(i, index_b[row_id]) for i, row_id in enumerate(first.ids)
             if row_id in index_b and first.labels[i] is not None
             and second.labels[index_b[row_id]] is not None]
    if not pairs:
        raise PredictionsError(f"{first.path} and {second.path}", None, "id",
                               "no labelled row id appears in both files")
    for i, j in pairs:
        if first.labels[i] != second.labels[j]:
            raise PredictionsError(second.path, j + 1, "label",
                                   f"{second.labels[j]!r} differs from {first.path}'s "
                                   f"{first.labels[i]!r} for id {first.ids[i]!r}")
    rows_a, rows_b = (np.array(side) for side in zip(*pairs, strict=True))
    answer_a = [first.options[k] for k in first.proba[rows_a].argmax(axis=1)]
    answer_b = [second.options[k] for k in second.proba[rows_b].argmax(axis=1)]
    labels = [first.labels[i] for i in rows_a]
    result = paired_comparison([x == y for x, y in zip(answer_a, labels, strict=True)],
                               [x == y for x, y in zip(answer_b, labels, strict=True)])
    return {**result.to_dict(),
            "answers_agree": float(np.mean([x == y for x, y in zip(answer_a, answer_b,
                                                                   strict=True)])),
            "unpaired_a": len(first.ids) - len(pairs), "unpaired_b": len(second.ids) - len(pairs)}
