"""The calibrators by name: temperature scaling, isotonic and histogram binning (top-label), and
the identity; ``make_calibrator`` and ``calibrator_from_dict`` are how callers obtain them."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from calibration.base import Calibrator, FloatArray
from calibration.temperature import TemperatureScaling
from calibration.top_label import HistogramBinning, IsotonicCalibrator

__all__ = [
    "Calibrator",
    "HistogramBinning",
    "IdentityCalibrator",
    "IsotonicCalibrator",
    "TemperatureScaling",
    "calibrator_from_dict",
    "calibrator_kinds",
    "make_calibrator",
]


class IdentityCalibrator(Calibrator):
    """Leaves probabilities as they are (only renormalised); there is nothing to learn, so it
    transforms without being fitted, and ``fit`` only validates its inputs."""

    kind = "none"

    def _fit(self, proba: FloatArray, y_true: NDArray[np.int64]) -> None:
        return None

    def _transform(self, proba: FloatArray) -> FloatArray:
        return proba.copy()


def calibrator_kinds() -> dict[str, type[Calibrator]]:
    """Calibrator classes by their ``kind``, the name used by the CLI and in policy files."""
    classes: tuple[type[Calibrator], ...] = (
        TemperatureScaling, IsotonicCalibrator, HistogramBinning, IdentityCalibrator,
    )
    return {cls.kind: cls for cls in classes}


def make_calibrator(name: str, **options: Any) -> Calibrator:
    """An unfitted calibrator: ``name`` is one of "temperature", "isotonic", "histogram", "none"."""
    kinds = calibrator_kinds()
    if name not in kinds:
        raise ValueError(f"name must be one of {sorted(kinds)}, got {name!r}")
    return kinds[name](**options)


def calibrator_from_dict(data: dict[str, Any]) -> Calibrator:
    """The fitted calibrator ``to_dict`` described; its ``transform`` gives identical output."""
    kind = data.get("kind") if isinstance(data, dict) else None
    kinds = calibrator_kinds()
    if kind not in kinds:
        raise ValueError(f"calibrator dict has kind {kind!r}, expected one of {sorted(kinds)}")
    return kinds[kind].from_dict(data)
