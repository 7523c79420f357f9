"""Temperature scaling: one scalar T fitted by minimising the negative log-likelihood of
softmax(log(proba) / T); it keeps the ranking of options and fixes over- and under-confidence."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, softmax

from calibration.base import Calibrator, FloatArray

# log(0) would be -inf and poison the NLL; a floor far below any probability a reader cares about.
PROBA_FLOOR = 1e-12


class TemperatureScaling(Calibrator):
    """``softmax(log(proba) / temperature_)``, with T searched in log space between
    ``min_temperature`` and ``max_temperature`` (the NLL is unimodal in log T)."""

    kind = "temperature"
    option_names = ("min_temperature", "max_temperature")
    state_names = ("temperature_",)

    def __init__(self, *, min_temperature: float = 0.01, max_temperature: float = 100.0) -> None:
        self.min_temperature = min_temperature
        self.max_temperature = max_temperature

    def _fit(self, proba: FloatArray, y_true: NDArray[np.int64]) -> None:
        if not 0.0 < self.min_temperature < self.max_temperature:
            raise ValueError(
                "min_temperature and max_temperature must satisfy 0 < min < max, got "
                f"{self.min_temperature!r} and {self.max_temperature!r}"
            )
        logits = _log_proba(proba)
        rows = np.arange(len(y_true))

        def nll(log_temperature: float) -> float:
            scaled = log_softmax(logits / np.exp(log_temperature), axis=1)
            return float(-scaled[rows, y_true].mean())

        result = minimize_scalar(
            nll,
            bounds=(np.log(self.min_temperature), np.log(self.max_temperature)),
            method="bounded",
            options={"xatol": 1e-6},
        )
        self.temperature_ = float(np.exp(result.x))

    def _transform(self, proba: FloatArray) -> FloatArray:
        scaled: FloatArray = softmax(_log_proba(proba) / self.temperature_, axis=1)
        return scaled


def _log_proba(proba: FloatArray) -> FloatArray:
    result: FloatArray = np.log(np.clip(proba, PROBA_FLOOR, 1.0))
    return result
