"""Ready means warm: under uvicorn on loopback, a cascade's replica answers /readyz 503 (naming
the tiers not read yet) until every configured fast tier has made its first read, then 200."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from policies.types import DecisionRequest
from router.backends.mock import MockBackend
from router.http.startup import WARM_UP_STATE
from router.settings import Settings
from tests.live import LiveServer


def test_readyz_is_503_until_every_tier_has_read_once(tmp_path: Path) -> None:
    release = threading.Event()
    reads: list[tuple[str, str]] = []

    async def cold_first(request: DecisionRequest) -> Sequence[float]:
        if not reads:  # a first read that takes as long as the test says (a cold model)
            await asyncio.to_thread(release.wait, 30)
        reads.append(("first", request.state))
        return [0.5, 0.5]

    def deep(request: DecisionRequest) -> Sequence[float]:
        reads.append(("deep", request.state))
        return [0.5, 0.5]

    settings = Settings(tiers=[{"name": "fast", "kind": "mock"}, {"name": "deep", "kind": "mock"}],
                        log={"decision_log_path": tmp_path / "decisions.jsonl"})
    server = LiveServer(settings, backend=MockBackend(cold_first),
                        tiers={"deep": MockBackend(deep, label="deep")}, warm_up=True)
    with server:
        cold = httpx.get(f"{server.url}/readyz", timeout=10)
        assert cold.status_code == 503, cold.text
        assert cold.json()["checks"]["warm"] is False
        assert cold.json()["warm"] == {"pending": [settings.fast.name, "deep"]}
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200  # alive
        release.set()
        deadline = time.monotonic() + 20
        while (ready := httpx.get(f"{server.url}/readyz", timeout=10)).status_code != 200:
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.05)
        assert ready.json()["checks"]["warm"] is True and "warm" not in ready.json()
        assert reads == [("first", WARM_UP_STATE), ("deep", WARM_UP_STATE)]


def test_a_tier_warm_within_the_grace_is_ready_at_once(tmp_path: Path) -> None:
    """A first read within WARM_UP_GRACE_S is made before the server accepts connections."""
    reads: list[str] = []
    settings = Settings(log={"decision_log_path": tmp_path / "decisions.jsonl"})
    backend = MockBackend(lambda request: reads.append(request.state) or [0.5, 0.5])
    with LiveServer(settings, backend=backend, warm_up=True) as server:
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        assert reads == [WARM_UP_STATE]
