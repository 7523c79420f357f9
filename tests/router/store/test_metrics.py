"""The router's Prometheus metrics as the routing service sets them: an escalation that fails
still counts as a decision sent to the slow path."""

from __future__ import annotations

import pytest

from router.errors import SlowPathTimeout
from tests.router.routing.test_service import RecordingSlow, make_service, request


def sample(metrics_text: bytes, line_start: str) -> float:
    [line] = [line for line in metrics_text.decode().splitlines() if line.startswith(line_start)]
    return float(line.rsplit(" ", 1)[1])


async def test_failed_escalations_count_in_the_escalation_rate() -> None:
    slow = RecordingSlow(fail=SlowPathTimeout("slow model timed out after 30 s"))
    service, _, _, metrics = make_service(slow_path=slow)
    for i in range(10):  # below the 0.9 fallback bar: each one escalates, and the slow path fails
        with pytest.raises(SlowPathTimeout):
            await service.route([request(f"hmm {i}")], namespace="t")
    assert len(slow.calls) == 10
    assert sample(metrics.render(), "slotgate_escalation_rate ") == 1.0
    assert sample(metrics.render(), 'slotgate_decisions_total{route="failed"}') == 10.0
    await service.route([request("I am sure")], namespace="t")  # one answered fast
    assert sample(metrics.render(), "slotgate_escalation_rate ") == pytest.approx(10 / 11)
