"""The library's accuracy bets and audit design for many simulated runs at once, on numpy arrays
(``bench.break_power`` and ``bench.auditor_evidence`` simulate with them;
tests/bench/test_break_power.py checks them against ``calibration.betting.JumperBet``,
``WeightedShortfallTest`` and ``AuditDesign`` step by step)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from calibration.weighted_audits import (
    DESIGN_PRIOR_LABELS,
    PI_MIN,
    Q_CAP,
    RISK_EDGES,
    AuditDesign,
)

__all__ = ["Designs", "Jumpers"]


class Jumpers:
    """``calibration.betting.JumperBet`` for many runs at once: wealth per run and stake, the
    same fixed-share jumps and bets, renormalised every step (the log kept apart)."""

    def __init__(self, runs: int, stakes: Sequence[float] | NDArray[np.float64], *,
                 alpha: float, jump: float = 0.01) -> None:
        # one row of stakes for every run, or one per run (capped per run: ``JumperBet._bet``'s
        # ``most``, fixed here as the design is)
        given = np.asarray(stakes, dtype=np.float64)
        self.stakes = np.broadcast_to(given, (runs, given.shape[-1]))
        self.k = self.stakes.shape[1]
        self.jump = jump
        self.wealth = np.full((runs, self.k), 1.0 / self.k)
        self.log_scale = np.zeros(runs)
        self.threshold = math.log(1.0 / alpha)
        self.alarm_at = np.full(runs, -1, dtype=np.int64)

    def bet(self, edge: NDArray[np.float64], mask: NDArray[np.bool_], step: int) -> None:
        """Runs in ``mask`` bet ``edge``; the others stand still. ``step`` is recorded as the
        alarm's time in runs that reach the level now."""
        w = self.wealth
        share = self.jump / self.k * w.sum(axis=1, keepdims=True)
        moved = np.maximum(0.0, ((1.0 - self.jump) * w + share)
                           * (1.0 + self.stakes * edge[:, None]))
        w = np.where(mask[:, None], moved, w)
        total = w.sum(axis=1)
        self.wealth = w / total[:, None]
        self.log_scale += np.log(total)
        hit = (self.log_scale >= self.threshold) & (self.alarm_at < 0)
        self.alarm_at[hit] = step


class Designs:
    """``calibration.weighted_audits.AuditDesign`` for many runs at once, each learning from its
    own labels (``learn``): the strata's shares and mean risks from one reference design,
    each run's spread, draw probabilities (``probabilities``: runs x strata) and stake sizes
    (``scale``) as the library computes them (tests/bench/test_break_power.py checks them)."""

    def __init__(self, reference: AuditDesign, runs: int) -> None:
        counts = np.asarray(reference.counts, dtype=np.float64)
        self.shares = counts / counts.sum()
        middle = (np.asarray(RISK_EDGES[:-1]) + np.asarray(RISK_EDGES[1:])) / 2.0
        self.risk = np.where(counts > 0, np.asarray(reference.sums) / np.maximum(counts, 1),
                             middle)
        self.floor = reference.floor
        self.labelled = np.zeros((runs, counts.size))
        self.squares = np.zeros((runs, counts.size))

    def learn(self, runs: NDArray[np.int64], strata: NDArray[np.int64],
              wrong: NDArray[np.bool_], risk: NDArray[np.float64]) -> None:
        np.add.at(self.labelled, (runs, strata), 1.0)
        np.add.at(self.squares, (runs, strata), (wrong.astype(np.float64) - risk) ** 2)

    def probabilities(self, rate: float) -> NDArray[np.float64]:
        prior = DESIGN_PRIOR_LABELS * self.risk * (1.0 - self.risk)
        spread = np.sqrt(np.maximum((prior + self.squares) / (DESIGN_PRIOR_LABELS
                                                              + self.labelled), 1e-12))
        low = max(PI_MIN, self.floor * rate)
        if low >= rate or rate >= 1.0:
            return np.full(spread.shape, rate)
        lo, hi = np.zeros(spread.shape[0]), 1.0 / spread.min(axis=1)
        for _ in range(60):  # the bisection of ``_water_fill``, every run at once
            mid = (lo + hi) / 2.0
            mean = (np.clip(mid[:, None] * spread, low, 1.0) * self.shares).sum(axis=1)
            lo, hi = np.where(mean < rate, mid, lo), np.where(mean < rate, hi, mid)
        probs: NDArray[np.float64] = np.clip(hi[:, None] * spread, low, 1.0)
        return probs

    def scale(self, probs: NDArray[np.float64], *, eta: float,
              allowed: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Per run, ``AuditDesign.scale``: the variance at the edge and the largest loss."""
        q, qc = self.risk, eta * np.minimum(Q_CAP, self.risk)
        added = (self.shares * (q * (1.0 - qc) ** 2 + (1.0 - q) * qc ** 2)
                 * (1.0 / probs - 1.0)).sum(axis=1)
        top = eta * np.minimum(Q_CAP, np.asarray(RISK_EDGES[1:]))
        return allowed * (1.0 - allowed) + added, (top * (1.0 / probs - 1.0)).max(axis=1)
