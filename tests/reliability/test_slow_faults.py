"""Fault matrix, slow side: when a decision must escalate and the slow path is down (stand-in
stopped), 5xx, timing out (stand-in stalls) or rate limited (stand-in 429s), the caller gets the
OpenAI-shaped error with the right status (503/503/504/429) and Retry-After where one applies, or,
when ``slow.serve_unverified_on_failure``, the fast answer marked ``unverified``. Never a fast
answer below its threshold that does not say so."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from router.backends.mock import MockBackend
from standins.llm import StandinHandle, start_standin
from tests.reliability.conftest import (
    OPTIONS,
    LiveServer,
    Switch,
    answer_of,
    decision,
    settings_for,
)

SLOW_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(standin: StandinHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = settings_for(standin, tmp_path_factory.mktemp("slow"),
                            slow={"timeout_s": SLOW_TIMEOUT_S})
    with LiveServer(settings, backend=MockBackend(Switch())) as running:
        # The first escalation imports litellm (seconds); pay it before anything is timed.
        running.wait_for_slow_path()
        warm = running.post("/v1/chat/completions", decision("warm up: lost_card"), timeout=120)
        assert warm.status_code == 200, warm.text
        yield running


@pytest.fixture
def stopped_standin() -> StandinHandle:
    """A stand-in that was started and stopped again: its port refuses connections."""
    handle = start_standin()
    handle.stop()
    return handle


def error_of(response: httpx.Response) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"message", "type", "param", "code"} <= set(body["error"]), body
    return body["error"]


@pytest.mark.parametrize(("mode", "status", "code", "retry_after"), [
    ("fail500", 503, "slow_path_unavailable", "10"),
    ("ratelimit", 429, "slow_path_rate_limited", "7"),
    ("stall", 504, "slow_path_timeout", None),
    ("malformed", 502, "slow_path_invalid_answer", None),
    ("wrong_option", 502, "slow_path_invalid_answer", None),
])
def test_slow_path_failure_is_an_openai_error(
    server: LiveServer, fresh_standin: StandinHandle, mode: str, status: int, code: str,
    retry_after: str | None,
) -> None:
    fresh_standin.set_mode(mode, retry_after_s=7, stall_s=SLOW_TIMEOUT_S * 5)
    t0 = time.perf_counter()
    response = server.post("/v1/chat/completions", decision(f"my lost_card ({mode})"))
    elapsed_s = time.perf_counter() - t0
    assert response.status_code == status, response.text
    assert error_of(response)["code"] == code
    assert response.headers.get("retry-after") == retry_after
    assert elapsed_s < SLOW_TIMEOUT_S * 2 + 2  # bounded: one call plus one corrective retry
    # No answer rode along with the error, and the stand-in was really asked.
    assert "choices" not in response.json() and fresh_standin.calls()


def test_slow_path_down_is_503_with_retry_after(
    stopped_standin: StandinHandle, tmp_path: Path
) -> None:
    settings = settings_for(stopped_standin, tmp_path)
    with LiveServer(settings, backend=MockBackend(Switch())) as server:
        response = server.post("/v1/chat/completions", decision("my lost_card"))
        system_one = server.post("/v1/systemone", {
            "state": "my lost_card",
            "questions": {"intent": {"type": "choice", "criteria": {"lost_card": None,
                                                                     "card_arrival": None}}}})
    assert response.status_code == 503 and response.headers["retry-after"] == "10"
    assert error_of(response)["code"] == "slow_path_unavailable"
    # The System One route answers in its own dialect: {"error": {"message", "type"}}.
    assert system_one.status_code == 503 and system_one.headers["retry-after"] == "10"
    assert set(system_one.json()["error"]) == {"message", "type"}


def test_a_corrective_retry_recovers_from_one_bad_answer(
    server: LiveServer, fresh_standin: StandinHandle
) -> None:
    fresh_standin.set_mode("malformed", times=1)
    response = server.post("/v1/chat/completions", decision("my lost_card again"))
    assert response.status_code == 200, response.text
    answer, route = answer_of(response)
    # (The stand-in's rule reads the correction message, which names every option.)
    assert answer in OPTIONS and route == "slow"
    assert len(fresh_standin.calls()) == 2


@pytest.mark.parametrize("fault", ["stopped", "stall", "ratelimit"])
def test_unverified_fast_answer_when_configured(
    standin: StandinHandle, stopped_standin: StandinHandle, tmp_path: Path, fault: str
) -> None:
    standin.set_mode("ok" if fault == "stopped" else fault, stall_s=SLOW_TIMEOUT_S * 5)
    upstream = stopped_standin if fault == "stopped" else standin
    settings = settings_for(upstream, tmp_path, slow={
        "timeout_s": SLOW_TIMEOUT_S, "serve_unverified_on_failure": True})
    try:
        with LiveServer(settings, backend=MockBackend(Switch())) as server:
            response = server.post("/v1/chat/completions", decision("card_arrival or lost_card?"))
            unverified = server.metric("slotgate_decisions_total", route="unverified")
    finally:
        standin.set_mode("ok")
    assert response.status_code == 200, response.text
    assert answer_of(response) == ("card_arrival", "unverified")  # the fast argmax
    facts = response.json()["slotgate"]
    assert response.headers["x-slotgate-route"] == "unverified"
    assert facts["probability"] == pytest.approx(0.5) and facts["threshold"] == 0.9
    assert "not verified" in str(facts)
    assert unverified == 1


def test_no_answer_at_all_when_both_paths_fail(
    stopped_standin: StandinHandle, tmp_path: Path
) -> None:
    """Fast backend down and slow path down: there is no fast read to serve even unverified."""
    switch = Switch()
    switch.mode = "down"
    settings = settings_for(stopped_standin, tmp_path, slow={"serve_unverified_on_failure": True})
    with LiveServer(settings, backend=MockBackend(switch)) as server:
        response = server.post("/v1/chat/completions", decision("sure, lost_card"))
    assert response.status_code == 503, response.text
    assert error_of(response)["code"] == "slow_path_unavailable"
