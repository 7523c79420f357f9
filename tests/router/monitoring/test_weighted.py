"""WeightedWatch: audits drawn by risk, bet in decision order whatever order their labels come
in, a lost label counted as right, the queue's bound, the saved state (waiting decisions saved as
lost, a damaged one refused naming the field), the gauge, and the test's error rates on seeded
streams at the edge of the promise and past it."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

from calibration.state import DamagedState
from router.monitoring.weighted import (
    WHOLE_SHARE,
    WeightedAccuracy,
    WeightedWatch,
    lowest_probability,
)

REFERENCE = tuple(float(c) for c in np.random.default_rng(0).uniform(0.9, 1.0, size=400))


def weighted(**options: Any) -> WeightedWatch:
    return WeightedWatch(target=0.95, alpha=0.05, reference=REFERENCE, seed="p", **options)


def entered(watch: WeightedWatch, confidences: list[float], rate: float = 0.5) -> list[int]:
    """Enter the decisions; the tickets of those drawn."""
    return [d.ticket for c in confidences if (d := watch.enter(c, rate)) is not None]


CONFIDENCES = [float(c) for c in np.random.default_rng(1).uniform(0.9, 1.0, size=300)]


def test_decisions_are_bet_in_decision_order_whatever_order_labels_come_in() -> None:
    in_order, reversed_ = weighted(), weighted()
    drawn = entered(in_order, CONFIDENCES)
    assert entered(reversed_, CONFIDENCES) == drawn and 50 < len(drawn) < 250
    verdicts = {t: t % 3 != 0 for t in drawn}
    assert reversed_.whole.n == drawn[0]  # nothing past the first drawn decision is bet yet
    for ticket in reversed(drawn[1:]):  # every label but the oldest: still nothing bet
        assert reversed_.labelled(ticket, verdicts[ticket])
        assert reversed_.whole.n == drawn[0]
    assert reversed_.labelled(drawn[0], verdicts[drawn[0]])
    for ticket in drawn:
        in_order.labelled(ticket, verdicts[ticket])
    assert reversed_.whole.n == in_order.whole.n == len(CONFIDENCES)
    late, early = reversed_.state(), in_order.state()
    # The design learnt the same labels in another order: the same sums, but for rounding.
    late_design, early_design = late.pop("design"), early.pop("design")
    assert all(late_design[k] == pytest.approx(early_design[k]) for k in early_design)
    assert late == early
    assert in_order.whole.labels == len(drawn) and in_order.pending == 0


def test_a_lost_label_counts_as_right_and_a_late_one_is_refused() -> None:
    lost, right = weighted(), weighted()
    drawn = entered(lost, CONFIDENCES)
    entered(right, CONFIDENCES)
    for ticket in drawn:
        assert lost.labelled(ticket, None)
        right.labelled(ticket, True)
    assert lost.lost == len(drawn) and right.lost == 0
    assert lost.whole.log_value == pytest.approx(right.whole.log_value)  # Z as for a right one
    assert not lost.labelled(drawn[0], False)  # it was bet already: the label is not taken


def test_past_its_bound_the_queue_loses_its_oldest_drawn_decisions() -> None:
    watch = weighted(max_pending=5)
    tickets = entered(watch, CONFIDENCES[:8], rate=1.0)  # every decision drawn
    assert tickets == list(range(8))
    assert watch.pending == 5 and watch.overflowed == watch.lost == 3 and watch.whole.n == 3
    assert not watch.labelled(0, True) and watch.labelled(3, True) and watch.whole.n == 4


def test_the_state_bets_waiting_decisions_as_lost_and_leaves_them_waiting() -> None:
    watch = weighted()
    drawn = entered(watch, CONFIDENCES)
    for ticket in drawn[1:]:
        watch.labelled(ticket, ticket % 4 != 0)
    watch.start_suspect()
    entered(watch, CONFIDENCES[:50])
    state = watch.state()
    assert state["whole"]["n"] == state["next_ticket"] == 350 and state["lost"] >= 1
    assert watch.pending > 0 and watch.lost == 0  # the live watch is unchanged
    resumed = weighted()
    resumed.resume(state)
    assert resumed.state() == state and resumed.pending == 0
    assert resumed.suspect is not None and resumed.suspect.n == 50
    assert watch.labelled(drawn[0], True)  # the label can still come here


DAMAGE = [
    ({"next_ticket": -1}, "next_ticket"),
    ({"whole.n": 10**6}, "whole.n"),
    ({"whole_from": 10**6}, "whole_from"),
    ({"suspect_from": 3}, "suspect_from"),
    ({"gauge.lowest": 0.0}, "gauge.lowest"),
    ({"gauge.sum": -1e9}, "gauge.sum"),
    ({"gauge.upper": math.nan}, "gauge.upper"),
    ({"design.counts": [1] * 3}, "design.counts"),
    ({"overflowed": 10**5}, "overflowed"),
]


@pytest.mark.parametrize(("changes", "name"), DAMAGE, ids=[d[1] for d in DAMAGE])
def test_a_damaged_state_is_refused_naming_the_field_and_nothing_is_taken(
        changes: dict[str, Any], name: str) -> None:
    source = weighted()
    for ticket in entered(source, CONFIDENCES):
        source.labelled(ticket, True)
    state = copy.deepcopy(source.state())
    for path, value in changes.items():
        *parents, last = path.split(".")
        target = state
        for parent in parents:
            target = target[parent]
        target[last] = value
    watch = weighted()
    entered(watch, CONFIDENCES[:5])
    before = watch.state()
    with pytest.raises(DamagedState, match=rf"(?<![\w.]){name}(?!\w)"):
        watch.resume(state)
    assert watch.state() == before


def test_the_gauge_covers_accuracy_and_restarts_for_a_lower_rate() -> None:
    rng = np.random.default_rng(2)
    watch = weighted()
    for c in rng.uniform(0.9, 1.0, size=4000):
        draw = watch.enter(float(c), 0.5)
        if draw is not None:
            watch.labelled(draw.ticket, bool(rng.random() < c))  # calibrated: 95% right
    assert watch.gauge is not None
    bounds = watch.gauge.bounds()
    assert bounds.mean is not None and abs(bounds.mean - 0.95) < 0.02
    assert bounds.lower < 0.95 < bounds.upper and bounds.upper - bounds.lower < 0.5
    assert watch.gauge.lowest == lowest_probability(0.5, 0.25)
    watch.enter(0.95, 0.01)  # a lower rate allows a heavier label: a gauge of wider range
    assert watch.gauge.n == 1 and watch.gauge.lowest == lowest_probability(0.01, 0.25)
    with pytest.raises(DamagedState, match="lowest"):
        WeightedAccuracy.resumed({**watch.gauge.state(), "lowest": 2.0}, alpha=0.05,
                                 allowed=0.05)


def alarms(streams: int, decisions: int, *, shortfall: float, seed: int) -> int:
    """Streams (of ``decisions`` calibrated accepted decisions, each wrong with its risk plus
    ``shortfall``, audited by risk at rate 0.2) whose whole-stream test raised its alarm."""
    rng = np.random.default_rng(seed)
    raised = 0
    for s in range(streams):
        watch = WeightedWatch(target=0.95, alpha=0.1 / WHOLE_SHARE, reference=REFERENCE,
                              seed=f"s{s}")
        confidence = rng.uniform(0.9, 1.0, size=decisions)
        wrong = rng.random(decisions) < 1.0 - confidence + shortfall
        for c, w in zip(confidence.tolist(), wrong.tolist(), strict=True):
            draw = watch.enter(c, 0.2)
            if draw is not None:
                watch.labelled(draw.ticket, not w)
            if watch.whole.alarm:
                raised += 1
                break
    return raised


def test_at_the_edge_of_the_promise_the_alarm_is_false_at_most_alpha_and_a_break_raises_it(
) -> None:
    """Accuracy exactly the target (the risks are calibrated and average 5%): the whole-stream
    test (alpha 0.1 here) alarms in at most alpha of the streams, plus three binomial standard
    errors; ten points below, it alarms in nearly every stream."""
    streams, alpha = 200, 0.1
    assert WeightedWatch(target=0.95, alpha=alpha / WHOLE_SHARE, reference=REFERENCE,
                         seed="s").whole.alpha == pytest.approx(alpha)
    false = alarms(streams, 1500, shortfall=0.0, seed=3) / streams
    assert false <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / streams)
    assert alarms(20, 1500, shortfall=0.10, seed=4) >= 18
