"""The accuracy test on slow-model audits corrected by a few trusted labels (two-phase,
prediction-powered): unbiased for the true error whatever the auditor's own errors.

An accepted decision is audited with probability ``pi`` (``AuditDesign``, ``A`` drawn); the
auditor (the slow model) answers it, and ``d`` is 1 where its answer differs from the fast one
(an audit's "wrong"). Independently, with probability ``rho``, the audited decision also gets a
trusted (human) label (``B`` drawn), and ``e`` is 1 where the fast answer is truly wrong. The
estimate of the decision's error is

    Z = q + A [ (d - q) + B (e - d) / rho ] / pi

with ``q`` the calibrated risk (capped at ``Q_CAP``, times ``eta``). Given the past and the
decision, ``E[B / rho] = 1`` and ``E[A / pi] = 1``, so ``E[Z] = q + E[d] - q + E[e] - E[d] =
E[e]``: the trusted labels correct the auditor's bias, the auditor's answers take off the part of
the trusted labels' variance they explain. Its variance at one decision is

    Var(Z) = Var(e) + E[(e - q)^2] (1/pi - 1) + (1/rho - 1) E[(e - d)^2] / pi

(the design's, ``AuditDesign.variance``, plus the auditor's mismatch with the truth weighed by
how rarely it is checked). Its least value is at ``A = B = 1``, ``d = 1``, ``e = 0`` (the auditor
disagrees, the trusted label says the fast answer was right):
``Z = q + (1 - q - 1/rho) / pi``, so one decision can take the estimate below zero by at most

    loss = (1/rho - 1) / pi + q (1/pi - 1)

which is ``AuditDesign.bound``'s loss plus ``(1/rho - 1) / pi``; where the audit's error is at
most ``f`` (a probability of error made of the auditor's answer, ``d`` in [0, f]), the least
value is ``q + (f (1 - 1/rho) - q) / pi`` and the loss ``(f (1/rho - 1) + q) / pi - q``
(``two_phase_loss``). ``WeightedShortfallTest``'s bet ``1 + g (Z - allowed) / V`` stays
non-negative when its stake ``g / V`` is at most ``1 / (allowed + loss)``: ``two_phase_scale``
gives ``(variance, loss)`` in the form ``WeightedShortfallTest.update``'s ``scale`` takes, the
loss the largest over every stratum. It must be the same for every decision: a cap set by the
decision's own loss makes the stake depend on the decision's risk (small where ``pi`` is small,
on sure answers), and the bet then wins on the risky decisions' own error rate, above the
average the promise is about (a development run of ``bench.auditor_evidence`` that capped
that way alarmed in most runs on reads whose accuracy kept the promise).

A bet at that cap loses everything on the least estimate, and the two-phase estimate meets it
often (an audit the auditor flags that a trusted label finds right, on a sure decision): every
stake at the cap would leave the test at zero for good. ``TwoPhaseShortfallTest`` stakes at most
``CAP_SHARE`` of the cap, so one such decision costs at most that share of the wealth.

This lives in bench/ while the watch does not use it; ``TwoPhaseShortfallTest`` is the library
test with this estimate and belongs beside ``WeightedShortfallTest`` in
calibration/weighted_audits.py once it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from calibration.state import count
from calibration.validation import check_fraction
from calibration.weighted_audits import (
    PI_MIN,
    Q_CAP,
    RISK_EDGES,
    WEIGHTED_GAPS,
    WEIGHTED_JUMP,
    AuditDesign,
    WeightedShortfallTest,
)

__all__ = ["CAP_SHARE", "TwoPhaseShortfallTest", "trusted_only_scale", "two_phase_estimate", "two_phase_loss",
           "two_phase_scale"]

# The share of the non-negativity cap a two-phase bet stakes at most (module docstring).
CAP_SHARE = 0.5


def two_phase_estimate(q: ArrayLike, pi: ArrayLike, audited: ArrayLike, audit_error: ArrayLike,
                       trusted: ArrayLike, wrong: ArrayLike, *, rho: float
                       ) -> NDArray[np.float64]:
    """``Z = q + A [(d - q) + B (e - d) / rho] / pi``, elementwise (``q`` the prediction as bet,
    already capped and times ``eta``; ``d`` the audit's error in [0, 1]: its disagreement, or a
    probability of error made of it)."""
    q, pi = np.asarray(q, dtype=np.float64), np.asarray(pi, dtype=np.float64)
    d = np.asarray(audit_error, dtype=np.float64)
    correction = np.asarray(trusted, dtype=np.float64) * (
        np.asarray(wrong, dtype=np.float64) - d) / rho
    return np.asarray(q + np.asarray(audited, dtype=np.float64) * ((d - q) + correction) / pi,
                      dtype=np.float64)


def two_phase_loss(q: ArrayLike, pi: ArrayLike, *, rho: float, most_error: ArrayLike = 1.0
                   ) -> NDArray[np.float64]:
    """How far below zero one decision's two-phase estimate can reach, elementwise:
    ``(f (1/rho - 1) + q) / pi - q`` at the largest audit error ``f`` it can get (1 for a 0/1
    disagreement)."""
    q, pi = np.asarray(q, dtype=np.float64), np.asarray(pi, dtype=np.float64)
    f = np.asarray(most_error, dtype=np.float64)
    return np.asarray((f * (1.0 / rho - 1.0) + q) / pi - q, dtype=np.float64)


def _strata(design: AuditDesign, rate: float) -> list[tuple[float, float, float, float]]:
    """(share, mean risk, capped risk bound, draw probability) per stratum, as
    ``AuditDesign.variance`` and ``AuditDesign.bound`` read them."""
    probs = design.probabilities(rate)
    total = sum(design.counts)
    out = []
    for b, (n, p) in enumerate(zip(design.counts, probs, strict=True)):
        share = n / total if total else 1.0 / len(probs)
        q = design.sums[b] / n if n else (RISK_EDGES[b] + RISK_EDGES[b + 1]) / 2.0
        out.append((share, q, min(Q_CAP, RISK_EDGES[b + 1]), p))
    return out


def two_phase_scale(design: AuditDesign, rate: float, *, rho: float,
                    mismatch: Sequence[float], most_error: Sequence[float] | None = None,
                    eta: float = 1.0, allowed: float = 0.05) -> tuple[float, float]:
    """``(variance, loss)`` of the two-phase estimate at audit ``rate`` and trusted share
    ``rho`` (module docstring): the design's variance plus ``(1/rho - 1) E[mismatch / pi]``
    (``mismatch``: per stratum of ``RISK_EDGES``, the assumed ``E[(e - d)^2]``, for a 0/1 ``d``
    the share of audits that judge the fast answer otherwise than a trusted label; it sizes
    the stakes only, any value keeps the test valid), and the largest ``two_phase_loss`` over
    the strata (``most_error``: per stratum, the largest audit error its decisions can get;
    None: 1, any ``d`` in [0, 1])."""
    check_fraction(rho, name="rho", low_open=True)
    strata = _strata(design, rate)
    most = [1.0] * len(strata) if most_error is None else list(most_error)
    for name, values in (("mismatch", mismatch), ("most_error", most)):
        if len(values) != len(strata):
            raise ValueError(f"{name} must hold one value per stratum ({len(strata)}), "
                             f"got {len(values)}")
        for b, v in enumerate(values):
            check_fraction(v, name=f"{name}[{b}]")
    variance = design.variance(rate, eta=eta, allowed=allowed) + (1.0 / rho - 1.0) * sum(
        share * m / p for (share, _, _, p), m in zip(strata, mismatch, strict=True))
    loss = max(float(two_phase_loss(eta * bound, p, rho=rho, most_error=f))
               for (_, _, bound, p), f in zip(strata, most, strict=True))
    return variance, loss


def trusted_only_scale(design: AuditDesign, rate: float, *, rho: float, eta: float = 1.0,
                       allowed: float = 0.05) -> tuple[float, float]:
    """``(variance, loss)`` of ``WeightedShortfallTest``'s estimate on the trusted labels alone
    (each drawn with probability ``pi rho``): ``AuditDesign.scale`` with every draw probability
    times ``rho``."""
    check_fraction(rho, name="rho", low_open=True)
    variance, loss = allowed * (1.0 - allowed), 0.0
    for share, q, bound, p in _strata(design, rate):
        qc = eta * min(Q_CAP, q)
        variance += share * (q * (1.0 - qc) ** 2 + (1.0 - q) * qc ** 2) * (1.0 / (p * rho) - 1.0)
        loss = max(loss, eta * bound * (1.0 / (p * rho) - 1.0))
    return variance, loss


class TwoPhaseShortfallTest(WeightedShortfallTest):
    """``WeightedShortfallTest`` betting the two-phase estimate (module docstring) through
    ``update_two_phase``, each stake at most ``CAP_SHARE`` of the largest that keeps the bet
    non-negative; ``scale`` from ``two_phase_scale`` at the same ``rho``."""

    def __init__(self, target: float, *, alpha: float, rho: float, eta: float = 1.0,
                 jump: float = WEIGHTED_JUMP, gaps: tuple[float, ...] = WEIGHTED_GAPS) -> None:
        self.rho = check_fraction(rho, name="rho", low_open=True)
        super().__init__(target, alpha=alpha, eta=eta, jump=jump, gaps=gaps)
        floor = self.allowed * target
        extra = (1.0 / rho - 1.0) / PI_MIN  # how much further below zero one estimate reaches
        self._edges = (-(self.allowed + extra + Q_CAP / PI_MIN) / floor,
                       (1.0 + 1.0 / (rho * PI_MIN)) / floor)
        self.trusted = 0

    def state(self) -> dict[str, Any]:
        return {**super().state(), "trusted": self.trusted}

    def resume(self, state: dict[str, Any]) -> None:
        """``WeightedShortfallTest.resume``, and a trusted-label count past the labels is
        refused (DamagedState naming it)."""
        trusted = count(state, "trusted", high=count(state, "labels"))
        super().resume(state)
        self.trusted = trusted

    def update_two_phase(self, confidence: float, *, probability: float, audited: bool,
                         audit_error: float | None, trusted: bool, wrong: bool | None,
                         scale: tuple[float, float], most_error: float = 1.0) -> bool:
        """One accepted decision: its draw probability, whether it was audited, the audit's
        error in [0, 1] (1 where the auditor's answer differs from the fast one, or a probability
        of error made of that; None: no answer came, counted as 0: still unbiased, ``B`` is
        drawn apart from it), whether the audit drew a trusted label
        (at probability ``rho``) and its verdict (None: drawn, never came; counted as right,
        which only lowers ``Z``), and ``two_phase_scale``'s ``(variance, loss)``, the same
        for every decision (module docstring), ``most_error`` the largest audit error this
        decision could have got (as ``two_phase_scale`` was given it: a check that ``loss``
        covers it). True when the alarm is raised."""
        if not PI_MIN <= probability <= 1.0:
            raise ValueError(f"probability must be in [{PI_MIN}, 1], got {probability!r}")
        if trusted and not audited:
            raise ValueError("trusted must be False for a decision that was not audited")
        variance, loss = scale
        q = self.eta * min(Q_CAP, max(0.0, 1.0 - confidence))
        check_fraction(most_error, name="most_error")
        reach = float(two_phase_loss(q, probability, rho=self.rho, most_error=most_error))
        if reach > loss + 1e-12:
            raise ValueError(f"loss {loss!r} is below this decision's possible loss {reach!r}: "
                             "the bet could go negative")
        if not variance >= self.allowed * self.target:
            raise ValueError(f"variance must be at least {self.allowed * self.target:g} (a "
                             f"label's own at the edge), got {variance!r}")
        d = 0.0 if audit_error is None else check_fraction(audit_error, name="audit_error")
        if d > most_error:
            raise ValueError(f"audit_error {d!r} is above most_error {most_error!r}")
        if audited:
            self.labels += 1
            self.trusted += int(trusted)
        z = float(two_phase_estimate(q, probability, audited, d, trusted, bool(wrong),
                                     rho=self.rho))
        self._bet((z - self.allowed) / variance,
                  most=CAP_SHARE * variance / (self.allowed + loss))
        return self.alarm

