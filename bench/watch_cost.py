"""What the watch costs a decision, in process: ``Monitor.decided`` alone (input key, rank, bet,
audit draw), and ``RoutingService.route`` on a tuned policy with and without a monitor (a mock
fast read, the in-memory cache, a log that keeps nothing), interleaved rounds, medians.

    python -m bench.watch_cost

HTTP and the event loop's other work are left out on purpose: they are the same either way
(bench.overhead measures them, with no policy loaded, so without the watch)."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def decided_us(n: int = 20_000) -> float:
    """Microseconds of one ``Monitor.decided`` call on a 77-option decision."""
    from policies.types import DecisionRequest, Option
    from router.monitoring.monitor import Monitor
    from router.monitoring.watch import PolicyWatch, WatchSettings
    from router.routing.ports import Observation

    rng = np.random.default_rng(0)
    monitor = Monitor()
    monitor.watches["bench"] = PolicyWatch(
        WatchSettings("bench", 0.95, reference=tuple(rng.beta(6, 1, 5000).round(4))))
    options = tuple(Option(f"intent_{k}") for k in range(77))
    observations = [Observation(DecisionRequest(f"q{i}", "which intent?", options,
                                                f"message number {i} about a card payment"),
                                f"d{i}", "bench", float(c), True, "intent_0", True)
                    for i, c in enumerate(rng.beta(6, 1, n))]
    t0 = time.perf_counter()
    for observation in observations:
        monitor.decided(observation)
    return round((time.perf_counter() - t0) / n * 1e6, 1)


class _NoLog:
    async def append(self, record: Any) -> None:
        return None


async def _service_us(work: Path, *, rounds: int = 7, n: int = 1000) -> dict[str, Any]:
    from policies.types import DecisionRequest, Option
    from router.backends.mock import MockBackend
    from router.monitoring.monitor import Monitor
    from router.routing.registry import PolicyRegistry
    from router.routing.service import RoutingService
    from router.settings import Settings
    from router.store.cache import MemoryCache
    from router.store.metrics import Metrics
    from tests.router.monitoring.conftest import OPTIONS, watched_policy

    backend = MockBackend(lambda request: (0.97, 0.02, 0.01))
    policy = watched_policy(backend_fingerprint=backend.fingerprint, on_alarm="alert_only")
    policy.write(work / "policy.json")
    settings = Settings(policy={"files": [work / "policy.json"], "default": policy.name})
    options = tuple(Option(o) for o in OPTIONS)

    def service(monitor: Monitor | None) -> RoutingService:
        registry = PolicyRegistry.load(settings.policy, backend_fingerprint=backend.fingerprint,
                                       monitor=monitor)
        return RoutingService(backend=backend, cache=MemoryCache(max_entries=100_000, ttl_s=600),
                              registry=registry, slow=None, log=_NoLog(), metrics=Metrics(),
                              settings=settings, monitor=monitor)

    paths = {"without_watch": service(None), "with_watch": service(Monitor())}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(rounds):
        for name, svc in paths.items():
            requests = [DecisionRequest("pick", "pick", options, f"{name} {r} message {i}")
                        for i in range(n)]
            t0 = time.perf_counter()
            for request in requests:
                await svc.route([request], namespace="bench")
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    med = {name: round(statistics.median(v), 1) for name, v in times.items()}
    return {"decide_us_without_watch": med["without_watch"],
            "decide_us_with_watch": med["with_watch"],
            "ratio": round(med["with_watch"] / med["without_watch"], 3), "rounds": rounds,
            "decisions_per_round": n}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    # No options; parsed so that --help answers (tests/bench/test_entry_points.py) and a stray
    # argument is refused instead of silently running the benchmark.
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        result = {"monitor_decided_us": decided_us(), **asyncio.run(_service_us(Path(work)))}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
