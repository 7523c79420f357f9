"""Watching a tuned policy in production, one decision at a time: label-free drift tests (conformal
test martingales on the fast tier's confidence, and a change detector on the same rank
p-values) and an anytime-valid confidence sequence for accepted accuracy from whatever labels
arrive (audits, feedback).

All are valid at every moment, so they can be looked at after each decision without inflating
their error rates: by Ville's inequality a test martingale ever reaches ``1 / alpha`` with
probability at most ``alpha`` while decisions look like the tuning rows, the accuracy sequence
ever excludes the true accepted accuracy with probability at most ``alpha``, and the change
detector's average run length to a false alarm is at least its ``arl``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from calibration.betting import (
    DETECTOR_STAKES,
    TRAFFIC_BETS,
    Bet,
    JumperBet,
    ShiryaevRoberts,
    check_stakes,
    linear_bets,
)
from calibration.state import DamagedState, count, field, number
from calibration.validation import check_fraction

# The change detector's bets are defined beside its wealth process (``calibration.betting``).
__all__ = ["DETECTOR_STAKES", "DROP_STAKES", "GRID", "REFERENCE_MAX_ROWS", "SHORTFALL_FRACTIONS",
           "TRAFFIC_BETS", "AccuracySequence", "AccuracyShortfallTest", "Bet", "Bounds",
           "ConfidenceDropDetector", "ConfidenceDropTest", "linear_bets", "reference_summary"]

# Confidences are ranked on a grid of 1e-4: ties are broken at random, which keeps the rank
# p-value exactly uniform under the null, and a fixed grid keeps the state O(1) in memory.
GRID = 10_000
REFERENCE_MAX_ROWS = 5_000


def reference_summary(confidence: ArrayLike, *, threshold: float | None, seed: int = 0,
                      max_rows: int = REFERENCE_MAX_ROWS) -> dict[str, Any]:
    """What a policy file keeps of its tuning rows for drift monitoring: their confidences
    (calibrated probability of the fast answer) on the ranking grid, sorted, at most ``max_rows``
    of them (a seeded subsample: still exchangeable with new decisions), and the accept share."""
    values = np.asarray(confidence, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("confidence is empty: no tuning rows to summarise")
    if not np.all((values >= 0.0) & (values <= 1.0)):
        raise ValueError("confidence has values outside [0, 1]")
    accept_share = 0.0 if threshold is None else float(np.mean(values >= threshold))
    if values.size > max_rows:
        values = np.random.default_rng(seed).choice(values, size=max_rows, replace=False)
    return {"n": int(values.size), "accept_share": accept_share,
            "confidence": sorted(round(float(v), 4) for v in values)}


def _bin(confidence: float) -> int:
    return min(GRID, max(0, round(confidence * GRID)))


# The one-sided test's experts bet 1 + lam * (1/2 - p): only p-values below 1/2 (confidences
# lower than the reference's) win. lam = 0 is the idle expert the jumper's mixing draws on after a
# long benign stretch. Small stakes on purpose: with lam <= 0.2 a block of 40 rows of one unsure
# intent (mean rank 0.2) multiplies the wealth by about e^2.3, below the alarm level e^3.7
# (bench.watch "intent_blocks": 0.25 gave 5 false alarms in 100 replays, 0.2 gave 2 in 100).
DROP_STAKES = (0.0, 0.1, 0.2)


class _RankedConfidences:
    """The rank p-values the one-sided tests bet on: each new confidence ranked, ties at random
    (seeded), against the reference confidences and every earlier one, in plain Python with a
    Fenwick tree (a few microseconds per update on the request path; numpy sums cost ~100)."""

    n: int
    alarm_at: int | None

    if TYPE_CHECKING:
        def bet(self, p_value: float) -> object: ...

    def _rank_reference(self, reference: ArrayLike, seed: int) -> None:
        ref = np.asarray(reference, dtype=np.float64).ravel()
        if ref.size == 0:
            raise ValueError("reference is empty: the drift test needs the tuning confidences")
        if not np.all((ref >= 0.0) & (ref <= 1.0)):
            raise ValueError("reference has values outside [0, 1]")
        counts = np.bincount(np.clip(np.rint(ref * GRID), 0, GRID).astype(np.int64),
                             minlength=GRID + 1)
        self._counts = [int(c) for c in counts]
        self._tree = _fenwick(self._counts)
        self._total = int(ref.size)
        self._seed = seed
        self._random = random.Random(seed)
        self._ranked: dict[int, int] = {}  # live confidences ranked so far, by bin

    def p_value(self, confidence: float) -> float:
        """The randomised rank of ``confidence`` among everything seen so far (small when it is
        lower than usual). Does not record it (``update`` does)."""
        b = _bin(confidence)
        below = _prefix(self._tree, b)
        return (below + self._random.random() * (self._counts[b] + 1)) / (self._total + 1)

    def update(self, confidence: float) -> bool:
        """Take one decision's confidence; True when the alarm is (already or newly) raised."""
        self.bet(self.p_value(_checked(confidence)))
        self._record(confidence)
        return self.alarm_at is not None

    def _record(self, confidence: float) -> None:
        """Rank later confidences against this one too."""
        b = _bin(confidence)
        self._counts[b] += 1
        self._ranked[b] = self._ranked.get(b, 0) + 1
        _add(self._tree, b)
        self._total += 1

    def _ranked_state(self) -> dict[str, Any]:
        return {"ranked": {str(b): c for b, c in self._ranked.items()}}

    def _parse_ranked(self, state: dict[str, Any]) -> dict[int, int]:
        """The confidences ranked before (``state["ranked"]``: bin -> count, at most ``n`` of
        them), checked; nothing is taken yet (``_take_ranked``)."""
        ranked = field(state, "ranked")
        if not isinstance(ranked, dict):
            raise DamagedState(f"ranked must be an object of bin -> count, got {ranked!r}")
        parsed: dict[int, int] = {}
        for key in ranked:
            b = int(key) if isinstance(key, str) and key.isdigit() else -1
            if not 0 <= b <= GRID or b in parsed:
                raise DamagedState(f"ranked: bin {key!r} is not a bin in [0, {GRID}]")
            parsed[b] = count(ranked, key, low=1)
        if sum(parsed.values()) > count(state, "n"):
            raise DamagedState(f"ranked: {sum(parsed.values())} confidences, more than the "
                                f"{state['n']} ranked (n)")
        return parsed

    def _take_ranked(self, ranked: dict[int, int]) -> None:
        """Rank against the confidences ranked before again, and re-seed the tie-breaking
        stream for the new process (any independent uniform draw keeps the p-values exact)."""
        for b, c in ranked.items():
            self._counts[b] += c
            self._ranked[b] = self._ranked.get(b, 0) + c
            self._total += c
        self._tree = _fenwick(self._counts)
        self._random = random.Random(f"{self._seed}:{self.n}")


