"""The rate's confidence sequence from counts: wider than the fixed-n interval (the price of
being valid at every count), symmetric under swapping successes and failures, narrowing as
events accumulate, and its ends where the mixture martingale reaches 1 / alpha."""

from __future__ import annotations

import math

import pytest
from scipy.special import betaln, xlog1py, xlogy
from scipy.stats import binomtest

from calibration.sequences import rate_sequence


def test_before_any_event_the_interval_is_everything() -> None:
    bounds = rate_sequence(0, 0, alpha=0.05)
    assert (bounds.lower, bounds.upper, bounds.n, bounds.mean) == (0.0, 1.0, 0, None)


@pytest.mark.parametrize(("successes", "n"), [(1, 10), (600, 1000), (9_990, 10_000)])
def test_it_holds_the_mean_and_is_wider_than_the_fixed_n_interval(successes: int, n: int) -> None:
    bounds = rate_sequence(successes, n, alpha=0.05)
    fixed = binomtest(successes, n).proportion_ci(0.95)
    assert bounds.lower < successes / n < bounds.upper
    assert bounds.lower < fixed.low and bounds.upper > fixed.high


def test_swapping_successes_and_failures_mirrors_it() -> None:
    one, other = rate_sequence(30, 200, alpha=0.025), rate_sequence(170, 200, alpha=0.025)
    assert one.lower == pytest.approx(1.0 - other.upper, abs=1e-9)
    assert one.upper == pytest.approx(1.0 - other.lower, abs=1e-9)


def test_it_narrows_as_events_accumulate_at_the_same_rate() -> None:
    widths = [rate_sequence(n // 4, n, alpha=0.05) for n in (40, 400, 4000)]
    assert widths[0].upper - widths[0].lower > widths[1].upper - widths[1].lower > (
        widths[2].upper - widths[2].lower)


def test_its_ends_are_where_the_mixture_martingale_reaches_one_over_alpha() -> None:
    successes, n, alpha = 37, 90, 0.05
    bounds = rate_sequence(successes, n, alpha=alpha)
    for p in (bounds.lower, bounds.upper):
        log_wealth = (betaln(successes + 1, n - successes + 1) - xlogy(successes, p)
                      - xlog1py(n - successes, -p))
        assert log_wealth == pytest.approx(math.log(1 / alpha), abs=1e-6)


def test_counts_out_of_range_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="successes must be in"):
        rate_sequence(5, 4, alpha=0.05)
    with pytest.raises(ValueError, match="alpha"):
        rate_sequence(1, 4, alpha=1.5)
