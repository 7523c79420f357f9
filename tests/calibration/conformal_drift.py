"""A two-sided conformal test martingale on confidences: the baseline the one-sided drift
test (``calibration.monitoring.ConfidenceDropTest``) is compared with in the tests."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from calibration.monitoring import GRID
from calibration.validation import check_fraction

# The simple jumper martingale's experts bet 1 + eps * (p - 1/2) with eps in {-1, 0, 1}
# (Vovk, Gammerman & Shafer 2005, section 7.1), as MAPIE's OnlineMartingaleTest does.
_EPSILONS = np.array([-1.0, 0.0, 1.0])


def bin_of(confidence: float) -> int:
    """The ranking grid's bin of ``confidence``."""
    return min(GRID, max(0, round(confidence * GRID)))


class ConformalDriftTest:
    """A conformal test martingale on confidences: each new confidence gets a rank p-value
    against the reference confidences and every earlier one (ties at random, seeded), and a
    jumper betting martingale on those p-values grows when confidences depart from the
    reference's distribution (either way). Under exchangeability the p-values are independent
    and uniform, so ``alarm`` (the martingale reached ``1 / alpha``, latched) has false-alarm
    probability at most ``alpha`` over an unbounded stream.

    The two-sided baseline the watch's one-sided ``ConfidenceDropTest`` is measured against
    (it alarms on a sharper served model, which the one-sided test ignores); no product code
    uses it. ``test_conformal_drift`` checks that its martingale equals MAPIE's
    ``update_simple_jumper_martingale`` on the same p-values.
    """

    def __init__(self, reference: ArrayLike, *, alpha: float = 0.025, jump: float = 0.01,
                 seed: int = 0) -> None:
        check_fraction(alpha, name="alpha", low_open=True, high_open=True)
        check_fraction(jump, name="jump", low_open=True, high_open=True)
        ref = np.asarray(reference, dtype=np.float64).ravel()
        if ref.size == 0:
            raise ValueError("reference is empty: the drift test needs the tuning confidences")
        if not np.all((ref >= 0.0) & (ref <= 1.0)):
            raise ValueError("reference has values outside [0, 1]")
        self.alpha = alpha
        self.jump = jump
        self._counts = np.bincount(np.clip(np.rint(ref * GRID), 0, GRID).astype(np.int64),
                                   minlength=GRID + 1)
        self._total = int(ref.size)
        self._rng = np.random.default_rng(seed)
        self._log_scale = 0.0  # the wealths are kept rescaled; the martingale is their sum times e^this
        self._wealth = np.full(3, 1.0 / 3.0)
        self.n = 0  # decisions seen
        self.alarm_at: int | None = None  # the decision (1-based) at which the alarm was raised

    @property
    def log_value(self) -> float:
        """Natural log of the martingale's current value (it starts at 0)."""
        return self._log_scale + math.log(float(self._wealth.sum()))

    @property
    def alarm(self) -> bool:
        return self.alarm_at is not None

    def p_value(self, confidence: float) -> float:
        """The randomised rank of ``confidence`` among everything seen so far: small when it is
        lower than usual. Does not record it (``update`` does)."""
        b = bin_of(confidence)
        below = int(self._counts[:b].sum())
        tied = int(self._counts[b])
        return (below + float(self._rng.uniform()) * (tied + 1)) / (self._total + 1)

    def update(self, confidence: float) -> bool:
        """Take one decision's confidence; True when the alarm is (already or newly) raised."""
        if not 0.0 <= confidence <= 1.0 or math.isnan(confidence):
            raise ValueError(f"confidence must be in [0, 1], got {confidence!r}")
        self.bet(self.p_value(confidence))
        self._counts[bin_of(confidence)] += 1
        self._total += 1
        return self.alarm

    def bet(self, p_value: float) -> None:
        """One step of the jumper martingale on a p-value in [0, 1]."""
        total = float(self._wealth.sum())
        mixed = (1.0 - self.jump) * self._wealth + (self.jump / 3.0) * total
        self._wealth = mixed * (1.0 + _EPSILONS * (p_value - 0.5))
        self._settle()

    def _settle(self) -> None:
        """Rescale the wealths and check the alarm after one bet."""
        scale = float(self._wealth.sum())
        if scale > 1e100 or scale < 1e-100:  # keep floats finite over unbounded streams
            self._wealth /= scale
            self._log_scale += math.log(scale)
        self.n += 1
        if self.alarm_at is None and self.log_value >= math.log(1.0 / self.alpha):
            self.alarm_at = self.n
