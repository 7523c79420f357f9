"""Fault matrix, fast side: a fast backend that is down, slower than ``fast.timeout_s`` or
malformed makes the decision escalate (answered by the slow path, HTTP 200), and each failure is
counted in /metrics by kind. Real server on loopback; the failures are real (a raising handler,
a sleeping one, a wrong-length read; a System One server that is stopped, 5xx, or garbage)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from router.backends.mock import MockBackend
from standins.harness import Reply, StandinServer
from standins.llm import StandinHandle
from tests.conftest import free_port
from tests.reliability.conftest import LiveServer, Switch, answer_of, decision, settings_for

FAST_TIMEOUT_S = 0.2


@pytest.fixture(scope="module")
def switch() -> Switch:
    return Switch()


@pytest.fixture(scope="module")
def server(standin: StandinHandle, switch: Switch,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = settings_for(standin, tmp_path_factory.mktemp("fast"),
                            fast={"kind": "mock", "timeout_s": FAST_TIMEOUT_S})
    with LiveServer(settings, backend=MockBackend(switch)) as running:
        yield running


@pytest.mark.parametrize(("mode", "kind"), [
    ("down", "BackendUnavailable"), ("slow", "BackendTimeout"), ("malformed", "BackendMalformed")])
def test_fast_backend_failure_escalates_and_is_counted(
    server: LiveServer, switch: Switch, fresh_standin: StandinHandle, mode: str, kind: str
) -> None:
    before = server.metric("slotgate_backend_errors_total", kind=kind)
    escalations_before = server.metric("slotgate_decisions_total", route="slow")
    switch.mode, switch.slow_s = mode, FAST_TIMEOUT_S * 5
    try:
        # "sure" would be accepted fast if the read worked: only the failure escalates it.
        response = server.post("/v1/chat/completions", decision(f"sure, my lost_card {mode}"))
    finally:
        switch.mode = "ok"
    assert response.status_code == 200, response.text
    assert answer_of(response) == ("lost_card", "slow")  # the stand-in's choice
    facts = response.json()["slotgate"]
    assert kind in facts["decisions"][0]["note"] if "decisions" in facts else kind in str(facts)
    assert len(fresh_standin.calls()) == 1
    assert server.metric("slotgate_backend_errors_total", kind=kind) == before + 1
    assert server.metric("slotgate_decisions_total", route="slow") == escalations_before + 1


def test_slow_fast_read_escalates_within_its_timeout(
    server: LiveServer, switch: Switch, fresh_standin: StandinHandle
) -> None:
    """The timeout bounds the wait: a read that would take 5 s costs ~0.2 s before escalating."""
    import time

    switch.mode, switch.slow_s = "slow", 5.0
    try:
        t0 = time.perf_counter()
        response = server.post("/v1/chat/completions", decision("sure, exchange_rate please"))
        elapsed_s = time.perf_counter() - t0
    finally:
        switch.mode = "ok"
    assert response.status_code == 200 and answer_of(response) == ("exchange_rate", "slow")
    assert elapsed_s < 2.0


class SystemOneFaults(StandinServer):
    """A System One server that answers every POST with ``reply`` (5xx, garbage, wrong options);
    its GETs are the example server's (``/health`` ok, no ``/v1/models``: a 404)."""

    reply = Reply(200, "{not json")

    def handle(self, method: str, path: str, body: bytes) -> Reply:
        if method == "GET":
            return Reply(200, {"status": "ok"}) if path == "/health" else Reply(404, {})
        return self.reply


WRONG_OPTIONS = Reply(200, {"answers": {"intent": {"probabilities": {"a": 0.5, "b": 0.5}}}})


@pytest.mark.parametrize(("reply", "kind"), [
    (None, "BackendUnavailable"),  # the server is stopped: connection refused
    (Reply(500, {"error": {"message": "internal"}}), "BackendUnavailable"),
    (Reply(200, "{not json"), "BackendMalformed"),
    (WRONG_OPTIONS, "BackendMalformed"),
    ("stall", "BackendTimeout"),
])
def test_systemone_backend_faults_escalate(
    standin: StandinHandle, tmp_path: Path, reply: Reply | str | None, kind: str
) -> None:
    standin.set_mode("ok")
    standin.clear()
    fake = None
    if reply is None:
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    else:
        fake = SystemOneFaults(delay_s=1.0 if reply == "stall" else 0.0).start()
        if isinstance(reply, Reply):
            fake.reply = reply
        url = fake.url
    # Built by the app from settings (not injected), so the app closes its HTTP client too.
    settings = settings_for(standin, tmp_path, fast={
        "kind": "systemone", "url": url, "timeout_s": FAST_TIMEOUT_S,
        "options": {"retries_5xx": 0}})
    try:
        with LiveServer(settings) as server:
            response = server.post("/v1/chat/completions", decision("sure, my lost_card"))
            errors = server.metric("slotgate_backend_errors_total", kind=kind)
    finally:
        if fake is not None:
            fake.stop()
    assert response.status_code == 200, response.text
    assert answer_of(response) == ("lost_card", "slow")
    assert errors == 1
    assert len(standin.calls()) == 1
