"""bench.drift_information: the per-decision divergence a novel share leaves in the ranks."""

from __future__ import annotations

import numpy as np

from bench.drift_information import divergence


def test_the_divergence_is_zero_without_novel_rows_and_grows_with_their_share() -> None:
    rng = np.random.default_rng(0)
    known, novel = rng.uniform(size=5000), rng.beta(1, 6, size=2000)
    values = [divergence(known, novel, s) for s in (0.0, 0.05, 0.1, 0.25)]
    assert values[0] == 0.0 and values == sorted(values) and values[-1] > 0.05
    # small shares: about quadratic in the share
    assert 3.0 < values[2] / values[1] < 5.0
