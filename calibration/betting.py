"""The wealth processes the monitors bet with: ``JumperBet`` (a test martingale mixing fixed
stakes, Vovk et al.'s simple jumper) and ``ShiryaevRoberts`` (a change detector summing test
martingales started at every step), with the bets it can make (``Bet``). What each step bets
on (rank p-values, labels) lives in ``calibration.monitoring``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from calibration.state import DamagedState, count, field, number, numbers, optional_count

# The wealth is rescaled (its log kept apart) whenever it leaves this range, so floats stay
# finite over unbounded streams; a resumed state must lie in it too.
_KEPT_LOW, _KEPT_HIGH = 1e-100, 1e100
_SLACK = 1e-6  # rounding allowed per step when a resumed wealth is checked against its reach


def _reach(n: int, step: tuple[float, float]) -> tuple[float, float]:
    """The log-wealth range ``n`` steps of at most ``step`` (down, up) can reach from 0."""
    if n == 0:
        return -_SLACK, _SLACK
    slack = _SLACK * (1 + n)
    return n * step[0] - slack, n * step[1] + slack


class JumperBet:
    """A mixture of bets at fixed ``stakes`` with fixed-share jumps between them (the simple
    jumper of Vovk et al. 2005, section 7.1): the wealth and the alarm that
    ``ConfidenceDropTest`` and ``AccuracyShortfallTest`` share; each says what a step bets on,
    and ``edges`` the range of the edge it bets (None: unbounded), which bounds how far the
    wealth can move in one step and so what a resumed state may hold."""

    def __init__(self, stakes: tuple[float, ...], *, alpha: float, jump: float,
                 edges: tuple[float, float] | None = None) -> None:
        self.alpha = alpha
        self.jump = jump
        self._stakes = stakes
        self._edges = edges
        self._wealth = [1.0 / len(stakes)] * len(stakes)
        self._log_scale = 0.0
        self._threshold = math.log(1.0 / alpha)
        self.n = 0
        self.alarm_at: int | None = None

    @property
    def log_value(self) -> float:
        """Natural log of the martingale's current value (it starts at 0)."""
        return self._log_scale + math.log(sum(self._wealth))

    @property
    def alarm(self) -> bool:
        return self.alarm_at is not None

    def state(self) -> dict[str, Any]:
        """The evidence so far, as plain JSON values (``resume`` takes it back)."""
        return {"wealth": list(self._wealth), "log_scale": self._log_scale, "n": self.n,
                "alarm_at": self.alarm_at}

    def resume(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (this object's ``state()`` of an earlier process, same
        stakes): the wealth goes on compounding where it stopped, so Ville's bound still holds
        over the whole stream. A state no run of this test could reach is refused (DamagedState
        naming the field) and nothing is taken."""
        wealth = numbers(state, "wealth", length=len(self._stakes), low=0.0)
        total = sum(wealth)
        if not _KEPT_LOW <= total <= _KEPT_HIGH:  # the range ``_bet`` keeps the sum in
            raise DamagedState(f"wealth must sum to a number in [{_KEPT_LOW:g}, {_KEPT_HIGH:g}], "
                                f"got {field(state, 'wealth')!r}")
        log_scale = number(state, "log_scale")
        n = count(state, "n")
        alarm_at = optional_count(state, "alarm_at", low=1, high=n)
        log_value = log_scale + math.log(total)
        low, high = _reach(n, self._log_step_bounds())
        if not low <= log_value <= high:
            raise DamagedState(f"log_scale: a log-wealth of {log_value:g} cannot be reached in "
                                f"{n} bets (from {low:g} to {high:g})")
        if alarm_at is None and log_value >= self._threshold:
            raise DamagedState(f"alarm_at is null but the log-wealth {log_value:g} is past the "
                                f"alarm level {self._threshold:g}")
        self._wealth, self._log_scale, self.n, self.alarm_at = wealth, log_scale, n, alarm_at

    def _log_step_bounds(self) -> tuple[float, float]:
        """How far one step can move the log-wealth, down and up: up by the best expert's
        factor on the largest edge; down at most to the jump's share of the wealth times the
        best expert's factor on the smallest edge (every expert gets that share)."""
        if self._edges is None:
            return -math.inf, math.inf
        low_edge, high_edge = self._edges
        worst = max(max(0.0, 1.0 + s * low_edge) for s in self._stakes)
        best = max(max(0.0, 1.0 + s * high_edge) for s in self._stakes)
        down = math.log(self.jump / len(self._stakes) * worst) if worst > 0.0 else -math.inf
        return down, math.log(best) if best > 0.0 else -math.inf

    def _bet(self, edge: float, *, most: float = math.inf) -> None:
        """One step: each expert's wealth times ``1 + min(stake, most) * edge``, after the
        jumps (``most``: the largest stake this step's edge allows, set before it is seen)."""
        share = self.jump / len(self._wealth) * sum(self._wealth)
        keep = 1.0 - self.jump
        self._wealth = [max(0.0, (keep * w + share) * (1.0 + min(s, most) * edge))
                        for w, s in zip(self._wealth, self._stakes, strict=True)]
        scale = sum(self._wealth)
        if scale > _KEPT_HIGH or scale < _KEPT_LOW:  # keep floats finite over unbounded streams
            self._wealth = [w / scale for w in self._wealth]
            self._log_scale += math.log(scale)
        self.n += 1
        if self.alarm_at is None and self.log_value >= self._threshold:
            self.alarm_at = self.n


def check_stakes(stakes: tuple[float, ...]) -> tuple[float, ...]:
    if not stakes or any(not 0.0 <= s <= 2.0 for s in stakes):
        raise ValueError(f"stakes must be in [0, 2] (a bet stays >= 0), got {stakes!r}")
    return tuple(float(s) for s in stakes)


class ShiryaevRoberts:
    """A mixture of Shiryaev-Roberts e-detectors (Shin, Ramdas & Rinaldo 2024, "E-detectors"),
    one per bet: ``R_t = (R_{t-1} + 1) * bet_t`` from ``R_0 = 0``, i.e. the sum,
    over every possible change point, of a test martingale started there. Each step's bet has
    conditional mean at most 1 under the null, so ``R_t - t`` is a supermartingale, and so is
    the mean over bets; the alarm (the mean reached ``arl``) then has an average run length to
    a false alarm of at least ``arl`` steps, and by Ville's inequality applied to
    ``R_t + n - t`` a false alarm within the first ``n`` steps has probability at most
    ``n / arl``. Evidence before a change costs nothing after it: the martingale started at the
    change point is one term of the sum, at wealth 1 (a test martingale that lost must first
    earn its losses back)."""

    def __init__(self, bets: tuple[Bet, ...], *, arl: float) -> None:
        if not arl > 1.0 or math.isinf(arl):
            raise ValueError(f"arl must be a finite number above 1, got {arl!r}")
        self.arl = arl
        self._bets = bets
        self._values = [0.0] * len(bets)  # R per bet, divided by e^_log_scale
        self._log_scale = 0.0
        self._threshold = math.log(arl)
        self.n = 0
        self.alarm_at: int | None = None

    @property
    def threshold(self) -> float:
        """Natural log of ``arl``: the level ``log_value`` alarms at."""
        return self._threshold

    @property
    def log_value(self) -> float:
        """Natural log of the detector's mean statistic (-inf before the first step)."""
        total = sum(self._values)
        return self._log_scale + math.log(total / len(self._values)) if total > 0 else -math.inf

    @property
    def alarm(self) -> bool:
        return self.alarm_at is not None

    def state(self) -> dict[str, Any]:
        """The evidence so far, as plain JSON values (``resume`` takes it back)."""
        return {"detector": list(self._values), "log_scale": self._log_scale, "n": self.n,
                "alarm_at": self.alarm_at}

    def resume(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (this object's ``state()`` of an earlier process, same
        stakes and arl): the run-length guarantee holds over the whole stream. A state no run
        of this detector could reach is refused (DamagedState naming the field) and nothing is
        taken."""
        values = numbers(state, "detector", length=len(self._bets), low=0.0)
        if max(values) > _KEPT_HIGH:  # the range ``bet`` keeps them in
            raise DamagedState(f"detector values must be at most {_KEPT_HIGH:g}, "
                                f"got {field(state, 'detector')!r}")
        n = count(state, "n")
        alarm_at = optional_count(state, "alarm_at", low=1, high=n)
        # Rescaled only past _KEPT_HIGH, far beyond the trip level: an untripped detector's
        # scale stays within a few units of it.
        most = self._threshold + math.log(len(values)) if alarm_at is None else math.inf
        log_scale = number(state, "log_scale", low=0.0, high=most)
        total = sum(values)
        log_value = log_scale + math.log(total / len(values)) if total > 0 else -math.inf
        best = max(b.factor(0.0) for b in self._bets)  # e(p) is largest at p = 0
        high = 0.0 if n == 0 else math.log(n) + n * math.log(best) + _SLACK * (1 + n)
        if (n == 0 and total > 0) or log_value > high:
            raise DamagedState(f"detector: a log statistic of {log_value:g} cannot be reached in "
                                f"{n} steps")
        if alarm_at is None and log_value >= self._threshold:
            raise DamagedState(f"alarm_at is null but the log statistic {log_value:g} is past the "
                                f"trip level {self._threshold:g}")
        self._values, self._log_scale, self.n, self.alarm_at = values, log_scale, n, alarm_at

    @property
    def bets(self) -> tuple[Bet, ...]:
        return self._bets

    def bet(self, p_value: float, most: Sequence[float] | None = None) -> list[float]:
        """One step on a rank p-value in [0, 1]: every expert's statistic plus one new start,
        times its bet on ``p_value``, clipped at its ``most`` entry when given (a bound chosen
        before ``p_value`` is seen: a clipped e-value still has conditional mean at most 1).
        Returns the factors applied."""
        factors = [b.factor(p_value) for b in self._bets]
        if most is not None:
            if len(most) != len(self._bets) or not all(m >= 0.0 for m in most):
                raise ValueError(f"most must be {len(self._bets)} numbers >= 0, got {most!r}")
            factors = [min(f, m) for f, m in zip(factors, most, strict=True)]
        fresh = math.exp(-self._log_scale)  # a martingale started now, on the kept scale
        self._values = [(v + fresh) * f for v, f in zip(self._values, factors, strict=True)]
        scale = max(self._values)
        if scale > _KEPT_HIGH:  # keep floats finite over unbounded streams
            self._values = [v / scale for v in self._values]
            self._log_scale += math.log(scale)
        self.n += 1
        if self.alarm_at is None and self.log_value >= self._threshold:
            self.alarm_at = self.n
        return factors


@dataclass(frozen=True)
class Bet:
    """One expert of the change detector: it multiplies its wealth by
    ``1 + stake * (e(p) - 1)`` on a rank p-value ``p``, where ``e`` is non-increasing and
    integrates to 1 over [0, 1], so the bet has mean 1 on a uniform p-value and at most 1 on a
    stochastically larger one (only low p-values win):

    - ``linear``: ``e(p) = 3/2 - p`` (the bet ``1 + stake (1/2 - p)``), stake in [0, 2];
    - ``power``: ``e(p) = k p^(k - 1)`` with ``k = shape`` in (0, 1), stake in [0, 1/(1 - k)]:
      wins most on the lowest p-values, the ones a novel class brings (the p-value is floored
      at 1e-9, which only lowers ``e``);
    - ``below``: ``e(p) = 1{p < q} / q`` with ``q = shape`` in (0, 1), stake in [0, 1].
    """

    kind: Literal["linear", "power", "below"]
    stake: float
    shape: float = 0.0

    def __post_init__(self) -> None:
        if self.kind == "linear":
            high = 2.0
        elif self.kind in ("power", "below"):
            if not 0.0 < self.shape < 1.0:
                raise ValueError(f"shape of a {self.kind} bet must be in (0, 1), "
                                 f"got {self.shape!r}")
            high = 1.0 / (1.0 - self.shape) if self.kind == "power" else 1.0
        else:
            raise ValueError(f"kind must be linear, power or below, got {self.kind!r}")
        if not 0.0 <= self.stake <= high:
            raise ValueError(f"stake of a {self.kind} bet must be in [0, {high:g}] (a bet "
                             f"stays >= 0), got {self.stake!r}")

    def factor(self, p: float) -> float:
        """What the wealth is multiplied by on the p-value ``p``."""
        if self.kind == "linear":
            return 1.0 + self.stake * (0.5 - p)
        if self.kind == "power":
            k = self.shape
            return 1.0 + self.stake * (k * math.pow(max(p, 1e-9), k - 1.0) - 1.0)
        return 1.0 + self.stake * ((1.0 / self.shape if p < self.shape else 0.0) - 1.0)


def linear_bets(stakes: tuple[float, ...]) -> tuple[Bet, ...]:
    return tuple(Bet("linear", float(s)) for s in check_stakes(stakes))


# The detector's default stakes when it bets linearly: small ones for a slight drop that
# lasts, 1 for a sharp one.
DETECTOR_STAKES = (0.1, 0.25, 0.5, 1.0)
# The traffic detector's bets (router/monitoring/watch.py): three power bets (k = 0.7) and three
# on a p-value under 0.1. A novel class brings rank p-values near 0 (most of a never-learnt
# intent's confidences rank under 0.2), where these win several times what a linear bet wins;
# ordinary traffic that comes in bursts (rows in blocks of one intent) brings few ranks that
# low, and there these lose where linear bets won (bench.watch, docs/monitoring.md).
TRAFFIC_BETS = (Bet("power", 0.2, 0.7), Bet("power", 0.4, 0.7), Bet("power", 0.8, 0.7),
                Bet("below", 0.03, 0.1), Bet("below", 0.06, 0.1), Bet("below", 0.12, 0.1))
