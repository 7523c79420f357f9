"""Backpressure: each backend runs at most its concurrency cap of calls at once, at most
``max_queue`` more wait, and everything beyond is refused at once with 429 + Retry-After (an
OpenAI rate_limit_error), counted in /metrics: no unbounded queue, memory or latency."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from router.backends.mock import MockBackend
from standins.llm import StandinHandle
from tests.reliability.conftest import LiveServer, Switch, decision, settings_for

N_CLIENTS = 12


def burst(url: str, texts: list[str]) -> list[httpx.Response]:
    with ThreadPoolExecutor(len(texts)) as pool:
        return list(pool.map(
            lambda text: httpx.post(f"{url}/v1/chat/completions", json=decision(text), timeout=30),
            texts))


def test_fast_backend_cap_and_bounded_queue(tmp_path: Path) -> None:
    switch = Switch()
    switch.mode, switch.slow_s = "slow", 1.0
    settings = settings_for(None, tmp_path, max_queue=2,
                            fast={"kind": "mock", "max_concurrency": 2, "timeout_s": 5})
    with LiveServer(settings, backend=MockBackend(switch)) as server:
        t0 = time.perf_counter()
        responses = burst(server.url, [f"sure, lost_card #{i}" for i in range(N_CLIENTS)])
        elapsed_s = time.perf_counter() - t0
        rejected_metric = server.metric("slotgate_queue_rejections_total", backend="mock")
    statuses = sorted(r.status_code for r in responses)
    refused = [r for r in responses if r.status_code == 429]
    assert set(statuses) == {200, 429}, statuses
    assert switch.max_in_flight == 2  # the cap held
    # 2 running + 2 waiting are served; the rest are refused (a client arriving after a slot
    # freed may be served too, so "at least 4").
    assert len(responses) - len(refused) >= 4 and len(refused) >= N_CLIENTS - 6
    for r in refused:
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
    assert rejected_metric == len(refused)
    assert elapsed_s < 6  # no one waited on an unbounded queue
    assert switch.calls == len(responses) - len(refused)  # refused ones never reached it


def test_slow_path_cap_and_bounded_queue(standin: StandinHandle, tmp_path: Path) -> None:
    """Escalations beyond ``slow.max_concurrency`` + ``max_queue`` are refused with 429 too,
    instead of waiting until the slow timeout turns them into 504s."""
    standin.set_mode("stall", stall_s=1.0)
    settings = settings_for(standin, tmp_path, max_queue=2,
                            slow={"max_concurrency": 2, "timeout_s": 5})
    try:
        with LiveServer(settings, backend=MockBackend(Switch())) as server:
            server.wait_for_slow_path()
            warm = server.post("/v1/chat/completions", decision("warm: lost_card"), timeout=120)
            assert warm.status_code == 200
            standin.clear()
            responses = burst(server.url, [f"lost_card #{i}" for i in range(N_CLIENTS)])
    finally:
        standin.set_mode("ok")
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {200, 429}, statuses
    refused = [r for r in responses if r.status_code == 429]
    assert len(refused) >= N_CLIENTS - 6, statuses
    assert all(r.headers.get("retry-after") for r in refused)
    assert len(standin.calls()) == N_CLIENTS - len(refused)
