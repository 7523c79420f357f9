"""The cost promise's bound holds where the data choose the rule as badly as they may, is not
vacuous, refuses bad input by name; the live slow-share test trips on a stream past its cap and
stays quiet on one within it."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from calibration.block_cost import BlockCostPromise, SlowShareTest


def test_block_tail_and_its_inverse_agree() -> None:
    promise = BlockCostPromise(share=0.15, block=1000, delta=0.05)
    assert promise.allowed == 150
    cap = promise.live_cap
    assert promise.block_tail(cap) == pytest.approx(0.05, abs=1e-6)
    assert promise.block_tail(cap + 0.01) > 0.05 > promise.block_tail(cap - 0.01)
    assert BlockCostPromise(share=1.0, block=10, delta=0.05).live_cap == 1.0


@pytest.mark.parametrize(("n_tiers", "at_least"), [(1, 40), (2, 20)])
def test_the_bound_holds_when_the_data_choose_the_worst_rule(n_tiers: int,
                                                             at_least: int) -> None:
    """Every draw of threshold rows (confidences uniform, so a threshold's escalation
    probability is the threshold itself) picks the rule escalating the most rows the promise
    allows: the chance a block breaks the share, over draws and blocks, stays within delta."""
    promise = BlockCostPromise(share=0.2, block=500, delta=0.1)
    n, draws = 400, 4000
    # Whether k escalations keep the promise does not depend on the draw: one k for all.
    most = max(k for k in range(n + 1) if k <= 120
               and promise.bound(k, n, n_tiers=n_tiers).kept)
    conf = np.sort(np.random.default_rng(0).uniform(size=(draws, n)), axis=1)
    # The rule escalating ``most`` rows: its threshold is the (most+1)-th smallest confidence.
    rate = float(binom.sf(promise.allowed, promise.block, conf[:, most]).mean())
    assert rate <= promise.delta
    # Not vacuous: rules escalating 10% of the rows keep it (5% for several tiers, whose
    # uniform margin is wider).
    assert most >= at_least


def test_most_escalations_is_where_the_bound_stops_holding() -> None:
    promise = BlockCostPromise(share=0.15, block=1000, delta=0.05)
    most = promise.most_escalations(2000)
    assert promise.bound(most, 2000).kept and not promise.bound(most + 1, 2000).kept
    # Several tiers pay the uniform margin: they may escalate fewer rows.
    assert promise.bound(most, 2000, n_tiers=2).block_bound > promise.bound(most, 2000).block_bound


@pytest.mark.parametrize(("field", "kwargs"), [
    ("cost_share", {"share": 1.5, "block": 10, "delta": 0.05}),
    ("cost_block", {"share": 0.1, "block": 0, "delta": 0.05}),
    ("cost_delta", {"share": 0.1, "block": 10, "delta": 1.0}),
])
def test_bad_promises_name_their_field(field: str, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=field):
        BlockCostPromise(**kwargs)  # type: ignore[arg-type]


def _alarms(p: float, *, cap: float, streams: int, length: int, seed: int) -> list[int | None]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(streams):
        test = SlowShareTest(cap, alpha=0.05)
        for escalated in rng.uniform(size=length) < p:
            if test.update(bool(escalated)):
                break
        out.append(test.alarm_at)
    return out


def test_live_test_trips_on_a_stream_past_its_cap() -> None:
    alarms = _alarms(0.2, cap=0.13, streams=10, length=3000, seed=1)
    assert all(a is not None for a in alarms)
    assert float(np.median([a for a in alarms if a is not None])) < 1500


def test_live_test_stays_quiet_on_streams_within_its_cap() -> None:
    alarms = _alarms(0.13, cap=0.13, streams=40, length=1500, seed=2)
    assert sum(a is not None for a in alarms) <= 2  # alpha 0.05 of 40 streams, with slack
