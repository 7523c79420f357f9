"""Identical fast reads at once (traffic that repeats itself in bursts: a popular message, a
client's retries): one backend read, measured on a live server over loopback with a fast backend
that counts its reads and takes 1 s each (or fails after 1 s), so the whole burst arrives while
the first is in flight. routing/shared_reads.py shares the one read: without it, every one of
them would miss the read cache and be read."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from router.backends.mock import MockBackend
from standins.llm import StandinHandle
from tests.reliability.conftest import (
    OPTIONS,
    LiveServer,
    Switch,
    answer_of,
    decision,
    settings_for,
)
from tests.reliability.test_slow_deadlines import burst


@pytest.fixture(scope="module")
def switch() -> Switch:
    return Switch()


@pytest.fixture(scope="module")
def server(standin: StandinHandle, switch: Switch,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = settings_for(standin, tmp_path_factory.mktemp("identical"),
                            fast={"kind": "mock", "timeout_s": 5.0})
    with LiveServer(settings, backend=MockBackend(switch)) as running:
        yield running


def test_fifty_identical_decisions_at_once_make_one_fast_read(server: LiveServer, switch: Switch) -> None:
    # 1 s: the whole burst arrives while the read is in flight, even on a loaded machine (a
    # request arriving after it would find the read cache filled: not shared, as asserted below)
    switch.mode, switch.slow_s = "slow", 1.0
    reads, shared = switch.calls, server.metric("slotgate_fast_reads_shared_total")
    try:
        results = asyncio.run(burst(server.url, [decision("sure: the same words")] * 50))
    finally:
        switch.mode = "ok"
    assert [status for status, _, _ in results] == [200] * 50
    routes = [answer_of(response)[1] for _, _, response in results]
    print(f"\n50 identical decisions at once -> {switch.calls - reads} fast read(s); routes "
          f"{ {r: routes.count(r) for r in set(routes)} }")
    assert switch.calls - reads == 1
    assert {answer_of(response)[0] for _, _, response in results} == {OPTIONS[0]}  # its 0.97
    assert routes.count("fast") == 1 and routes.count("cache") == 49
    # the 49 that waited on the read in flight (none found it in the read cache yet)
    assert server.metric("slotgate_fast_reads_shared_total") - shared == 49


def test_different_messages_are_read_apart(server: LiveServer, switch: Switch) -> None:
    switch.mode, switch.slow_s = "slow", 0.3
    reads = switch.calls
    try:
        results = asyncio.run(burst(server.url, [decision(f"sure: lost_card number {i}")
                                                 for i in range(5)]))
    finally:
        switch.mode = "ok"
    assert [status for status, _, _ in results] == [200] * 5
    assert switch.calls - reads == 5
    assert [answer_of(response)[1] for _, _, response in results] == ["fast"] * 5


def test_a_failed_shared_read_escalates_each_decision_and_counts_once(
    server: LiveServer, switch: Switch, fresh_standin: StandinHandle
) -> None:
    # The read fails after 1 s, so the whole burst arrives while it is in flight. (A read that
    # failed at once ended before the burst's later requests arrived on a loaded CI machine:
    # those read again, 4 reads, since a failure is not cached; the test had assumed no spread.)
    switch.mode, switch.down_s = "down", 1.0
    reads = switch.calls
    errors = server.metric("slotgate_backend_errors_total", kind="BackendUnavailable")
    try:
        results = asyncio.run(burst(server.url, [decision("sure: card_arrival, a burst")] * 20))
    finally:
        switch.mode, switch.down_s = "ok", 0.0
    assert [status for status, _, _ in results] == [200] * 20
    assert {answer_of(response)[1] for _, _, response in results} <= {"slow", "cache"}
    assert switch.calls - reads == 1  # one read failed for all
    failed = server.metric("slotgate_backend_errors_total", kind="BackendUnavailable") - errors
    assert failed == switch.calls - reads
