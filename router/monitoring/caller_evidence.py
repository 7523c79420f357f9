"""Each caller's share of the traffic detector's evidence, capped: one API key's inputs can
multiply the detector's statistic by at most ``arl ** CALLER_EVIDENCE_SHARE`` per budget, so no
key trips it for the others alone, while a shift spread over many keys still does."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calibration.state import DamagedState, count, field, number_value

# The largest part of the trip level's log (log arl) one caller may supply per budget. A quarter:
# with every other caller's traffic as sure as the tuning rows, a caller at its cap leaves a run
# length to a false trip of at least arl ** 0.75 ranked decisions (5,623 at arl 100,000).
CALLER_EVIDENCE_SHARE = 0.25
# A caller's budget renews after this many decisions ranked since it started: by then the
# others' ordinary traffic has bet away what it won (each ranked decision of ordinary traffic
# loses the detector's bets a little on average).
BUDGET_RANKED = 1000
# A caller whose every bet has less than this left to win (nats) is spent: its inputs are not
# ranked at all until its budget renews, so its flood does not crowd the ranks either.
SPENT_NATS = 0.05
CALLER_MEMORY_S = 86_400.0  # a caller silent this long is forgotten
MAX_CALLERS = 4096  # callers remembered (the least recently seen forgotten first)
CLOCK_SKEW_S = 3600.0  # a saved time this far ahead of the clock is damage


@dataclass
class _Caller:
    since: int  # decisions ranked (by anyone) when its budget started
    seen: float  # the time of its last decision
    evidence: list[float]  # per bet: the most its inputs won over any stretch ending now (log)


class CallerEvidence:
    """How much of each bet's log-wealth each caller has supplied: per caller and bet, the
    largest sum of log factors over any stretch of its ranked inputs ending now (a CUSUM, so
    every change point the detector sums over is covered). Each factor a caller's input is bet
    at is clipped (``most``) so that it cannot lift that sum past ``cap``; a caller with nothing
    left to win is not ranked at all (``most`` is None). The clip depends only on the past, so
    every bet keeps conditional mean at most 1 and the detector its run-length bound.

    With one caller seen in the last ``CALLER_MEMORY_S`` there is no cap: a deployment without
    API keys is one caller, and a cap would only blind it."""

    def __init__(self, n_bets: int, *, cap: float, budget_ranked: int = BUDGET_RANKED,
                 memory_s: float = CALLER_MEMORY_S, max_callers: int = MAX_CALLERS) -> None:
        if not cap > 0.0 or math.isinf(cap):
            raise ValueError(f"cap must be a finite number above 0, got {cap!r}")
        self.cap = cap
        self._n_bets = n_bets
        self._budget_ranked = budget_ranked
        self._memory_s = memory_s
        self._max_callers = max_callers
        self._callers: OrderedDict[str, _Caller] = OrderedDict()
        self.capped = 0  # inputs not ranked: their caller's evidence was spent

    def spent(self) -> list[str]:
        """The callers whose evidence is spent (their inputs are not ranked)."""
        return [name for name, c in self._callers.items() if self._spent(c)]

    def most(self, caller: str, ranked: int, now: float | None = None) -> list[float] | None:
        """The most each bet may multiply by on ``caller``'s next input, ``ranked`` decisions
        into the detector; None: the input is not to be ranked."""
        entry = self._sight(caller, ranked, time.time() if now is None else now)
        if len(self._callers) <= 1:
            return [math.inf] * self._n_bets
        if self._spent(entry):
            self.capped += 1
            return None
        return [math.exp(self.cap - won) for won in entry.evidence]

    def took(self, caller: str, factors: Sequence[float]) -> None:
        """The factors ``caller``'s ranked input was bet at (after ``most``)."""
        entry = self._callers[caller]
        entry.evidence = [min(self.cap, max(0.0, won + (math.log(f) if f > 0.0 else -math.inf)))
                          for won, f in zip(entry.evidence, factors, strict=True)]

    def state(self) -> dict[str, Any]:
        """Each caller's budget, as plain JSON values (``resume`` takes it back)."""
        return {name: {"since": c.since, "seen": c.seen, "evidence": list(c.evidence)}
                for name, c in self._callers.items()}

    def resume(self, state: Any, *, ranked: int, now: float | None = None) -> None:
        """Take back a ``state()`` of a detector that has ranked ``ranked`` decisions;
        DamagedState naming the field, and nothing taken, on one no run could have written."""
        if not isinstance(state, dict) or len(state) > self._max_callers:
            raise DamagedState(f"must be an object of at most {self._max_callers} callers, "
                               f"got {str(state)[:80]!r}")
        latest = (time.time() if now is None else now) + CLOCK_SKEW_S
        taken: list[tuple[str, _Caller]] = []
        for name, entry in state.items():
            try:
                evidence = field(entry, "evidence")
                if not isinstance(evidence, list) or len(evidence) != self._n_bets:
                    raise DamagedState(f"evidence must be a list of {self._n_bets} numbers, "
                                       f"got {evidence!r}")
                taken.append((name, _Caller(
                    count(entry, "since", high=ranked),
                    number_value(field(entry, "seen"), "seen", low=0.0, high=latest),
                    [number_value(v, "evidence", low=0.0, high=self.cap) for v in evidence])))
            except DamagedState as exc:
                raise DamagedState(f"{name}.{exc}") from exc
        self._callers = OrderedDict(sorted(taken, key=lambda item: item[1].seen))

    def _spent(self, entry: _Caller) -> bool:
        return all(won >= self.cap - SPENT_NATS for won in entry.evidence)

    def _sight(self, caller: str, ranked: int, now: float) -> _Caller:
        """The caller's entry, seen now: a budget ``budget_ranked`` decisions old renews,
        callers silent for ``memory_s`` are forgotten."""
        while self._callers:
            oldest = next(iter(self._callers.values()))
            if now - oldest.seen < self._memory_s:
                break
            self._callers.popitem(last=False)
        entry = self._callers.pop(caller, None)
        if entry is None or ranked - entry.since >= self._budget_ranked:
            entry = _Caller(ranked, now, [0.0] * self._n_bets)
        entry.seen = now
        self._callers[caller] = entry
        while len(self._callers) > self._max_callers:
            self._callers.popitem(last=False)
        return entry
