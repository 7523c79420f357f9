"""Plots: each writes a readable, non-empty PNG, including the no-threshold case."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibration import TemperatureScaling, reliability_diagram, risk_coverage_plot
from tests.calibration.conftest import overconfident

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_reliability_diagram_writes_png(tmp_path: Path) -> None:
    proba, y_true = overconfident(600)
    after = TemperatureScaling().fit(proba, y_true).transform(proba)
    path = reliability_diagram(tmp_path / "report" / "reliability.png", proba, after, y_true,
                               title="synthetic")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_risk_coverage_plot_writes_png_with_and_without_threshold(tmp_path: Path) -> None:
    proba, y_true = overconfident(600)
    confidence = proba.max(axis=1)
    correct = proba.argmax(axis=1) == y_true
    for name, threshold in (("marked.png", float(np.median(confidence))), ("none.png", None)):
        path = risk_coverage_plot(tmp_path / name, confidence, correct, threshold=threshold,
                                  title="synthetic", target_accuracy=0.9)
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
