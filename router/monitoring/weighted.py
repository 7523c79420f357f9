"""A policy's live accuracy alarm on audits drawn where the risk is: each auditable accepted
decision is drawn with ``calibration.weighted_audits.AuditDesign``'s probability, and every such
decision, drawn or not, is bet on by ``WeightedShortfallTest``, in decision order.

Order matters because a bet is a valid test martingale step only when its stake is fixed by
what came before it: each decision's stake (the design's scale at its draw) and its draw
probability are set before its label is known, and the wealth takes the decisions one after
another. Labels come back out of order (audits take seconds, some never come), so decisions wait
in a first-in, first-out queue (``WeightedWatch``) and are bet from its head once resolved: a
decision not drawn at once, a drawn one when its label arrives or when it is known that none
will (``lost``: the audit was dropped, capped or failed; a second label of an input; the queue
past ``PENDING_MAX``), its ``Z`` then counted as a right answer (conservative: the test stays
valid). Betting each decision when its label arrives would let a label that came early
(a quick, sure audit) be bet before the decisions drawn ahead of it, a choice made knowing the
draw.

``WeightedAccuracy`` is the gauge: the prediction-powered estimate of accepted accuracy with an
anytime-valid two-sided confidence sequence."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from calibration.monitoring import Bounds
from calibration.state import DamagedState, count, field, number, optional_count
from calibration.weighted_audits import (
    PI_MIN,
    Q_CAP,
    WEIGHTED_GAPS,
    AuditDesign,
    WeightedShortfallTest,
)
from router.monitoring.sections import at_most, section

__all__ = ["PENDING_MAX", "SUSPECT_GAPS", "SUSPECT_SHARE", "TRUSTED_SHARE", "WHOLE_SHARE", "Draw", "WeightedAccuracy", "WeightedWatch", "lowest_probability"]

PENDING_MAX = 10_000  # decisions waiting for an older label; past it the oldest drawn is lost
# Decisions drawn on one copy of the design before it takes the decisions seen since: the
# design's draw probabilities cost ~0.2 ms to work out afresh (a bisection over its strata),
# and 64 more confidences among thousands barely move them.
REFRESH = 64
FLOOR = 0.25  # ``AuditDesign``'s floor: no draw probability under this share of the rate
# The accuracy alarm's half of ``alarm_alpha``: most of it to the test on every audit since the
# start, the one that must find small breaks no label-free test sees (``python -m
# bench.break_power`` measures it at this share); a sixteenth each to the test started when
# traffic turns suspect and to the trusted labels' (``router.monitoring.watch``).
WHOLE_SHARE = 3.0 / 8.0
SUSPECT_SHARE = 1.0 / 16.0
TRUSTED_SHARE = 1.0 / 16.0
# The test started when traffic turns suspect bets on the breaks a shift the label-free tests
# saw brings (a class the model never learnt: ten points and more), so its stakes are sized
# for four, eight and sixteen points where the whole-stream test's are for one, two and four
# (``WEIGHTED_GAPS``): ``python -m bench.watch`` measures how soon it alarms.
SUSPECT_GAPS = (0.04, 0.08, 0.16)


@dataclass(frozen=True, slots=True)
class Draw:
    """An accepted decision drawn for an audit: its ticket (to match the label) and its draw
    probability (logged with the audit)."""

    ticket: int
    probability: float


@dataclass(slots=True)
class _Pending:
    ticket: int
    confidence: float
    probability: float
    scale: tuple[float, float]  # the design's (variance, loss) at the draw
    audited: bool
    resolved: bool
    correct: bool | None = None  # None: drawn, no label (counted right)


def lowest_probability(rate: float, floor: float) -> float:
    """The least draw probability ``AuditDesign(floor=floor)`` gives at ``rate`` (at least
    ``PI_MIN``: a lower rate draws at ``PI_MIN``)."""
    return max(PI_MIN, min(rate, max(PI_MIN, floor * rate)))


def risk(confidence: float) -> float:
    """The prediction of one decision's error (``WeightedShortfallTest``'s, ``eta`` 1)."""
    return min(Q_CAP, max(0.0, 1.0 - confidence))


class WeightedAccuracy:
    """The prediction-powered estimate of accepted accuracy, ``1 - mean(Z)`` over the decisions
    bet on, and a two-sided confidence sequence for it at ``alpha`` (each side ``alpha / 2``).

    The boundary is the conjugate-mixture empirical-Bernstein one of Howard, Ramdas, McAuliffe &
    Sekhon (2021, Theorem 4), MAPIE's ``GammaExponentialMixtureBound`` (as
    ``calibration.monitoring.AccuracySequence``). Its conditions: each increment lies in a
    fixed range ``[a, b]`` and the centring guess is predictable and in that range; then
    ``sum(Z) - sum(E[Z | past])`` stays within ``u(V)`` at every time with probability at least
    ``1 - alpha``, with ``V = sum((Z_i - guess_i)^2)`` and the boundary set for scale
    ``c = b - a``. ``Z = q + A (e - q) / pi`` with ``q`` in ``[0, Q_CAP]`` and ``pi`` at least
    ``lowest`` lies in ``[Q_CAP (1 - 1/lowest), 1/lowest]``, so ``c`` is that width (the
    gauge starts afresh when a lower audit rate allows a lower ``pi``); the guess is the mean of
    the ``Z`` before (in range: a mean of values in it), ``1 - target`` at first. Since
    ``E[Z | past]`` is the decision's chance of a wrong answer (``WeightedShortfallTest``),
    the sequence covers the accepted accuracy of the decisions so far; an audit whose label
    never came counts as right, so lost labels lift the estimate (``lost`` in the report).
    The interval is computed when read and intersected with the last one read (an intersection
    over any of the times stays valid), so a decision costs a few additions."""

    def __init__(self, *, alpha: float, allowed: float, lowest: float) -> None:
        from mapie.exchangeability_testing.bounds import GammaExponentialMixtureBound

        self.alpha, self.allowed, self.lowest = alpha, allowed, lowest
        self.low, self.high = Q_CAP * (1.0 - 1.0 / lowest), 1.0 / lowest
        width = self.high - self.low
        self._boundary = GammaExponentialMixtureBound(v_opt=max(10.0, width * width), c=width,
                                                      alpha_opt=alpha / 2.0)
        self.n = 0  # decisions
        self.labels = 0  # of which the label came
        self._sum = 0.0  # of Z
        self._variance = 0.0  # sum of (Z_i - mean of Z_1..Z_{i-1})^2
        self.lower, self.upper = 0.0, 1.0

    def update(self, z: float, *, labelled: bool) -> None:
        guess = self._sum / self.n if self.n else self.allowed
        self._variance += (z - guess) ** 2
        self._sum += z
        self.n += 1
        self.labels += labelled

    def bounds(self) -> Bounds:
        if self.n == 0:
            return Bounds(self.lower, self.upper, self.labels, None)
        mean = 1.0 - self._sum / self.n
        radius = self._boundary.bound(v=self._variance, alpha=self.alpha / 2.0, tol=1e-7) / self.n
        self.lower = max(self.lower, min(1.0, mean - radius))
        self.upper = min(self.upper, max(0.0, mean + radius))
        return Bounds(self.lower, self.upper, self.labels, mean)

    def state(self) -> dict[str, Any]:
        return {"lowest": self.lowest, "n": self.n, "labels": self.labels, "sum": self._sum,
                "variance": self._variance, "lower": self.lower, "upper": self.upper}

    @classmethod
    def resumed(cls, state: dict[str, Any], *, alpha: float, allowed: float) -> WeightedAccuracy:
        """A gauge from ``state()``; a value outside what its decisions could sum to is refused
        (DamagedState naming the field)."""
        gauge = cls(alpha=alpha, allowed=allowed, lowest=number(state, "lowest", low=PI_MIN,
                                                                  high=1.0))
        n = count(state, "n")
        width = gauge.high - gauge.low
        gauge.labels = count(state, "labels", high=n)
        gauge._sum = number(state, "sum", low=n * gauge.low - 1e-6 * (1 + n),
                            high=n * gauge.high + 1e-6 * (1 + n))
        gauge._variance = number(state, "variance", low=0.0, high=n * width * width * (1 + 1e-9))
        gauge.lower = number(state, "lower", low=0.0, high=1.0)
        gauge.upper = number(state, "upper", low=gauge.lower, high=1.0)
        gauge.n = n
        return gauge


class WeightedWatch:
    """The draws and the weighted accuracy tests of one policy (module docstring): ``whole`` on
    every auditable accepted decision since the start (or an operator's clear) at
    ``WHOLE_SHARE * alpha``, ``suspect`` on those from the moment traffic turned suspect
    (``start_suspect``) at ``SUSPECT_SHARE * alpha`` with stakes for larger breaks
    (``SUSPECT_GAPS``), and the gauge. The design learns from each label that comes
    (``AuditDesign.learn``), so later draws follow the errors the labels show. ``reference``: the tuning rows the policy accepted (the
    design's first counts; None: uniform draws). Tickets number the decisions entered, and go
    on from ``first_ticket`` (a rebuilt watch's, so an older watch's labels match nothing).

    Draw probabilities and stakes come from ``drawing``, a copy of ``design`` (which counts
    every decision entered, after its probability was set) taken every ``refresh`` decisions:
    both depend only on decisions before the one drawn, as the test needs."""

    def __init__(self, *, target: float, alpha: float, reference: tuple[float, ...] | None,
                 seed: str, first_ticket: int = 0, max_pending: int = PENDING_MAX,
                 refresh: int = REFRESH) -> None:
        self.target, self.alpha, self.allowed = target, alpha, 1.0 - target
        self.floor = 1.0 if reference is None else FLOOR
        self.design = AuditDesign(reference or (), floor=self.floor)
        self.drawing = AuditDesign(reference or (), floor=self.floor)
        self.refresh, self._unseen = refresh, 0  # decisions ``drawing`` has not counted
        self.next_ticket = first_ticket
        self.max_pending = max_pending
        self._pending: deque[_Pending] = deque()
        self._drawn: dict[int, _Pending] = {}
        # Seeded, one stream per policy: which accepted decisions get audited is reproducible.
        self._rng = random.Random(seed)
        self.lost = 0  # drawn decisions whose label never came (counted right)
        self.overflowed = 0  # ... of which the queue held too many decisions behind them
        self.restart()

    def restart(self) -> None:
        """Both tests and the gauge start afresh from the next decision (an operator's clear);
        the design, the tickets and the decisions waiting stay (those go to no test)."""
        self.whole = self._whole_test()
        self.whole_from = self.next_ticket
        self.suspect: WeightedShortfallTest | None = None
        self.suspect_from: int | None = None
        self.gauge: WeightedAccuracy | None = None
        self.gauge_from = self.next_ticket

    def start_suspect(self) -> None:
        """Traffic turned suspect: the second test counts decisions from the next one (once)."""
        if self.suspect is None:
            self.suspect = self._suspect_test()
            self.suspect_from = self.next_ticket

    def _whole_test(self) -> WeightedShortfallTest:
        return WeightedShortfallTest(self.target, alpha=WHOLE_SHARE * self.alpha,
                                     gaps=WEIGHTED_GAPS)

    def _suspect_test(self) -> WeightedShortfallTest:
        return WeightedShortfallTest(self.target, alpha=SUSPECT_SHARE * self.alpha,
                                     gaps=SUSPECT_GAPS)

    @property
    def tripped(self) -> WeightedShortfallTest | None:
        """The test whose alarm is raised, ``whole`` first; None while neither is."""
        if self.whole.alarm:
            return self.whole
        return self.suspect if self.suspect is not None and self.suspect.alarm else None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def enter(self, confidence: float, rate: float, *, drawn: bool | None = None,
              probability: float | None = None) -> Draw | None:
        """One auditable accepted decision at audit ``rate`` (> 0): its draw probability from
        the design as it stood before it (then the design counts it), and the draw (``drawn``:
        the one a replayed log records, at its logged ``probability``). Returns the draw
        when it is to be audited; the decision is bet on once those ahead of it are."""
        if self._unseen >= self.refresh:
            self.drawing.resume(self.design.state())
            self._unseen = 0
        pi = max(PI_MIN, self.drawing.probability(confidence, rate))
        variance, loss = self.drawing.scale(rate, eta=1.0, allowed=self.allowed)
        if probability is not None:  # a logged draw: its own loss bounds its bet
            pi = probability
            loss = max(loss, risk(confidence) * (1.0 / pi - 1.0))
        self.design.see(confidence)
        self._unseen += 1
        audited = self._rng.random() < pi if drawn is None else drawn
        entry = _Pending(self.next_ticket, confidence, pi, (variance, loss), audited,
                         resolved=not audited)
        self.next_ticket += 1
        lowest = min(pi, lowest_probability(rate, self.floor))
        if self.gauge is not None and lowest < self.gauge.lowest:
            self.gauge = None  # a lower rate than it was built for: it starts afresh here
        if self.gauge is None:
            self.gauge = WeightedAccuracy(alpha=self.alpha / 2.0, allowed=self.allowed,
                                          lowest=lowest)
            self.gauge_from = entry.ticket
        self._pending.append(entry)
        if audited:
            self._drawn[entry.ticket] = entry
        self._settle()
        return Draw(entry.ticket, pi) if audited else None

    def labelled(self, ticket: int, correct: bool | None) -> bool:
        """The label of a drawn decision (None: none will come, ``lost``). False when the
        ticket waits no more (lost already, or another watch's)."""
        entry = self._drawn.pop(ticket, None)
        if entry is None:
            return False
        entry.resolved, entry.correct = True, correct
        self.lost += correct is None
        if correct is not None:
            self.design.learn(entry.confidence, wrong=not correct)
        self._settle()
        return True

    def _settle(self) -> None:
        """Bet the resolved decisions at the head, in order; past ``max_pending`` waiting, the
        oldest drawn one is lost."""
        while True:
            while self._pending and self._pending[0].resolved:
                entry = self._pending.popleft()
                _bet(entry, self.whole if entry.ticket >= self.whole_from else None,
                     self.suspect if entry.ticket >= (self.suspect_from or 0) else None,
                     self.gauge if entry.ticket >= self.gauge_from else None)
            if len(self._pending) <= self.max_pending:
                return
            head = self._pending[0]
            del self._drawn[head.ticket]
            head.resolved = True
            self.lost += 1
            self.overflowed += 1

    def state(self) -> dict[str, Any]:
        """The evidence as plain JSON values, the decisions still waiting bet on as if their
        labels were lost (they cannot reach another process); this watch is left as it was."""
        whole, suspect, gauge = (_copy(self.whole),
                                 None if self.suspect is None else _copy(self.suspect),
                                 None if self.gauge is None else WeightedAccuracy.resumed(
                                     self.gauge.state(), alpha=self.alpha / 2.0,
                                     allowed=self.allowed))
        lost = self.lost
        for entry in self._pending:
            lost += not entry.resolved
            _bet(entry, whole if entry.ticket >= self.whole_from else None,
                 suspect if entry.ticket >= (self.suspect_from or 0) else None,
                 gauge if entry.ticket >= self.gauge_from else None)
        return {"design": self.design.state(), "next_ticket": self.next_ticket,
                "whole": whole.state(), "whole_from": self.whole_from,
                "suspect": None if suspect is None else suspect.state(),
                "suspect_from": self.suspect_from,
                "gauge": None if gauge is None else gauge.state(), "gauge_from": self.gauge_from,
                "lost": lost, "overflowed": self.overflowed}

    def resume(self, state: dict[str, Any]) -> None:
        """Continue from ``state()``: a value out of its range or out of step with another is
        refused (DamagedState naming the field) and nothing is taken."""
        design = AuditDesign(floor=self.floor)
        section("design", design.resume, state)
        tickets = count(state, "next_ticket")
        whole = self._whole_test()
        section("whole", whole.resume, state)
        whole_from = count(state, "whole_from", high=tickets)
        at_most("whole.n", whole.n, tickets - whole_from)
        suspect_from = optional_count(state, "suspect_from", low=whole_from, high=tickets)
        suspect = None
        if (field(state, "suspect") is None) != (suspect_from is None):
            raise DamagedState("suspect_from must be given exactly when suspect is, got "
                               f"{suspect_from!r}")
        if suspect_from is not None:
            suspect = self._suspect_test()
            section("suspect", suspect.resume, state)
            at_most("suspect.n", suspect.n, tickets - suspect_from)
        gauge_from = count(state, "gauge_from", high=tickets)
        gauge = None
        if field(state, "gauge") is not None:
            try:
                gauge = WeightedAccuracy.resumed(state["gauge"], alpha=self.alpha / 2.0,
                                                 allowed=self.allowed)
            except DamagedState as exc:
                raise DamagedState(f"gauge.{exc}") from exc
            at_most("gauge.n", gauge.n, tickets - gauge_from)
        lost = count(state, "lost", high=tickets)
        overflowed = count(state, "overflowed", high=lost)
        self.design, self.next_ticket, self.whole, self.whole_from = (
            design, tickets, whole, whole_from)
        self.drawing.resume(design.state())
        self._unseen = 0
        self.suspect, self.suspect_from, self.gauge, self.gauge_from = (
            suspect, suspect_from, gauge, gauge_from)
        self.lost, self.overflowed = lost, overflowed
        self._pending.clear()
        self._drawn.clear()


def _bet(entry: _Pending, whole: WeightedShortfallTest | None,
         suspect: WeightedShortfallTest | None, gauge: WeightedAccuracy | None) -> None:
    for test in (whole, suspect):
        if test is not None:
            test.update(entry.confidence, probability=entry.probability, audited=entry.audited,
                        correct=entry.correct if entry.resolved else None, scale=entry.scale)
    if gauge is not None:
        q = risk(entry.confidence)
        wrong = 0.0 if entry.correct or entry.correct is None else 1.0
        labelled = entry.audited and entry.correct is not None
        gauge.update(q + (wrong - q) / entry.probability if entry.audited else q,
                     labelled=labelled)


def _copy(test: WeightedShortfallTest) -> WeightedShortfallTest:
    copy = WeightedShortfallTest(test.target, alpha=test.alpha, eta=test.eta, gaps=test.gaps)
    copy.resume(test.state())
    return copy
