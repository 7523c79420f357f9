"""Clients that hang up mid-request (waiting on an escalation) and mid-stream (a streamed
passthrough) leave nothing behind: the server's asyncio tasks, the upstream connections to the
stand-in (counted in /proc/net/tcp) and this process's open file descriptors return to what they
were before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from router.backends.mock import MockBackend
from standins.llm import StandinHandle
from tests.reliability.conftest import (
    SLOW_MODEL,
    LiveServer,
    Switch,
    decision,
    established,
    open_fds,
    settings_for,
)

SLOW_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def server(standin: StandinHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = settings_for(standin, tmp_path_factory.mktemp("disc"),
                            slow={"timeout_s": SLOW_TIMEOUT_S})
    with LiveServer(settings, backend=MockBackend(Switch())) as running:
        running.wait_for_slow_path()
        warm = running.post("/v1/chat/completions", decision("warm up: lost_card"), timeout=120)
        assert warm.status_code == 200, warm.text
        yield running


def snapshot(server: LiveServer, standin: StandinHandle) -> tuple[int, int, int]:
    return server.tasks(), established(standin.port), open_fds()


def hang_up_after(url: str, body: dict[str, object], *, after_s: float) -> str:
    try:
        httpx.post(url, json=body, timeout=after_s)
    except httpx.ReadTimeout:
        return "hung up"
    return "answered"


def test_disconnect_while_waiting_for_the_slow_path(
    server: LiveServer, fresh_standin: StandinHandle
) -> None:
    before = snapshot(server, fresh_standin)
    fresh_standin.set_mode("stall", stall_s=30)
    url = f"{server.url}/v1/chat/completions"
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(
            lambda i: hang_up_after(url, decision(f"lost_card? #{i}"), after_s=0.5), range(8)))
    assert outcomes == ["hung up"] * 8
    during = snapshot(server, fresh_standin)
    t0 = time.perf_counter()
    # Bounded by the slow path's timeout: abandoned escalations end by it at the latest.
    tasks_after = server.settle_tasks(before[0], within_s=SLOW_TIMEOUT_S + 3)
    settled_s = time.perf_counter() - t0
    time.sleep(0.3)
    after = snapshot(server, fresh_standin)
    fresh_standin.set_mode("ok")
    print(f"mid-request: before {before}, during {during}, after {after}, settled {settled_s:.2f}s")
    assert during[0] > before[0]  # the abandoned requests were really in flight
    assert tasks_after <= before[0] and after[0] <= before[0]
    assert after[1] <= before[1]  # no upstream connection left open
    assert after[2] <= before[2]
    # The server is healthy afterwards.
    ok = server.post("/v1/chat/completions", decision("sure, lost_card"))
    assert ok.status_code == 200


def test_disconnect_mid_stream(server: LiveServer, fresh_standin: StandinHandle) -> None:
    before = snapshot(server, fresh_standin)
    fresh_standin.set_mode("ok", chunk_delay_s=0.2)  # ~60 chunks: the stream would take ~12 s
    body = {"model": SLOW_MODEL, "stream": True,
            "messages": [{"role": "user", "content": "x" * 480}]}
    try:
        with httpx.Client(timeout=10) as http, http.stream(
                "POST", f"{server.url}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            chunks = response.iter_raw()
            received = next(chunks) + next(chunks)
            assert received.startswith(b"data: ")
            during = snapshot(server, fresh_standin)
        # Leaving the block closed the connection mid-stream.
        t0 = time.perf_counter()
        tasks_after = server.settle_tasks(before[0], within_s=5)
        settled_s = time.perf_counter() - t0
        time.sleep(0.3)
        after = snapshot(server, fresh_standin)
    finally:
        fresh_standin.set_mode("ok", chunk_delay_s=0.0)
    print(f"mid-stream: before {before}, during {during}, after {after}, settled {settled_s:.2f}s")
    assert during[0] > before[0] and during[1] > before[1]  # a stream and its upstream were open
    assert tasks_after <= before[0] and settled_s < 5  # cancelled, not run to its end (~12 s)
    assert after[1] <= before[1]
    assert after[2] <= before[2]
