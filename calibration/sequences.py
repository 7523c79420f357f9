"""An anytime-valid confidence sequence for a rate from its counts alone (``rate_sequence``): what
the operator page shows for a policy's live coverage, whose watch keeps counts of every decision
rather than the sequence of them.

It is Robbins' beta-binomial mixture: for each candidate rate ``p`` the mixture over a uniform
prior of the likelihood ratios against ``p`` is a nonnegative martingale starting at 1 while
events happen at rate ``p``, so by Ville's inequality it ever reaches ``1 / alpha`` with
probability at most ``alpha``. The rates where it has not are the interval: valid at every
count at once, so it may be looked at after every decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy.optimize import brentq
from scipy.special import betaln, xlog1py, xlogy

from calibration.monitoring import Bounds
from calibration.validation import check_fraction

_EDGE = 1e-12  # the roots are searched in [_EDGE, 1 - _EDGE]: log p is finite there


def rate_sequence(successes: int, n: int, *, alpha: float) -> Bounds:
    """The interval at level ``1 - alpha`` for the rate behind ``successes`` out of ``n``
    events: every ``p`` whose mixture martingale stays under ``1 / alpha``. ``[0, 1]`` before the
    first event."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n]; got successes={successes}, n={n}")
    check_fraction(alpha, name="alpha", low_open=True, high_open=True)
    if n == 0:
        return Bounds(0.0, 1.0, 0, None)
    mean = successes / n
    level = math.log(1.0 / alpha)
    mixture = betaln(successes + 1, n - successes + 1)  # log of the prior-averaged likelihood

    def log_wealth(p: float) -> float:
        return float(mixture - xlogy(successes, p) - xlog1py(n - successes, -p))

    def excess(p: float) -> float:
        return log_wealth(p) - level

    # log_wealth is convex with its minimum (below 0 <= level) at the mean: at most one root on
    # each side; none where the wealth stays under the level all the way to the edge.
    lower = _root(excess, mean, _EDGE) if successes > 0 else 0.0
    upper = _root(excess, mean, 1.0 - _EDGE) if successes < n else 1.0
    return Bounds(max(0.0, lower), min(1.0, upper), n, mean)


def _root(excess: Callable[[float], float], mean: float, edge: float) -> float:
    """Where ``excess`` crosses 0 between the mean and ``edge``, or ``edge`` when it stays
    under 0 all the way there."""
    if excess(edge) <= 0.0:
        return edge
    return float(brentq(excess, min(mean, edge), max(mean, edge), xtol=1e-10))
