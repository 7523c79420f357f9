"""Calibration for slotgate: calibrators, reliability metrics, the threshold with a finite-sample
guarantee, paired comparison and versioned JSON artifacts (numpy, scipy, scikit-learn only)."""

from calibration.artifacts import read_json_artifact, write_json_artifact
from calibration.calibrators import (
    Calibrator,
    HistogramBinning,
    IdentityCalibrator,
    IsotonicCalibrator,
    TemperatureScaling,
    calibrator_from_dict,
    calibrator_kinds,
    make_calibrator,
)
from calibration.cascade import CascadeThresholds
from calibration.compare import PairedComparison, paired_comparison
from calibration.metrics import (
    accuracy,
    accuracy_at_coverage,
    aurc,
    bootstrap_ci,
    brier,
    confidence_auroc,
    ece,
    mce,
    nll,
    proportion_ci,
    risk_coverage_curve,
    top_label_bins,
)
from calibration.plots import reliability_diagram, risk_coverage_plot
from calibration.reliability import ReliabilityBins, reliability_bins
from calibration.risk import (
    RiskControlResult,
    accuracy_lower_bound,
    budget_threshold,
    guaranteed_threshold,
    naive_threshold,
)

__all__ = [
    "Calibrator",
    "CascadeThresholds",
    "HistogramBinning",
    "IdentityCalibrator",
    "IsotonicCalibrator",
    "PairedComparison",
    "ReliabilityBins",
    "RiskControlResult",
    "TemperatureScaling",
    "accuracy",
    "accuracy_at_coverage",
    "accuracy_lower_bound",
    "aurc",
    "bootstrap_ci",
    "brier",
    "budget_threshold",
    "calibrator_from_dict",
    "calibrator_kinds",
    "confidence_auroc",
    "ece",
    "guaranteed_threshold",
    "make_calibrator",
    "mce",
    "naive_threshold",
    "nll",
    "paired_comparison",
    "proportion_ci",
    "read_json_artifact",
    "reliability_bins",
    "reliability_diagram",
    "risk_coverage_curve",
    "risk_coverage_plot",
    "top_label_bins",
    "write_json_artifact",
]
