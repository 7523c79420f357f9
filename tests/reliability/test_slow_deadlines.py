"""One slow call per question, and deadlines that hold (issue 13, items 4 and 5), measured on a
live server with the real slow path (litellm) on the stand-in LLM, which counts its calls.

- 50 concurrent identical escalations: the stand-in sees at most 2 calls (one is expected).
- A stalled slow model, slow.timeout_s = 2 and 200 concurrent distinct escalations: every
  request ends (504 or 429) within the deadline plus a small margin; the slowest is reported."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from router.backends.mock import MockBackend
from standins.llm import StandinHandle
from tests.reliability.conftest import LiveServer, Switch, answer_of, decision, settings_for

SLOW_TIMEOUT_S = 2.0
# What a request may take beyond slow.timeout_s: the fast read (fast.timeout_s 0.25), the cache
# and the log, and scheduling on a shared 2-core machine under 200 concurrent clients.
MARGIN_S = 1.5


@pytest.fixture(scope="module")
def server(standin: StandinHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = settings_for(standin, tmp_path_factory.mktemp("deadlines"),
                            slow={"timeout_s": SLOW_TIMEOUT_S, "max_concurrency": 16})
    with LiveServer(settings, backend=MockBackend(Switch())) as running:
        running.wait_for_slow_path()
        warm = running.post("/v1/chat/completions", decision("warm up: lost_card"), timeout=120)
        assert warm.status_code == 200, warm.text
        yield running


async def burst(url: str, bodies: list[dict[str, object] | None]
                ) -> list[tuple[int, float, httpx.Response]]:
    """Every body posted at once (None: a GET /healthz, the peer that shows what the machine and
    the HTTP stack alone cost under the same burst); (status, seconds, response) each, in order."""
    limits = httpx.Limits(max_connections=len(bodies) + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def one(body: dict[str, object] | None) -> tuple[int, float, httpx.Response]:
            t0 = time.perf_counter()
            if body is None:
                response = await client.get("/healthz")
            else:
                response = await client.post("/v1/chat/completions", json=body)
            return response.status_code, time.perf_counter() - t0, response
        return list(await asyncio.gather(*(one(b) for b in bodies)))


def test_identical_concurrent_escalations_make_one_slow_call(
    server: LiveServer, fresh_standin: StandinHandle
) -> None:
    # The stand-in answers after 0.5 s, so all 50 arrive while the first call is in flight.
    fresh_standin.set_mode("stall", stall_s=0.5)
    results = asyncio.run(burst(server.url, [decision("my lost_card, same words")] * 50))
    fresh_standin.set_mode("ok")
    assert [status for status, _, _ in results] == [200] * 50
    answers = {answer_of(response) for _, _, response in results}
    assert {answer for answer, _ in answers} == {"lost_card"}
    calls = len(fresh_standin.calls())
    print(f"\n50 identical concurrent escalations -> {calls} slow call(s)")
    assert 1 <= calls <= 2


def test_different_questions_are_not_merged(server: LiveServer, fresh_standin: StandinHandle) -> None:
    results = asyncio.run(burst(server.url, [decision(f"lost_card number {i}") for i in range(5)]))
    assert [status for status, _, _ in results] == [200] * 5
    assert len(fresh_standin.calls()) == 5


def test_every_request_ends_within_its_deadline_under_a_stalled_model(
    server: LiveServer, fresh_standin: StandinHandle
) -> None:
    peer = asyncio.run(burst(server.url, [None] * 200))
    peer_worst = max(seconds for _, seconds, _ in peer)
    fresh_standin.set_mode("stall", stall_s=30)
    try:
        results = asyncio.run(burst(server.url, [decision(f"lost_card case {i}") for i in range(200)]))
    finally:
        fresh_standin.set_mode("ok")
    statuses = sorted({status for status, _, _ in results})
    latencies = sorted(seconds for _, seconds, _ in results)
    p50, worst = latencies[len(latencies) // 2], latencies[-1]
    counts = {s: sum(1 for status, _, _ in results if status == s) for s in statuses}
    by_status = {s: max(seconds for status, seconds, _ in results if status == s) for s in statuses}
    print(f"\nstalled model, timeout {SLOW_TIMEOUT_S} s, 200 concurrent: statuses {counts}, "
          f"p50 {p50:.2f} s, max {worst:.2f} s (max by status {by_status}); 200 concurrent /healthz: max {peer_worst:.2f} s")
    assert set(statuses) <= {429, 504}, counts
    for status, _, response in results:
        if status == 429:
            assert int(response.headers["retry-after"]) >= 1
    # The deadline plus the margin, plus what the same burst costs a route that does nothing
    # (on a loaded shared machine that is most of the spread).
    assert worst <= SLOW_TIMEOUT_S + MARGIN_S + peer_worst
