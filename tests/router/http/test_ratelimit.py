"""The token bucket itself: burst, refill at the configured rate, Retry-After from the deficit."""

from __future__ import annotations

import pytest

from router.errors import TooManyRequests
from router.http.ratelimit import TokenBuckets


def test_burst_then_refill(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("router.http.ratelimit.time.monotonic", lambda: now[0])
    buckets = TokenBuckets(rate_rps=2.0, burst=2)
    buckets.take("k")
    buckets.take("k")
    with pytest.raises(TooManyRequests) as info:
        buckets.take("k")
    assert info.value.retry_after_s == pytest.approx(0.5)
    buckets.take("other")  # another key has its own bucket
    now[0] += 0.5  # one token back at 2 per second
    buckets.take("k")
    with pytest.raises(TooManyRequests):
        buckets.take("k")
