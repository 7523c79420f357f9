"""Synthetic probabilities with a known flaw, shared by the calibration tests."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy.special import softmax


def overconfident(n: int, *, n_options: int = 5, sharpen: float = 3.0, seed: int = 0
                  ) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Labels drawn from softmax(logits); the model reports softmax(sharpen * logits), so it is
    over-confident by exactly a temperature of ``sharpen``."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=1.5, size=(n, n_options))
    true_proba = softmax(logits, axis=1)
    y_true = np.array([rng.choice(n_options, p=row) for row in true_proba], dtype=np.int64)
    return softmax(sharpen * logits, axis=1), y_true


@pytest.fixture(scope="module")
def fit_and_test() -> tuple[NDArray[np.float64], NDArray[np.int64],
                            NDArray[np.float64], NDArray[np.int64]]:
    proba, y_true = overconfident(4000, seed=1)
    return proba[:2000], y_true[:2000], proba[2000:], y_true[2000:]
