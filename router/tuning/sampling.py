"""Which rows the tuning commands use: the seeded holdout split of ``slotgate train --holdout``
and the seeded subset of ``slotgate predict --limit``. Seeded, so a rerun picks the same rows."""

from __future__ import annotations

import random

import numpy as np

from router.tuning.predictions import LabelledTexts


def holdout_split(n_rows: int, holdout: float, *, seed: int) -> tuple[list[int], list[int]]:
    """(rows to train on, held-out rows), each in file order: the first ``round(holdout * n)``
    rows of a permutation seeded by ``seed`` are held out."""
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    order = np.random.default_rng(seed).permutation(n_rows)
    held = set(order[: round(holdout * n_rows)].tolist())
    return [i for i in range(n_rows) if i not in held], sorted(held)


def seeded_subset(rows: LabelledTexts, limit: int, *, seed: int = 0) -> LabelledTexts:
    """``limit`` rows drawn without replacement (seeded), in file order; all rows when fewer."""
    if limit >= len(rows.texts):
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows.texts)), limit))
    return LabelledTexts(ids=[rows.ids[i] for i in keep], texts=[rows.texts[i] for i in keep],
                         labels=[rows.labels[i] for i in keep])
