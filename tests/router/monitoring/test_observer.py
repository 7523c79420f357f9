"""Monitoring behind routing's one observer port, with the real registry and service: the
policy the registry serves is the tuned one, unwrapped (its ``decide`` is pure), the service
tells the monitor once per decision with a fast read, and the registry's alarm gate escalates
what the policy accepts while an alarm acts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from policies.policy import Policy
from policies.types import DecisionRequest, Option, OptionScores
from router.backends.mock import MockBackend
from router.monitoring.monitor import Monitor
from router.routing.ports import Observation
from router.routing.registry import PolicyRegistry
from router.routing.service import RoutingService
from router.settings import Settings
from router.store.cache import MemoryCache
from router.store.metrics import Metrics
from tests.router.monitoring.conftest import OPTIONS, spelled, watched_policy
from tests.router.routing.test_service import ListLog, RecordingSlow


class Counting(Monitor):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Observation] = []

    def decided(self, observation: Observation) -> None:
        self.seen.append(observation)
        super().decided(observation)


def read(request: DecisionRequest) -> Sequence[float]:
    return (0.86, 0.07, 0.07) if "unsure" in request.state else (0.98, 0.01, 0.01)


def ask(text: str) -> DecisionRequest:
    return DecisionRequest("pick", "pick", tuple(Option(o) for o in OPTIONS), text)


async def test_one_observer_call_per_decision_and_the_gate_beside_the_mode(
        tmp_path: Path) -> None:
    backend = MockBackend(read)
    policy = watched_policy(backend_fingerprint=backend.fingerprint, on_alarm="escalate_all")
    policy.write(tmp_path / "policy.json")
    settings = Settings(policy={"files": [tmp_path / "policy.json"], "default": policy.name})
    monitor = Counting()
    registry = PolicyRegistry.load(settings.policy, backend_fingerprint=backend.fingerprint,
                                   monitor=monitor)
    runtime: Any = registry.lookup(ask("x"), fingerprint=backend.fingerprint)
    assert isinstance(runtime, Policy)  # not wrapped: the watch is not in decide()
    runtime.decide(OptionScores(OPTIONS, (0.55, 0.25, 0.2)))
    assert monitor.watches[policy.policy_id].n_decisions == 0  # decide() told nobody
    service = RoutingService(backend=backend, cache=MemoryCache(max_entries=1000, ttl_s=60),
                             registry=registry, slow=RecordingSlow(), log=ListLog(),  # type: ignore[arg-type]
                             metrics=Metrics(), settings=settings, monitor=monitor)
    [first] = await service.route([ask("sure 0")], namespace="t")
    assert first.route == "fast" and registry.gate(runtime) is None
    assert [o.decision_id for o in monitor.seen] == [first.decision_id]
    assert monitor.seen[0].accepted and monitor.seen[0].served_fast
    for i in range(300):
        await service.route([ask(f"unsure {spelled(i)}")], namespace="t")
        if registry.gate(runtime) is not None:
            break
    assert len(monitor.seen) == i + 2  # one call per decision, no more
    [gated] = await service.route([ask("sure 1")], namespace="t")
    assert gated.route == "slow" and gated.escalated
    assert monitor.seen[-1].accepted and not monitor.seen[-1].served_fast