class ConfidenceDropTest(JumperBet, _RankedConfidences):
    """A one-sided conformal test martingale: it grows only when new confidences rank *below*
    the reference's (accepted decisions less sure, more decisions under the bar, novel inputs
    the model has no confident answer for). Confidences that rank higher (a sharper served model,
    confident repeated traffic) lose its bets, so they can never raise it.

    Guarantee (Ville's inequality): while decisions are exchangeable with the reference rows, the
    rank p-values are independent and uniform, each bet has conditional mean 1 and the alarm
    ever fires with probability at most ``alpha``. The same bound holds when each new confidence
    is, given the past, stochastically at least as large as a draw from the ranked set: its
    p-value is then stochastically at least uniform and every bet has conditional mean at most 1
    (a supermartingale). ``tests/calibration/test_confidence_drop.py`` checks both by simulation.

    The experts and the jumper mixing are the simple jumper of Vovk et al. (2005, section 7.1)
    restricted to one side; MAPIE has no one-sided variant, hence written here.
    ``ConfidenceDropDetector`` bets the same p-values as a change detector.
    """

    def __init__(self, reference: ArrayLike, *, alpha: float = 0.025, jump: float = 0.01,
                 seed: int = 0, stakes: tuple[float, ...] = DROP_STAKES) -> None:
        check_fraction(alpha, name="alpha", low_open=True, high_open=True)
        check_fraction(jump, name="jump", low_open=True, high_open=True)
        JumperBet.__init__(self, check_stakes(stakes), alpha=alpha, jump=jump,
                           edges=(-0.5, 0.5))  # the edge 1/2 - p of a p-value in [0, 1]
        self._rank_reference(reference, seed)

    def bet(self, p_value: float) -> None:
        """One step on a p-value in [0, 1]: only p-values below 1/2 win."""
        self._bet(0.5 - p_value)

    def state(self) -> dict[str, Any]:
        """The wealth and the confidences ranked since the reference (sparse: bin -> count)."""
        return JumperBet.state(self) | self._ranked_state()

    def resume(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` on the same reference."""
        ranked = self._parse_ranked(state)
        JumperBet.resume(self, state)
        self._take_ranked(ranked)


class ConfidenceDropDetector(ShiryaevRoberts, _RankedConfidences):
    """A one-sided change detector on confidences: ``ConfidenceDropTest``'s rank p-values, bet
    by a Shiryaev-Roberts e-detector mixture (linear ``stakes``, or the given ``bets``).
    Confidences ranking below the reference's raise it; surer ones lose its bets.

    Guarantee: while decisions are exchangeable with the reference rows (or surer, given the
    past), every bet has conditional mean at most 1, so the average run length to a false
    alarm is at least ``arl`` ranked decisions and a false alarm within the first ``n`` has
    probability at most ``n / arl``. Unlike the test martingale's "probability of ever", this
    bound grows with the stream: a watch picks ``arl`` for the horizon it must stay quiet over.
    """

    def __init__(self, reference: ArrayLike, *, arl: float, seed: int = 0,
                 stakes: tuple[float, ...] = DETECTOR_STAKES,
                 bets: tuple[Bet, ...] | None = None) -> None:
        if bets is not None and (not bets or not all(isinstance(b, Bet) for b in bets)):
            raise ValueError(f"bets must be a non-empty tuple of Bet, got {bets!r}")
        ShiryaevRoberts.__init__(self, linear_bets(stakes) if bets is None else bets, arl=arl)
        self._rank_reference(reference, seed)

    def take(self, confidence: float, most: Sequence[float]) -> list[float]:
        """``update`` with each bet's factor clipped at its ``most`` entry, chosen before the
        confidence is ranked (``ShiryaevRoberts.bet``); returns the factors applied."""
        factors = self.bet(self.p_value(_checked(confidence)), most)
        self._record(confidence)
        return factors

    def state(self) -> dict[str, Any]:
        """The detector and the confidences ranked since the reference (sparse: bin -> count)."""
        return ShiryaevRoberts.state(self) | self._ranked_state()

    def resume(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` on the same reference."""
        ranked = self._parse_ranked(state)
        ShiryaevRoberts.resume(self, state)
        self._take_ranked(ranked)


def _checked(confidence: float) -> float:
    if not 0.0 <= confidence <= 1.0 or math.isnan(confidence):
        raise ValueError(f"confidence must be in [0, 1], got {confidence!r}")
    return confidence


def _fenwick(counts: list[int]) -> list[int]:
    """A Fenwick (binary indexed) tree over ``counts``: prefix sums and increments in O(log n)."""
    tree = [0] * (len(counts) + 1)
    for i, c in enumerate(counts, start=1):
        tree[i] += c
        parent = i + (i & -i)
        if parent < len(tree):
            tree[parent] += tree[i]
    return tree


def _prefix(tree: list[int], end: int) -> int:
    """Sum of the counts of bins [0, end)."""
    total, i = 0, end
    while i > 0:
        total += tree[i]
        i -= i & -i
    return total


def _add(tree: list[int], index: int) -> None:
    i = index + 1
    while i < len(tree):
        tree[i] += 1
        i += i & -i


# Stakes of the accuracy test as fractions of the largest bet a right answer can survive,
# 1 / (1 - target): 0.05 is the growth-optimal stake when the error rate is about twice the
# allowed one, 0.2 when it is several times it; 0 is the idle expert (jumper mixing).
SHORTFALL_FRACTIONS = (0.0, 0.025, 0.05, 0.1, 0.2)


class AccuracyShortfallTest(JumperBet):
    """A one-sided test by betting (Waudby-Smith & Ramdas 2023) that accepted accuracy is at least
    ``target``, from 0/1 labels of accepted answers: each label bets ``1 + lam (target - x)``,
    which wins on a wrong answer and loses a little on a right one. While accuracy is at least
    the target every bet has conditional mean at most 1, so the wealth is a supermartingale and
    ``alarm`` (it reached ``1 / alpha``) fires with probability at most ``alpha`` (Ville). The
    wealth grows with the mean tested, so rejecting ``target`` is rejecting every mean above it:
    the alarm is the betting confidence sequence's upper bound falling below the target.

    Several stakes are mixed by the jumper (as ``ConfidenceDropTest``), so a long stretch of
    right answers before a shift does not leave it unable to bet when the errors come. It needs
    several times fewer labels than the two-sided empirical-Bernstein sequence
    (``AccuracySequence``, kept for the gauges) to show a shortfall of a few points."""

    def __init__(self, target: float, *, alpha: float = 0.025, jump: float = 0.01,
                 fractions: tuple[float, ...] = SHORTFALL_FRACTIONS) -> None:
        check_fraction(target, name="target", low_open=True)
        check_fraction(alpha, name="alpha", low_open=True, high_open=True)
        if not fractions or any(not 0.0 <= f < 1.0 for f in fractions):
            raise ValueError(f"fractions must be in [0, 1), got {fractions!r}")
        largest = 1.0 / (1.0 - target) if target < 1.0 else 1e6  # target 1: any error counts
        super().__init__(tuple(f * largest for f in fractions), alpha=alpha, jump=jump,
                         edges=(target - 1.0, target))  # target - x, x a 0/1 label
        self.target = target

    def update(self, correct: bool) -> bool:
        """Take one label; True when the alarm is (already or newly) raised."""
        self._bet(self.target - (1.0 if correct else 0.0))
        return self.alarm


@dataclass(frozen=True)
class Bounds:
    """A confidence sequence's current interval for a mean in [0, 1]."""

    lower: float
    upper: float
    n: int
    mean: float | None


class AccuracySequence:
    """A two-sided confidence sequence for accepted accuracy from 0/1 labels (an accepted answer
    was right or wrong): the conjugate-mixture empirical-Bernstein bound of Howard, Ramdas,
    McAuliffe & Sekhon (2021), each side at ``alpha / 2``, as a running intersection. The
    mixture boundary is MAPIE's ``GammaExponentialMixtureBound`` (its port of confseq's);
    MAPIE's own wrapper recomputes the whole history at every update, so the running sums are
    kept here and each update costs one boundary evaluation per side.

    ``confseq`` itself does not build on Python 3.11 (its pinned pybind11 predates 3.11) and
    ``expectation`` needs Python 3.12, so neither can be the dependency here.
    """

    def __init__(self, *, alpha: float = 0.025, v_opt: float = 10.0) -> None:
        from mapie.exchangeability_testing.bounds import GammaExponentialMixtureBound

        check_fraction(alpha, name="alpha", low_open=True, high_open=True)
        self.alpha = alpha
        self._side_alpha = alpha / 2.0
        self._boundary = GammaExponentialMixtureBound(v_opt=v_opt, c=1.0,
                                                      alpha_opt=self._side_alpha)
        self.n = 0
        self._sum = 0.0
        self._variance = 0.0  # sum of (x_i - mean of x_1..x_{i-1})^2, the prior mean 1/2 first
        self.lower = 0.0
        self.upper = 1.0

    def update(self, correct: bool) -> Bounds:
        x = 1.0 if correct else 0.0
        previous_mean = self._sum / self.n if self.n else 0.5
        self._variance += (x - previous_mean) ** 2
        self.n += 1
        self._sum += x
        mean = self._sum / self.n
        # Both sides get the same radius: the bound is symmetric in the centred sums.
        radius = self._boundary.bound(v=self._variance, alpha=self._side_alpha, tol=1e-7) / self.n
        self.lower = max(self.lower, mean - radius)
        self.upper = min(self.upper, mean + radius)
        return self.bounds()

    def bounds(self) -> Bounds:
        return Bounds(self.lower, self.upper, self.n, self._sum / self.n if self.n else None)

    def state(self) -> dict[str, Any]:
        """The running sums and the interval so far (``resume`` takes them back)."""
        return {"n": self.n, "sum": self._sum, "variance": self._variance,
                "lower": self.lower, "upper": self.upper}

    def resume(self, state: dict[str, Any]) -> None:
        """Continue from ``state()`` of an earlier process; a value out of its range (a sum
        of more 0/1 labels than were counted, a bound outside [0, 1]) is refused naming the
        field, and nothing is taken."""
        n = count(state, "n")
        total = number(state, "sum", low=0.0, high=n)
        variance = number(state, "variance", low=0.0, high=n)  # each term is at most 1
        lower, upper = number(state, "lower", low=0.0, high=1.0), number(
            state, "upper", low=0.0, high=1.0)
        self.n, self._sum, self._variance, self.lower, self.upper = (
            n, total, variance, lower, upper)

    def below(self, target: float) -> bool:
        """True once the whole sequence lies under ``target``: accuracy is below the promise."""
        return self.upper < target
